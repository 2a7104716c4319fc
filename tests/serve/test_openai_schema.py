"""The request models (builder/serve/openai/schema.py) and their validation errors as
OpenAI's: one line naming the field, in OpenAI's error shape, over HTTP a 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from builder.serve.openai import structured
from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.limits import Limits
from builder.serve.openai.protocol import parse_chat, parse_completion
from builder.serve.openai.schema import MODELS, ChatRequest, CompletionRequest
from tests.serve.test_openai_app import ANSWER, client_for

HELLO = [{"role": "user", "content": "Hello"}]
BODIES = {
    "chat": (parse_chat, {"model": "router", "messages": HELLO}),
    "completion": (parse_completion, {"model": "router", "prompt": "Once"}),
}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


def refused(parse, body, limits: Limits = Limits()) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        parse(body, {}, limits)
    return caught.value


def one_line(error: OpenAIError) -> None:
    """OpenAI's 400, and nothing of pydantic's wording or links."""
    assert error.status == 400 and error.type == "invalid_request_error"
    assert "\n" not in error.message and len(error.message) < 300
    for pydantic_word in ("pydantic", "https://", "Input should", "validation error"):
        assert pydantic_word not in error.message


@pytest.mark.parametrize(
    "kind, field, value, param, message",
    [
        # a bool is no number
        ("chat", "n", True, "n", "'n' must be an integer from 1 to 16, got True"),
        (
            "chat",
            "max_tokens",
            True,
            "max_tokens",
            "'max_tokens' must be an integer from 1 to 2147483647, got True",
        ),
        ("completion", "seed", False, "seed", "'seed' must be an integer, got False"),
        ("completion", "top_k", True, "top_k", "'top_k' has the wrong type: True"),
        (
            "chat",
            "temperature",
            True,
            "temperature",
            "'temperature' must be a number from 0 to 2, got True",
        ),  # fmt: skip
        # a number is finite
        (
            "chat",
            "temperature",
            float("nan"),
            "temperature",
            "'temperature' must be a number from 0 to 2, got nan",
        ),  # fmt: skip
        ("completion", "min_p", float("inf"), "min_p", "'min_p' has the wrong type: inf"),
        (
            "chat",
            "logit_bias",
            {"50256": float("nan")},
            "logit_bias",
            "'logit_bias' maps token ids to numbers from -100 to 100",
        ),
        # a string is not a number either
        (
            "completion",
            "presence_penalty",
            "1",
            "presence_penalty",
            "'presence_penalty' must be a number from -2 to 2, got '1'",
        ),  # fmt: skip
        ("completion", "echo", None, "echo", "'echo' must be a boolean"),
        ("chat", "stream", 1, "stream", "'stream' must be a boolean"),
    ],
)
def test_a_wrong_type_or_value_is_one_line_naming_the_field(kind, field, value, param, message):
    parse, body = BODIES[kind]
    error = refused(parse, {**body, field: value})
    one_line(error)
    assert (error.param, error.code, error.message) == (param, "invalid_value", message)


@pytest.mark.parametrize(
    "extra, param, message",
    [
        (
            {"messages": [*HELLO, {"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[1].content[0]",
            'messages[1].content[0]: only text parts ({"type": "text", "text": ...}) are supported',
        ),
        (
            {"messages": [*HELLO, {"role": "pirate", "content": "arr"}]},
            "messages[1].role",
            "messages[1].role must be one of system, developer, user, assistant, tool, "
            "got 'pirate'",
        ),
        (
            {"messages": [*HELLO, {"role": "tool", "content": "18 C"}]},
            "messages[1].tool_call_id",
            "messages[1]: a tool message needs the tool_call_id of the call it answers",
        ),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
            "'include_usage' must be a boolean",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "tools[0].function.name must be 1 to 64 letters, digits, '_' or '-'",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]},
            "tools[0].function.parameters",
            "'tools[0].function.parameters' must be a JSON Schema object",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },  # fmt: skip
            "response_format.json_schema.schema",
            None,
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "'response_format.json_schema' must be an object with 'name' and 'schema'",
        ),
    ],
)
def test_a_nested_field_is_named_by_its_path(extra, param, message):
    error = refused(parse_chat, {"model": "router", "messages": HELLO, **extra})
    one_line(error)
    assert error.param == param
    if message is not None:
        assert error.message == message
    else:
        assert error.message.startswith(f"'{param}' is not a valid JSON Schema")


def test_an_unknown_field_comes_first_and_the_others_are_counted():
    error = refused(parse_chat, {"temperature": 9, "model": "router", "max_toknes": 5, "x": 1})
    one_line(error)
    assert (error.param, error.code) == ("max_toknes", "unknown_parameter")
    assert error.message.startswith("unknown parameter 'max_toknes' (and 1 more): ")


def test_a_field_refused_by_name_comes_before_an_unknown_one():
    error = refused(parse_completion, {"model": "m", "prompt": "a", "x": 1, "suffix": "b"})
    assert (error.param, error.code) == ("suffix", "unsupported_parameter")
    error = refused(parse_chat, {"model": "m", "messages": HELLO, "x": 1, "priority": 1})
    assert (error.param, error.code) == ("priority", "unsupported_parameter")


def typed_fields(model) -> list[str]:
    """The fields with a type to fail (not OpenAI's bookkeeping, taken as it comes)."""
    return [
        field.alias or name
        for name, field in model.model_fields.items()
        if not (field.annotation is Any and not field.metadata)
    ]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_every_typed_field_refused_names_itself_in_words_of_its_own(kind):
    parse, body = BODIES[kind]
    fields = typed_fields(MODELS[kind])
    assert {"model", "temperature", "lora_name", "priority"} <= set(fields)
    for field in fields:
        error = refused(parse, {**body, field: {"$": [1.5]}})  # wrong for every one
        one_line(error)
        assert error.param is not None and error.param.startswith(field), (field, error.param)
        assert error.code in ("invalid_value", "unsupported_parameter"), field
        assert not error.message.startswith("the request body"), field
    for field in set(MODELS[kind].model_fields) - set(fields):
        assert parse({**body, field: {"$": [1.5]}}).model == "router"


def test_a_huge_value_is_not_sent_back():
    error = refused(parse_chat, {"model": "router", "messages": HELLO, "temperature": "x" * 10**6})
    one_line(error)
    assert error.message.endswith("got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...")


def test_the_message_count_is_checked_before_a_message_is():
    limits = Limits(max_messages=3)
    error = refused(parse_chat, {"model": "m", "messages": ["not a message"] * 10_000}, limits)
    assert (error.param, error.code) == ("messages", "too_many_messages")
    assert error.message == "'messages' holds 10000 messages, more than the limit of 3"


def test_a_message_too_long_says_by_how_much():
    limits = Limits(max_message_chars=4)
    parts = [{"type": "text", "text": "abc"}, {"type": "text", "text": "d"}]  # 'abc\nd'
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    error = refused(parse_chat, body, limits)
    assert (error.param, error.code) == ("messages[0].content", "too_long")
    assert error.message == "messages[0].content is 5 characters, more than the limit of 4"


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize(
    "field, value, param, code",
    [
        ("max_toknes", 5, "max_toknes", "unknown_parameter"),
        ("n", True, "n", "invalid_value"),
        ("temperature", float("nan"), "temperature", "invalid_value"),
        ("stream_options", {"include_usage": 1}, "stream_options.include_usage", "invalid_value"),
    ],
)
def test_over_http_it_is_a_400_in_openais_error_shape(kind, field, value, param, code):
    client, triton = client_for(ANSWER)
    body = {**BODIES[kind][1], field: value}
    if field == "stream_options":
        body["stream"] = True
    # NaN is no JSON, but Python's parser (and the frontend's) takes it.
    response = client.post(
        PATHS[kind], content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"}
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert "\n" not in error["message"] and param.split(".")[-1] in error["message"]
    assert not triton.calls


def test_the_models_are_built_at_import_not_on_a_request():
    for model in (ChatRequest, CompletionRequest):
        assert model.__pydantic_complete__ and not model.model_config.get("defer_build")


def test_a_schema_is_checked_once_for_many_requests():
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "title": "cached-once"}},
    }
    before = structured._cached_problem.cache_info()
    for _ in range(3):
        parse_chat({"model": "m", "messages": HELLO, "tools": [tool]})
    after = structured._cached_problem.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)
    big = {"type": "object", "description": "x" * structured.CACHED_SCHEMA_CHARS}
    assert structured.schema_problem(big) is None  # checked, not kept
    assert structured.schema_problem({**big, "type": 5}).startswith("is not a valid JSON Schema")
