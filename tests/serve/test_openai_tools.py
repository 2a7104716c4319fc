"""Tools and response_format in the OpenAI frontend, without a model: the requests'
checks (400 naming the field), their tensors, and the answers shaped from the engine
model's `tool_calls` output, whole and streamed, each parsed with the openai SDK's own
types (a stand-in Triton plays the engine's responses)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from builder.serve.openai.app import create_app
from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.protocol import parse_chat
from builder.serve.openai.tensors import ModelInfo, Piece, build_inputs
from tests.serve.test_openai_app import FakeTriton

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CHAT = {
    "model": "router",
    "messages": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [WEATHER],
}
CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ROUTER = ModelInfo(
    "router",
    {
        "messages": "TYPE_STRING",
        "sampling_parameters": "TYPE_STRING",
        "tools": "TYPE_STRING",
        "tool_choice": "TYPE_STRING",
    },
    False,
)


def refused(body) -> tuple[int, str | None]:
    with pytest.raises(OpenAIError) as caught:
        parse_chat(body)
    return caught.value.status, caught.value.param


@pytest.mark.parametrize(
    "body, param",
    [
        ({**CHAT, "tools": {}}, "tools"),
        (
            {**CHAT, "tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        (
            {
                **CHAT,
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
                ],
            },
            "tools[0].function.parameters",
        ),
        (
            {**CHAT, "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice",
        ),
        ({**CHAT, "tool_choice": "sometimes"}, "tool_choice"),
        ({**CHAT, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a b", "schema": {}},
                },
            },
            "response_format.json_schema.name",
        ),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                },
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                **CHAT,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}, "strict": "yes"},
                },
            },
            "response_format.json_schema.strict",
        ),
    ],
)
def test_bad_tools_and_formats_are_400_naming_the_field(body, param):
    assert refused(body) == (400, param)


def test_tools_and_the_choice_become_tensors():
    named = parse_chat(
        {**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    )
    tensors = {t.name(): t for t in build_inputs(named, ROUTER)}
    assert set(tensors) >= {"tools", "tool_choice"}
    assert (named.tools, named.tool_choice) == ([WEATHER], "get_weather")
    assert parse_chat(CHAT).tool_choice == "auto"  # OpenAI's default with tools
    assert parse_chat({**CHAT, "tool_choice": "none"}).tool_choice == "none"
    # a model without the tools input (a TRT-LLM ensemble) refuses in words
    ensemble = ModelInfo("ensemble", {"messages": "TYPE_STRING"}, True)
    with pytest.raises(OpenAIError) as caught:
        build_inputs(named, ensemble)
    assert caught.value.param == "tools"


def test_response_format_is_vllms_structured_outputs():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    as_schema = parse_chat(
        {
            **CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": schema, "strict": True},
            },
        }
    )
    assert as_schema.sampling["structured_outputs"] == {"json": schema}
    as_object = parse_chat({**CHAT, "response_format": {"type": "json_object"}})
    assert as_object.sampling["structured_outputs"] == {"json_object": True}
    assert (
        "structured_outputs"
        not in parse_chat({**CHAT, "response_format": {"type": "text"}}).sampling
    )
    # a TRT-LLM ensemble has no structured outputs: refused naming response_format
    ensemble = ModelInfo("ensemble", {"messages": "TYPE_STRING", "temperature": "TYPE_FP32"}, True)
    plain = {key: value for key, value in CHAT.items() if key != "tools"}
    with pytest.raises(OpenAIError) as caught:
        build_inputs(parse_chat({**plain, "response_format": {"type": "json_object"}}), ensemble)
    assert caught.value.param == "response_format"


def client(script):
    return TestClient(create_app("unused", FakeTriton(script)))


def pieces(content: str = ""):
    """What the engine model sends for an answer with a call: the held text, with the
    calls and finish reason "tool_calls", in one last response."""
    return [Piece(content, "tool_calls", 9, 6, "smollm2", None, [CALL])]


def test_a_whole_answer_carries_the_calls_in_openais_shape():
    with client(pieces()) as http:
        response = http.post("/v1/chat/completions", json=CHAT)
    answer = ChatCompletion.model_validate(response.json())
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("call_abc", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_a_streamed_answer_sends_the_calls_before_the_finish_reason():
    with client(pieces("Let me look.")) as http:
        response = http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks = [
        ChatCompletionChunk.model_validate(json.loads(line[len("data: ") :]))
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    deltas = [c.choices[0] for c in chunks]
    assert "".join(d.delta.content or "" for d in deltas) == "Let me look."
    (with_calls,) = [d for d in deltas if d.delta.tool_calls]
    (call,) = with_calls.delta.tool_calls
    assert (call.index, call.id, call.type) == (0, "call_abc", "function")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert deltas.index(with_calls) < len(deltas) - 1
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]
    assert response.text.rstrip().endswith("data: [DONE]")


def test_an_answer_without_calls_is_plain_text():
    with client([Piece("Sunny.", "stop", 9, 2, "smollm2")]) as http:
        answer = ChatCompletion.model_validate(http.post("/v1/chat/completions", json=CHAT).json())
    assert answer.choices[0].message.content == "Sunny."
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"


def test_a_conversation_goes_on_after_a_call():
    """The assistant's call and the tool's result reach the chat template in the shape
    templates take (arguments as an object); the engine models' message check takes
    them as they are."""
    from trident_common.request import parse_messages

    body = {
        **CHAT,
        "messages": [
            *CHAT["messages"],
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"},
        ],
    }
    generation = parse_chat(body)
    assistant, tool = generation.messages[1:]
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"
    }
    assert tool == {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_abc"}
    (messages,) = [t for t in build_inputs(generation, ROUTER) if t.name() == "messages"]
    assert parse_messages(json.dumps(generation.messages))[0] == generation.messages
    assert messages is not None
    bad = {**body, "messages": [*CHAT["messages"], {"role": "tool", "content": "18 C"}]}
    assert refused(bad) == (400, "messages[1].tool_call_id")
