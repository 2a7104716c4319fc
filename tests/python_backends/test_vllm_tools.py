"""The vLLM model's tool parsing (python_backends/vllm/model.py) with vLLM's own parsers
and SmolLM2's real tokenizer, without an engine: `auto` answers are read by the parser
the spec names (hermes here), forced ones from the JSON the schema held the engine to.
Importing vLLM's parsers takes seconds: one module, one import."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from builder.engines import assets
from builder.spec.engine_args import CHOICES
from tests.python_backends.test_vllm_health import module  # noqa: F401  (the fixture)
from trident_common.tool_calls import parse_plan

TOOLS = [
    {
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
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.ensure(assets.SMOLLM2))  # built once, kept


def extractor(module, tokenizer, choice):  # noqa: F811
    model = module.TritonPythonModel()
    model.model_name, model.tokenizer = "smollm2", tokenizer
    model._tool_parser = module.tool_parser_class("hermes")
    request = SimpleNamespace(messages=MESSAGES, tool_plan=parse_plan(json.dumps(TOOLS), choice))
    return model._extractor(request)


def test_the_specs_parser_names_are_vllms(module):  # noqa: F811
    from vllm.tool_parsers import ToolParserManager

    names = set(ToolParserManager.lazy_parsers) | set(ToolParserManager.tool_parsers)
    assert set(CHOICES[("vllm", "tool_call_parser")]) == names


def test_auto_reads_hermes_calls_and_keeps_plain_text(module, tokenizer):  # noqa: F811
    extract = extractor(module, tokenizer, None)
    content, calls = extract(
        'Checking.<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert content == "Checking."
    (call,) = calls
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert extract("It is sunny.") == ("It is sunny.", [])


def test_a_named_choice_reads_the_constrained_json(module, tokenizer):  # noqa: F811
    extract = extractor(module, tokenizer, "get_weather")
    content, (call,) = extract('{"city": "Oslo"}')
    assert content is None and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert extract('{"city": "Os') == ('{"city": "Os', [])  # cut short: no call


def test_an_unknown_parser_fails_the_load(module):  # noqa: F811
    with pytest.raises(KeyError):
        module.tool_parser_class("no_such_parser")
    assert module.tool_parser_class(None) is None
