"""Tools and structured outputs through trident's SGLang model (python_backends/sglang/
model.py), driven as Triton drives it, on the SGLang double (support/fake_sglang.py,
support/fake_sglang_tools.py): what SGLang gets (json_schema as text, the tools in the
chat template) and what the client gets back (the tool_calls output, finish reason
"tool_calls", refusals naming the parameter)."""

from __future__ import annotations

import json
import sys

import jsonschema
import pytest

from builder.pipeline import build_repository
from builder.spec import parse_spec
from support import fake_sglang, fake_sglang_tools
from tests.python_backends.test_sglang_model import _serve, sglang_spec
from trident_common import error_classes

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def rendered(tmp_path_factory, **engine_args):
    out = tmp_path_factory.mktemp("sglang-tools") / "repo"
    build_repository(parse_spec(sglang_spec(**engine_args), "<test>"), out)
    return out


@pytest.fixture(scope="module")
def repo_with_parser(tmp_path_factory):
    return rendered(tmp_path_factory, tool_call_parser="qwen25")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return rendered(tmp_path_factory)


@pytest.fixture
def served(repo_with_parser, monkeypatch):
    modules: dict = {}
    fake_sglang_tools.install(modules)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    yield from _serve(repo_with_parser, monkeypatch)


def last(sender):
    responses = sender.responses()
    return responses[-1]


def refusal(sender) -> tuple[str, str | None]:
    (response,) = [r for r in sender.responses() if r.has_error()]
    parsed = error_classes.parse(response.error().message())
    return parsed.error_class.name, parsed.param


def test_a_named_choice_is_a_json_schema_and_comes_back_as_one_call(served):
    sender = served.run(
        messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="get_weather", stream=True
    )
    sent = served.engine.calls[-1]["sampling_params"]
    assert json.loads(sent["json_schema"]) == WEATHER["function"]["parameters"]
    assert "Weather in Paris?" in served.engine.calls[-1]["prompt"]
    final = last(sender)
    assert final.value("finish_reason") == "tool_calls"
    (call,) = json.loads(final.value("tool_calls"))
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )
    # the held text never went out as content
    assert "".join(r.value("text_output") or "" for r in sender.responses()) == ""


def test_required_calls_parse_whole(served):
    sender = served.run(messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required")
    (response,) = [r for r in sender.responses() if r.value("tool_calls") is not None]
    calls = json.loads(response.value("tool_calls"))
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert response.value("finish_reason") == "tool_calls"


def test_auto_reads_calls_with_sglangs_parser(served, monkeypatch):
    reply = 'Let me look . <tool_call> {"name": "get_time", "arguments": {}} </tool_call>'
    monkeypatch.setattr(fake_sglang, "REPLY", reply)
    final = last(served.run(messages=MESSAGES, tools=[WEATHER, TIME], stream=True))
    (call,) = json.loads(final.value("tool_calls"))
    assert call["function"] == {"name": "get_time", "arguments": "{}"}
    assert final.value("text_output") == "Let me look ."
    # without a call the answer is the model's text, finish reason as it came
    monkeypatch.setattr(fake_sglang, "REPLY", "Sunny .")
    plain = last(served.run(messages=MESSAGES, tools=[WEATHER, TIME]))
    assert plain.value("text_output").strip() == "Sunny ."
    assert plain.value("tool_calls") is None and plain.value("finish_reason") == "stop"


def test_response_format_reaches_sglang_as_json_schema(served):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    final = last(
        served.run(messages=MESSAGES, sampling_parameters={"structured_outputs": {"json": schema}})
    )
    assert json.loads(served.engine.calls[-1]["sampling_params"]["json_schema"]) == schema
    jsonschema.validate(json.loads(final.value("text_output")), schema)


@pytest.mark.parametrize(
    "inputs, param",
    [
        (
            {"sampling_parameters": {"structured_outputs": {"json": {"type": "nonsense"}}}},
            "response_format",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "nonsense"}},
                    }
                ],
                "tool_choice": "f",
            },
            "tools",
        ),
        ({"tools": [TIME], "tool_choice": "get_date"}, "tool_choice"),
        (
            {
                "tools": [TIME],
                "tool_choice": "required",
                "sampling_parameters": {"structured_outputs": {"json_object": True}},
            },
            "tool_choice",
        ),
    ],
)
def test_refusals_are_client_errors_naming_the_parameter(served, inputs, param):
    calls = len(served.engine.calls)
    sender = served.run(messages=MESSAGES, **inputs)
    assert refusal(sender) == ("client_error", param)
    assert len(served.engine.calls) == calls  # refused before generation


def test_auto_without_a_parser_is_refused(repo, monkeypatch):
    for served in _serve(repo, monkeypatch):
        sender = served.run(messages=MESSAGES, tools=[TIME])
        assert refusal(sender) == ("client_error", "tool_choice")
