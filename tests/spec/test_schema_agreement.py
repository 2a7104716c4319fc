"""`trident schema` and the parser read their rules from one place, so they agree: on
targeted specs (one defect each) and the generated hostile specs, the schema refuses
exactly what the parser refuses, except rules across sections that JSON Schema cannot
express (a name used twice, a backend that names no model, min above max, equal ports),
which stay the parser's alone."""

from __future__ import annotations

import copy
import json
import math

import jsonschema
import pytest

from builder.spec import SpecError, parse_spec, yaml_loader
from builder.spec.schema import deployment_schema
from tests.helpers import hostile_specs as hs

BASE = {
    "name": "x",
    "hardware": {"gpu": "cpu"},
    "models": [
        {"name": "m", "engine": "vllm", "model": "/m", "engine_args": {"max_model_len": 512}}
    ],
    "router": {"default": ["m"]},
}
# The parser's rules across sections: the words of their reasons.
PARSER_ONLY = (
    "is not a model",
    "is already used",
    "is also a model name",
    "can never match",
    "must differ",
)


def changed(path: tuple, value) -> dict:
    data = copy.deepcopy(BASE)
    parent = data
    for part in path[:-1]:
        parent = parent.setdefault(part, {}) if isinstance(part, str) else parent[part]
    parent[path[-1]] = value
    return data


TENANTS = ("tenants",)
CASES = {
    "s3 bucket in upper case": changed(("engine_cache", "s3"), "s3://Bucket/x"),
    "s3 presigned": changed(("engine_cache", "s3"), "s3://bucket/x?X-Amz-Signature=abc"),
    "s3 secret with /": changed(("engine_cache", "s3"), "s3://k:a/b@bucket"),
    "s3 as http": changed(("engine_cache", "s3"), "http://bucket"),
    "s3 with newline": changed(("engine_cache", "s3"), "s3://bucket/x\n"),
    "endpoint ftp": changed(("engine_cache", "endpoint_url"), "ftp://h"),
    "endpoint credentials": changed(("engine_cache", "endpoint_url"), "http://a:b@h"),
    "endpoint token": changed(("engine_cache", "endpoint_url"), "http://h/?token=x"),
    "endpoint fragment": changed(("engine_cache", "endpoint_url"), "http://h/#x"),
    "secret name": changed(("engine_cache", "credentials_secret"), "Bad_Name"),
    "gpu type": changed(("hardware", "gpu"), "V100"),
    "gpu count 0": changed(("hardware",), {"gpu": "H100-80GB", "count": 0}),
    "nodes 0": changed(("hardware", "nodes"), 0),
    "nodes 100": changed(("hardware", "nodes"), 100),
    "nodes on cpu": changed(("hardware", "nodes"), 2),
    "count 65": changed(("hardware", "count"), 65),
    "http port 0": changed(("server", "http_port"), 0),
    "openai port": changed(("server", "openai_port"), 9000),
    "openai port 70000": changed(("server", "openai_port"), 70000),
    "equal ports": changed(("server", "grpc_port"), 8000),
    "redis query": changed(TENANTS, {"redis": "redis://h:6379/0?password=x"}),
    "redis fragment": changed(TENANTS, {"redis": "redis://h#x"}),
    "redis db word": changed(TENANTS, {"redis": "redis://h/secret"}),
    "redis port 99999": changed(TENANTS, {"redis": "redis://h:99999"}),
    "redis port 65535": changed(TENANTS, {"redis": "redis://h:65535/1"}),
    "password_env value": changed(TENANTS, {"redis": "redis://h", "password_env": "a b"}),
    "both passwords": changed(
        TENANTS, {"redis": "redis://h", "password_env": "A", "password_file": "/f"}
    ),
    "password without redis": changed(TENANTS, {"password_env": "A"}),
    "tenant name": changed(TENANTS, {"limits": {"a b": {}}}),
    "tenant name newline": changed(TENANTS, {"limits": {"alice\n": {}}}),
    "shared tenant name": changed(TENANTS, {"share_prefix_cache": ["a b"]}),
    "rpm 0": changed(TENANTS, {"default": {"requests_per_minute": 0}}),
    "model twice": {**BASE, "models": BASE["models"] * 2},
    "unknown backend": changed(("router", "default"), ["nope"]),
    "no default backend": changed(("router", "default"), []),
    "router named as a model": changed(("router", "name"), "m"),
    "deadline 0": changed(("router", "deadline_s"), 0),
    "error rate 2": changed(("router", "breaker"), {"error_rate": 2}),
    "instances 0": changed(("models", 0, "instances"), 0),
    "placement kind": changed(("models", 0, "placement"), {"kind": "tpu"}),
    "negative device": changed(("models", 0, "placement"), {"devices": [-1]}),
    "device twice": changed(("models", 0, "placement"), {"devices": [1, 1]}),
    "dtype": changed(("models", 0, "placement"), {"dtype": "int3"}),
    "dtype upper case": changed(("models", 0, "placement"), {"dtype": "BF16"}),
    "max_batch 0": changed(("models", 0, "placement"), {"max_batch": 0}),
    "engine": changed(("models", 0, "engine"), "llamacpp"),
    "tasks as a string": changed(("models", 0, "tasks"), "chat"),
    "empty model": changed(("models", 0, "model"), ""),
    "no model": {**BASE, "models": [{"name": "m", "engine": "vllm"}]},
    "spec name": changed(("name",), "a b"),
    "max_model_len 0": changed(("models", 0, "engine_args", "max_model_len"), 0),
    "gpu_memory_utilization 1.5": changed(
        ("models", 0, "engine_args", "gpu_memory_utilization"), 1.5
    ),
    "speculative_config key": changed(
        ("models", 0, "engine_args", "speculative_config"), {"foo": 1}
    ),
    "speculative_config": changed(
        ("models", 0, "engine_args", "speculative_config"),
        {"method": "ngram", "prompt_lookup_max": 3},
    ),
    "tp 0": changed(("models", 0, "engine_args", "tensor_parallel_size"), 0),
    "min turns above max": changed(
        ("router", "rules"),
        [{"name": "r", "match": {"min_turns": 5, "max_turns": 1}, "backends": ["m"]}],
    ),
    "rule without backends": changed(
        ("router", "rules"), [{"name": "r", "match": {}, "backends": []}]
    ),
    "rule with unknown backend": changed(
        ("router", "rules"), [{"name": "r", "match": {}, "backends": ["zz"]}]
    ),
    "unknown fallback": changed(("router", "fallback"), {"m": ["zz"]}),
    "empty fallback": changed(("router", "fallback"), {"m": []}),
    "max_inflight 0": changed(("router", "max_inflight_per_backend"), 0),
    "router instances 0": changed(("router", "instances"), 0),
    "router instances 65": changed(("router", "instances"), 65),
    "router instances as text": changed(("router", "instances"), "2"),
    "router instances, local tenants": {
        **changed(("router", "instances"), 2),
        "tenants": {"default": {}},
    },
    "router instances, redis null": {
        **changed(("router", "instances"), 2),
        "tenants": {"redis": None},
    },
    "router instances, shared tenants": {
        **changed(("router", "instances"), 2),
        "tenants": {"redis": "redis://h"},
    },
}


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(deployment_schema())


def _parser_error(data) -> str | None:
    try:
        parse_spec(data, "s.yaml")
    except SpecError as e:
        return str(e)
    return None


def _disagreements(validator, cases: dict) -> list[str]:
    found = []
    for name, data in cases.items():
        schema_errors = [e.message for e in validator.iter_errors(data)]
        parser_error = _parser_error(data)
        if bool(schema_errors) == bool(parser_error):
            continue
        if parser_error and any(words in parser_error for words in PARSER_ONLY):
            continue  # a rule across sections: the parser's alone
        found.append(f"{name}: schema {schema_errors[:1]}, parser {parser_error}")
    return found


def test_schema_and_parser_agree_on_targeted_specs(validator):
    assert _disagreements(validator, CASES) == []


def test_schema_and_parser_agree_on_generated_specs(validator):
    cases = {}
    for case in hs.generate():
        try:
            data = yaml_loader.load(case.text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue  # not YAML a schema sees: the loader's job
        if isinstance(data, dict) and _finite(data):
            cases[case.name] = json.loads(json.dumps(data).replace(hs.MODEL_TOKEN, "/m"))
    assert len(cases) >= 60
    assert _disagreements(validator, cases) == []


def _finite(data) -> bool:
    if isinstance(data, dict):
        return all(_finite(v) for v in data.values())
    if isinstance(data, list):
        return all(_finite(v) for v in data)
    return not (isinstance(data, float) and not math.isfinite(data))
