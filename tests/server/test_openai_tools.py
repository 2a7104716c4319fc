"""Tool calling end to end: the real openai SDK (sync and async, streamed and not) against
the real OpenAI frontend, tritonserver and trident's router, in front of real vLLM
(SmolLM2, the session's default server, hermes as its parser) and the SGLang model on its
double (qwen25 as its parser; support/fake_sglang_tools.py stands in for SGLang's).

`required` and a named choice are enforced with structured outputs, so even SmolLM2
(whose chat template never shows it the tools) answers with calls that parse and whose
arguments validate against the tool's schema, every time. `auto` calls parse whenever the
model writes one: the double is scripted to write one; SmolLM2 answers in words.
Triton's own clients get the same calls in the tool_calls output.
"""

from __future__ import annotations

import json
import queue

import jsonschema
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from builder.serve.openai.runner import Frontend
from builder.serve.server import free_port
from tests.server.client_matrix import engine_modes, engine_streams
from tests.server.test_openai_conformance import QUESTION, sync_client
from tests.server.test_openai_conformance import ask as conformance_ask

pytestmark = [pytest.mark.server, pytest.mark.vllm]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Real vLLM (the embedded default, hermes tool parser) and the tool-calling SGLang double.
ENGINES = (
    pytest.param("vllm", marks=pytest.mark.uses_server("default_server")),
    pytest.param("sglang", marks=pytest.mark.uses_server("sglang_tools_server")),
)


@pytest.fixture(scope="module")
def servers(request):
    return {
        "vllm": lambda: request.getfixturevalue("default_server"),
        "sglang": lambda: request.getfixturevalue("sglang_tools_server"),
    }


@pytest.fixture(scope="module")
def frontends(servers):
    started, stack = {}, []

    def get(engine):
        if engine not in started:
            server = servers[engine]()
            frontend = Frontend(
                server.grpc_url,
                port=free_port(),
                repo=server.repository,
                admin_key=getattr(server, "admin_key", None),
            )
            started[engine] = frontend.__enter__()
            stack.append(frontend)
        return started[engine]

    yield get
    for frontend in stack:
        frontend.__exit__(None, None, None)


@pytest.fixture
def url(frontends, engine):
    return frontends(engine).url + "/v1"


def ask(url, mode, stream, **body):
    body.setdefault("messages", ASK)
    body.setdefault("max_tokens", 120)
    return conformance_ask(url, "chat", mode, stream, tools=TOOLS, **body)


def calls_of(answer) -> tuple[list, str, str | None]:
    """(the calls as {id, name, arguments}, the finish reason, the content) of a whole
    answer, or of a stream put together from its deltas (OpenAI's rules: a delta with an
    id starts a call at its index; name and arguments pieces add on)."""
    if not isinstance(answer, list):
        choice = answer.choices[0]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in choice.message.tool_calls or []
        ]
        return calls, choice.finish_reason, choice.message.content
    calls: dict = {}
    finish, texts = None, []
    for chunk in answer:
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish, "".join(texts) or None


def assert_valid(calls: list, names: set) -> None:
    assert calls
    for call in calls:
        assert call["id"] and call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_tools_server"))
def test_a_named_choice_is_one_valid_call(url, engine, mode, stream):
    answer = ask(
        url, mode, stream, tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    calls, finish, _ = calls_of(answer)
    assert len(calls) == 1 and finish == "tool_calls"
    assert_valid(calls, {"get_weather"})


@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_tools_server"))
def test_required_gives_valid_calls_of_the_tools(url, engine, mode, stream):
    calls, finish, _ = calls_of(ask(url, mode, stream, tool_choice="required", max_tokens=200))
    assert finish == "tool_calls"
    assert_valid(calls, set(SCHEMAS))


@pytest.mark.parametrize("engine, stream", engine_streams("sglang_tools_server"))
def test_auto_calls_parse_whenever_the_model_writes_one(url, engine, stream):
    calls, finish, content = calls_of(ask(url, "sync", stream))
    if engine == "sglang":  # the double always writes one
        assert calls and finish == "tool_calls" and content.strip() == "Let me check ."
    if calls:
        assert_valid(calls, set(SCHEMAS))
        assert finish == "tool_calls"
    else:
        assert content and finish in ("stop", "length")


@pytest.mark.parametrize("engine", ENGINES)
def test_tool_choice_none_answers_in_words(url, engine):
    calls, finish, content = calls_of(ask(url, "sync", False, tool_choice="none"))
    assert calls == [] and content and finish in ("stop", "length")


@pytest.mark.parametrize("engine", ENGINES)
def test_many_named_and_required_calls_all_parse(url, engine):
    """Twenty questions, each forced: every answer is a valid call."""
    client = sync_client(url)
    cities = ["Paris", "Oslo", "Rome", "Lima", "Kyoto"]
    for i in range(20):
        choice = (
            "required"
            if i % 2
            else {"type": "function", "function": {"name": ["get_weather", "get_time"][i % 4 // 2]}}
        )
        answer = client.chat.completions.create(
            model="router",
            temperature=0.7,
            seed=i,
            max_tokens=200,
            tools=TOOLS,
            tool_choice=choice,
            messages=[{"role": "user", "content": f"Weather and time in {cities[i % 5]}?"}],
        )
        calls, finish, _ = calls_of(answer)
        assert finish == "tool_calls"
        assert_valid(calls, set(SCHEMAS))


@pytest.mark.parametrize("engine", ENGINES)
def test_refusals_are_400_naming_the_parameter(url, engine):
    client = sync_client(url)
    cases = [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),  # the frontend's check
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "integer", "minimum": 3, "maximum": 1},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),  # the engine cannot compile it
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),  # two constraints
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="router", messages=QUESTION, max_tokens=20, **body)
        assert caught.value.body["param"] == param, body


def test_triton_clients_get_the_calls_in_the_tool_calls_output(default_server):
    """A gRPC client of the router: the tools and tool_choice inputs, the tool_calls
    output (docs/clients.md)."""
    inputs = []
    for name, value in (
        ("messages", json.dumps(ASK)),
        ("tools", json.dumps(TOOLS)),
        ("tool_choice", "get_weather"),
    ):
        tensor = grpcclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
        inputs.append(tensor)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(default_server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("router", inputs)
        result, error = answers.get(timeout=120)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert error is None
    assert result.as_numpy("finish_reason")[0].decode() == "tool_calls"
    (call,) = json.loads(result.as_numpy("tool_calls")[0])
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["get_weather"])
