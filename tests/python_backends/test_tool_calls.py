"""Tool calls and structured outputs in the engine models, without an engine:
trident_common/tool_calls.py (the plan, the forced schema, reading the calls, holding
the text until the answer is whole) and trident_common/structured.py (vLLM's
structured_outputs in SGLang's words, one constraint per request). Every refusal must
reach an OpenAI client naming its parameter, so each is read back through the error
table as the frontend reads it."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import numpy as np
import pytest

from tests.fakes import fake_pb_utils as pb
from trident_common import error_classes
from trident_common.deltas import Delta, merge
from trident_common.faults import BadRequest
from trident_common.request import parse_generate
from trident_common.structured import check_json_schema, to_sglang, with_tools
from trident_common.tool_calls import (
    collect,
    forced_calls,
    forced_schema,
    parse_plan,
    read_tools,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters
TOOLS = json.dumps([WEATHER, TIME])


def param_of(error: BadRequest) -> str | None:
    """The parameter an OpenAI client is told, as the frontend reads the message."""
    return error_classes.parse(error_classes.CLIENT.mark(str(error))).param


def refused(function, *args) -> str | None:
    with pytest.raises(BadRequest) as caught:
        function(*args)
    return param_of(caught.value)


def test_the_plan_reads_each_tool_choice():
    assert parse_plan(TOOLS, None).choice == "auto"
    assert parse_plan(TOOLS, "required").forced
    assert parse_plan(TOOLS, "get_time").choice == "get_time"
    named = json.dumps({"type": "function", "function": {"name": "get_weather"}})
    assert parse_plan(TOOLS, named).choice == "get_weather"
    # "none": the template still gets the tools, nothing is enforced or parsed
    assert read_tools(TOOLS, "none", chat=True) == ([WEATHER, TIME], None)


@pytest.mark.parametrize(
    "tools, choice, param",
    [
        (TOOLS, "get_date", "tool_choice"),
        (None, "required", "tool_choice"),
        ("[]", None, "tools"),
        ("not json", None, "tools"),
        (json.dumps([{"type": "retrieval"}]), None, "tools[0]"),
        (json.dumps([TIME, TIME]), None, "tools[1].function.name"),
    ],
)
def test_bad_tools_are_refused_naming_the_parameter(tools, choice, param):
    assert refused(parse_plan, tools, choice) == param


def test_tools_need_chat_messages():
    get = {"text_input": "hi", "tools": TOOLS}.get
    assert refused(parse_generate, get) == "tools"
    request = parse_generate(
        {
            "messages": json.dumps([{"role": "user", "content": "hi"}]),
            "tools": TOOLS,
            "tool_choice": "required",
        }.get
    )
    assert request.tools == [WEATHER, TIME] and request.tool_plan.forced


def test_a_named_choice_is_held_to_its_arguments_and_read_as_one_call():
    plan = parse_plan(TOOLS, "get_weather")
    schema = forced_schema(plan)
    assert schema == WEATHER["function"]["parameters"]
    (call,) = forced_calls(plan, '{"city": "Paris", "unit": "c"}')
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris", "unit": "c"}',
    }


def test_required_is_a_list_of_calls_of_the_tools():
    plan = parse_plan(TOOLS, "required")
    schema = forced_schema(plan)
    answer = [
        {"name": "get_time", "arguments": {}},
        {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f"}},
    ]
    jsonschema.validate(answer, schema)
    for wrong in (
        [],
        [{"name": "get_date", "arguments": {}}],
        [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    assert forced_schema(plan, parallel=False)["maxItems"] == 1
    calls = forced_calls(plan, json.dumps(answer))
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo", "unit": "f"}
    assert forced_calls(plan, '[{"name": "get_ti') == []  # cut short by max_tokens


async def _collected(deltas, extract):
    async def source():
        for delta in deltas:
            yield delta

    return [d async for d in collect(source(), extract)]


def test_collect_holds_the_text_and_ends_with_the_calls():
    plan = parse_plan(TOOLS, "get_time")
    deltas = [Delta("{", None, 7, 1), Delta("}", "stop", 7, 2)]

    def extract(text):
        calls = forced_calls(plan, text)
        return (None, calls) if calls else (text, [])

    first, last = asyncio.run(_collected(deltas, extract))
    assert (first.text, first.finish_reason, first.output_tokens) == ("", None, 1)
    assert (last.text, last.finish_reason, last.output_tokens) == ("", "tool_calls", 2)
    assert json.loads(last.tool_calls)[0]["function"]["arguments"] == "{}"
    # an answer without a call keeps its text and its finish reason
    (plain,) = asyncio.run(_collected([Delta("Hi", "length", 7, 1)], lambda text: (text, [])))
    assert (plain.text, plain.finish_reason, plain.tool_calls) == ("Hi", "length", None)


def test_merged_deltas_keep_the_calls_of_the_last():
    merged = merge([Delta("a", None, 1, 1), Delta("b", "tool_calls", 1, 2, tool_calls="[1]")])
    assert (merged.text, merged.tool_calls) == ("ab", "[1]")


def test_structured_outputs_in_sglang_words():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(to_sglang({"json": schema})["json_schema"]) == schema
    assert to_sglang({"json_object": True}) == {"json_schema": '{"type": "object"}'}
    assert to_sglang({"regex": "[0-9]+", "disable_any_whitespace": True}) == {"regex": "[0-9]+"}
    assert to_sglang({"choice": ["a.b", "c"]}) == {"regex": "(a\\.b|c)"}
    assert to_sglang({"grammar": 'root ::= "x"'}) == {"ebnf": 'root ::= "x"'}
    assert refused(to_sglang, {"json": {}, "regex": "x"}) == "response_format"


def test_one_constraint_per_request():
    plan = parse_plan(TOOLS, "required")
    values, tag = with_tools({"temperature": 0}, plan)
    assert values["structured_outputs"]["json"]["type"] == "array" and tag == "[tools] "
    assert (
        with_tools({"structured_outputs": {"json_object": True}}, None)[1] == "[response_format] "
    )
    assert refused(with_tools, {"structured_outputs": {"json_object": True}}, plan) == "tool_choice"
    auto = parse_plan(TOOLS, None)  # auto constrains nothing
    assert with_tools({}, auto) == ({}, "")


def test_a_schema_xgrammar_cannot_compile_is_the_clients_error():
    check_json_schema('{"type": "object"}', "[response_format] ")
    with pytest.raises(BadRequest) as caught:
        check_json_schema('{"type": "nonsense"}', "[response_format] ")
    assert param_of(caught.value) == "response_format"
    assert "nonsense" in str(caught.value) and ".cc" not in str(caught.value)


def test_the_routers_trtllm_adapter_refuses_tools_naming_them():
    request = [
        pb.Tensor("text_input", np.array([b"hi"], dtype=object)),
        pb.Tensor("tools", np.array([TOOLS.encode()], dtype=object)),
    ]
    from bls import adapters

    with pytest.raises(BadRequest) as caught:
        adapters.TrtllmAdapter("llama").inputs(request, "r1")
    assert param_of(caught.value) == "tools"


def _enum_schema(n: int) -> dict:
    return {"type": "object", "properties": {"color": {"enum": [f"c{i}" for i in range(n)]}}}


@pytest.mark.parametrize(
    "values, param, words",
    [
        ({"structured_outputs": {"json": _enum_schema(100_000)}}, "response_format", "characters"),
        ({"structured_outputs": {"json": _enum_schema(2_000)}}, "response_format", "2000 enum"),
        (
            {"structured_outputs": {"json": {"anyOf": [{"const": i} for i in range(2_000)]}}},
            "response_format",
            "anyOf of 2000 schemas",
        ),
        (
            {
                "structured_outputs": {
                    "json": {
                        "type": "object",
                        "properties": {f"p{i}": {} for i in range(6_000)},
                    }
                }
            },
            "response_format",
            "6000 object properties",
        ),
        ({"json_schema": json.dumps(_enum_schema(5_000))}, "json_schema", "enum values"),
        ({"regex": "a" * 200_000}, "regex", "characters"),
    ],
)
def test_a_constraint_over_the_bounds_is_the_clients_error_before_any_engine(values, param, words):
    """Issue 34: such constraints ran past the timeouts on every replica and took others
    with them; now a 400 naming the parameter, before an engine compiles anything."""
    with pytest.raises(BadRequest) as refused:
        with_tools(values, None)
    assert param_of(refused.value) == param and words in str(refused.value)


def test_constraints_within_the_bounds_pass():
    schema = _enum_schema(1_000)
    assert with_tools({"structured_outputs": {"json": schema}}, None)[0]["structured_outputs"]
    anyof = {"anyOf": [{"const": i} for i in range(128)]}
    assert with_tools({"structured_outputs": {"json": anyof}}, None)


def test_more_tools_than_openai_allows_are_refused_naming_tools():
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
        for i in range(5_000)
    ]
    with pytest.raises(BadRequest) as refused:
        parse_plan(json.dumps(tools), "required")
    assert param_of(refused.value) == "tools"
    assert "128 tools at most, not 5000" in str(refused.value)
    assert parse_plan(json.dumps(tools[:128]), "required").forced


def test_a_compilers_message_loses_where_in_its_source_it_was_raised():
    """Issue 34: xgrammar's C++ file and line reached clients through vLLM's refusal."""
    from trident_common.structured import compiler_words

    raw = "ValueError: [09:14:02] /workspace/cpp/json_schema_converter.cc:811: minimum > maximum"
    assert compiler_words(raw) == "ValueError: minimum > maximum"


def _optional(n: int, prefix: str = "p") -> dict:
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "string"} for i in range(n)}}


@pytest.mark.parametrize(
    "schema, words",
    [
        # 3,000 optional properties compiled for 31 s (constraint_bounds.py): a small
        # schema's worth of text, far below the size and property bounds.
        (_optional(3_000), "3000 optional object properties"),
        (
            {
                "type": "object",
                "properties": {"a": _optional(600, "a"), "b": _optional(600, "b")},
                "required": ["a", "b"],
            },
            "1200 optional object properties",
        ),
        # 42 characters that took xgrammar over two minutes to convert.
        ({"type": "string", "pattern": "a{1,50000}"}, "add up to 50000"),
        (
            {
                "type": "object",
                "properties": {
                    "x": {"type": "string", "pattern": "^[a-z]{1,1500}$"},
                    "y": {"type": "string", "pattern": "^[0-9]{1000}$"},
                },
                "required": ["x", "y"],
            },
            "add up to 2500",
        ),
        ({"type": "object", "patternProperties": {"^k{3000}$": {}}}, "add up to 3000"),
    ],
)
def test_what_compiles_slowly_for_its_size_is_bounded_too(schema, words):
    """Issue 34: optional properties and pattern repetitions cost far more compile time
    than their text: refused as the client's error naming the parameter."""
    for values, param in [
        ({"structured_outputs": {"json": schema}}, "response_format"),
        ({"json_schema": json.dumps(schema)}, "json_schema"),
    ]:
        with pytest.raises(BadRequest) as refused:
            with_tools(values, None)
        assert param_of(refused.value) == param and words in str(refused.value)


def test_required_properties_escaped_braces_and_regex_constraints_are_not_counted():
    required = _optional(2_000)
    required["required"] = list(required["properties"])
    assert with_tools({"structured_outputs": {"json": required}}, None)
    assert with_tools({"structured_outputs": {"json": _optional(1_000)}}, None)
    dates = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$ \{99999\}"}
    assert with_tools({"structured_outputs": {"json": dates}}, None)
    # A regex or grammar constraint repeats cheaply (a{1,50000} compiles in 6 ms).
    assert with_tools({"structured_outputs": {"regex": "a{1,50000}"}}, None)
    assert with_tools({"regex": "a{1,50000}"}, None)
