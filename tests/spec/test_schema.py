"""The deployment spec's JSON Schema (`trident schema`): a valid draft 2020-12 schema
that accepts every spec in deploy/ and the generator's valid cases, and refuses the
structural defects an editor can see (wrong types, unknown keys, bad names, numbers out
of range)."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
import yaml

from builder.cli import main as cli
from builder.spec import SpecError, parse_spec, yaml_loader
from builder.spec.schema import deployment_schema
from tests.helpers import hostile_specs as hs
from tests.helpers.servers import ROOT

STRUCTURAL = (
    "wrong type",
    "unknown key",
    "model name",
    "router name",
    "negative number",
    "huge number",
)


@pytest.fixture(scope="module")
def validator():
    schema = deployment_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _yaml(text: bytes):
    """What the spec loader reads from text, or None where it refuses the text itself."""
    try:
        return yaml_loader.load(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, yaml.YAMLError):
        return None


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").rglob("*.yaml"))
)
def test_every_deploy_spec_is_valid(validator, path):
    errors = [e.message for e in validator.iter_errors(yaml.safe_load((ROOT / path).read_text()))]
    assert errors == []


def test_schema_agrees_with_the_parser_on_generated_specs(validator):
    accepted_bad, refused_good = [], []
    for case in hs.generate():
        data = _yaml(case.text)
        if not isinstance(data, dict) or _has_non_finite(data):
            continue  # not YAML a schema sees (bytes, NaN): the loader's job
        valid = not list(validator.iter_errors(data))
        if case.valid and not valid:
            refused_good.append(case.name)
        if not case.valid and valid and any(word in case.name for word in STRUCTURAL):
            accepted_bad.append(case.name)
    assert refused_good == []
    assert accepted_bad == []


def _has_non_finite(data) -> bool:
    if isinstance(data, dict):
        return any(_has_non_finite(v) for v in data.values())
    if isinstance(data, list):
        return any(_has_non_finite(v) for v in data)
    return isinstance(data, float) and not math.isfinite(data)


def test_engine_args_follow_the_engine(validator):
    spec = {
        "models": [
            {"name": "m", "engine": "sglang", "model": "x", "engine_args": {"max_model_len": 10}}
        ]
    }
    assert list(validator.iter_errors(spec))  # a vLLM argument on SGLang
    spec["models"][0]["engine_args"] = {"context_length": 10}
    assert not list(validator.iter_errors(spec))
    spec["models"][0]["build"] = {"dtype": "fp16"}  # TRT-LLM sections only on TRT-LLM
    assert list(validator.iter_errors(spec))


def test_cli_prints_the_schema(capsys):
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(deployment_schema()))


def test_an_integral_float_and_a_null_agree_with_the_schema(validator):
    """Issue 34: `max_model_len: 1024.0` passed the schema (an integer to JSON Schema)
    and failed the parser; `router.name: null` failed the schema and passed the parser."""
    model = {"name": "a", "engine": "vllm", "model": "org/m"}
    whole = {"models": [{**model, "engine_args": {"max_model_len": 1024.0}}]}
    assert list(validator.iter_errors(whole)) == []
    assert parse_spec(whole).models[0].engine_args["max_model_len"] == 1024
    nameless = {"models": [model], "router": {"name": None}}
    assert list(validator.iter_errors(nameless)) != []
    with pytest.raises(SpecError, match=r"router\.name: must not be null"):
        parse_spec(nameless)
