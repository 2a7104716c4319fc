"""A JSON Schema (draft 2020-12) of the deployment spec, for editors and CI linters.

Built from the spec's own dataclasses (field names, types, defaults, nesting), the
engine-argument tables and the parser's choices, so a field added to the spec appears
here without a second definition. The parser stays the authority: the schema is what an
editor can check while typing (types, ranges, unknown keys, enums, URL formats, rules
between fields of one section); each rule is read from the constant the parser uses
(patterns in cache_spec and tenants, enums and limits in deployment). Rules across
sections (a backend that names no model, a name used twice, a profile that does not fit
its build) remain the parser's. tests/spec/test_schema.py checks that both accept every
deploy/ file; tests/spec/test_schema_agreement.py that they refuse the same specs.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from builder.plan import gpus
from builder.plan.memory import DTYPE_BYTES
from builder.spec import adapters as adapters_spec
from builder.spec import cache_spec, engine_args, router_policy
from builder.spec import deployment as spec_mod
from builder.spec import tenants as tenants_spec
from builder.spec import trtllm as trtllm_spec
from builder.spec.node import MAX_INT, anchored

SCHEMA_ID = "https://trident.invalid/deployment-spec.schema.json"
# `(?![\s\S])` ends the name in ECMA-262 and Python alike (`$` lets "name\n" through).
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}(?![\s\S])"
# Model and router names: a safe name not ending as a replica's (<model>__r0, ...).
MODEL_NAME_PATTERN = (
    r"^(?![\s\S]*" + router_policy.REPLICA_SEPARATOR + r"[0-9]+(?![\s\S]))" + NAME_PATTERN[1:]
)

_SECONDS = {"exclusiveMinimum": 0, "maximum": spec_mod.MAX_SECONDS}
# Ranges and formats the parser enforces, by (dataclass, field).
_RULES: dict[tuple[type, str], dict[str, Any]] = {
    **{
        (spec_mod.ServerSpec, port): {"minimum": 1, "maximum": 65535}
        for port in ("http_port", "grpc_port", "metrics_port", "openai_port")
    },
    (spec_mod.HardwareSpec, "gpu"): {"enum": ["cpu", *gpus.GPU_TYPES]},
    (spec_mod.HardwareSpec, "count"): {"minimum": 0, "maximum": spec_mod.MAX_GPUS},
    (spec_mod.HardwareSpec, "nodes"): {"minimum": 1, "maximum": spec_mod.MAX_NODES},
    (spec_mod.PlacementSpec, "devices"): {
        "items": {"type": "integer", "minimum": 0, "maximum": MAX_INT},
        "uniqueItems": True,
    },
    # The parser compares dtypes in lower case: so does the pattern, letter by letter.
    (spec_mod.PlacementSpec, "dtype"): {
        "pattern": anchored(
            "|".join(
                "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in name)
                for name in sorted(DTYPE_BYTES)
            )
        )
    },
    (spec_mod.RouterSpec, "default"): {"minItems": 1},
    (spec_mod.RuleSpec, "backends"): {"minItems": 1},
    (spec_mod.RouterSpec, "fallback"): {
        "additionalProperties": {"type": "array", "items": {"type": "string"}, "minItems": 1}
    },
    (spec_mod.ModelSpec, "name"): {"pattern": MODEL_NAME_PATTERN},
    (spec_mod.ModelSpec, "engine"): {"enum": list(spec_mod.ENGINES)},
    (spec_mod.ModelSpec, "instances"): {"minimum": 1, "maximum": 64},
    (spec_mod.PlacementSpec, "kind"): {"enum": list(spec_mod.INSTANCE_KINDS)},
    (spec_mod.PlacementSpec, "max_batch"): {"minimum": 1},
    (spec_mod.PlacementSpec, "max_context"): {"minimum": 1},
    (spec_mod.RouterSpec, "name"): {"pattern": MODEL_NAME_PATTERN},
    (spec_mod.RouterSpec, "short_prompt_tokens"): {"minimum": 0},
    (spec_mod.RouterSpec, "max_inflight_per_backend"): {"minimum": 1},
    (spec_mod.RouterSpec, "instances"): {"minimum": 1, "maximum": spec_mod.MAX_ROUTER_INSTANCES},
    (spec_mod.RouterSpec, "policy"): {"enum": list(router_policy.POLICIES)},
    (spec_mod.RouterSpec, "backend_policies"): {
        "additionalProperties": {"type": "string", "enum": list(router_policy.POLICIES)}
    },
    (spec_mod.RuleSpec, "policy"): {"enum": [*router_policy.POLICIES, None]},
    **{
        (cls, key): _SECONDS
        for cls, key in (
            (spec_mod.RouterSpec, "deadline_s"),
            (spec_mod.RouterSpec, "first_token_timeout_s"),
            (spec_mod.BreakerSpec, "window_s"),
            (spec_mod.BreakerSpec, "cooldown_s"),
        )
    },
    (spec_mod.BreakerSpec, "error_rate"): {"exclusiveMinimum": 0, "maximum": 1},
    (spec_mod.BreakerSpec, "min_requests"): {"minimum": 1},
    (spec_mod.BreakerSpec, "consecutive_failures"): {"minimum": 1},
    **{
        (spec_mod.MatchSpec, key): {"minimum": 0}
        for key in ("min_turns", "max_turns", "min_prompt_tokens", "max_prompt_tokens")
    },
    (trtllm_spec.BuildSettings, "dtype"): {"enum": list(trtllm_spec.DTYPES)},
    (trtllm_spec.BuildSettings, "quantization"): {"enum": list(trtllm_spec.QUANTIZATIONS)},
    (trtllm_spec.BuildSettings, "kv_cache_dtype"): {"enum": list(trtllm_spec.KV_CACHE_DTYPES)},
    (trtllm_spec.Checkpoint, "family"): {"enum": list(trtllm_spec.FAMILIES)},
    (trtllm_spec.Speculative, "mode"): {"enum": list(trtllm_spec.SPECULATIVE_MODES)},
    **tenants_spec.SCHEMA_RULES,
    **cache_spec.SCHEMA_RULES,
}
# Rules across the fields of one section, as the parser applies them.
_OBJECT_RULES: dict[type, dict[str, Any]] = {
    # A GPU type needs at least one GPU; more than one node needs a GPU type.
    spec_mod.HardwareSpec: {
        "allOf": [
            {
                "if": {"required": ["gpu"], "properties": {"gpu": {"not": {"const": "cpu"}}}},
                "then": {"properties": {"count": {"minimum": 1}}},
                "else": {"properties": {"nodes": {"maximum": 1}}},
            }
        ]
    },
    **tenants_spec.SCHEMA_OBJECT_RULES,
}
# More than one router instance with tenants needs their shared store (Redis): the
# parser's rule across the router and tenants sections, which a schema can state.
_ROUTER_INSTANCES_NEED_REDIS = {
    "if": {
        "required": ["router", "tenants"],
        "properties": {
            "router": {
                "type": "object",
                "required": ["instances"],
                "properties": {"instances": {"type": "integer", "minimum": 2}},
            },
            "tenants": {
                "type": "object",
                "anyOf": [
                    {"not": {"required": ["redis"]}},
                    {"properties": {"redis": {"type": "null"}}},
                ],
            },
        },
    },
    "then": False,
}
# Fields of the typed spec that are not keys of the YAML (derived or bookkeeping).
_NOT_IN_YAML = {
    (spec_mod.DeploymentSpec, "file"),
    (spec_mod.ModelSpec, "extra"),
    (trtllm_spec.Profile, "name"),
}
# Fields the parser fills in when the YAML leaves them out.
_OPTIONAL = {(spec_mod.RuleSpec, "name"), (spec_mod.RuleSpec, "match")}


def _json_type(hint: Any, owner: type, name: str) -> dict[str, Any]:
    """The schema of one annotated field."""
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin in (typing.Union, types.UnionType):
        inner = _json_type(args[0], owner, name) if len(args) == 1 else {}
        return {"anyOf": [inner, {"type": "null"}]}
    if dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin is tuple:
        return {"type": "array", "items": _json_type(args[0], owner, name)}
    if origin in (collections.abc.Mapping, dict) or hint in (Mapping, dict):
        value = args[1] if len(args) == 2 else Any
        return {
            "type": "object",
            "additionalProperties": {} if value is Any else _json_type(value, owner, name),
        }
    simple = {
        str: {"type": "string"},
        bool: {"type": "boolean"},
        int: {"type": "integer", "maximum": MAX_INT},
        float: {"type": "number"},
    }
    return dict(simple.get(hint, {}))


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        if (cls, f.name) in _NOT_IN_YAML:
            continue
        prop = {**_json_type(hints[f.name], cls, f.name), **_RULES.get((cls, f.name), {})}
        if f.default is not dataclasses.MISSING and f.default is not None:
            prop["default"] = f.default
        elif (
            f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and (cls, f.name) not in _OPTIONAL
        ):
            required.append(f.name)
        properties[f.name] = prop
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _engine_args(table: Mapping[str, tuple]) -> dict[str, Any]:
    names = {
        int: "integer",
        float: "number",
        str: "string",
        bool: "boolean",
        dict: "object",
        type(None): "null",
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            key: {
                "type": sorted({names[k] for k in kinds}),
                **_engine_arg_range(key),
                **_nested(key),
            }
            for key, kinds in sorted(table.items())
        },
    }


def _nested(key: str) -> dict[str, Any]:
    """The keys a nested engine argument may hold (vLLM's speculative_config)."""
    if key == "speculative_config":
        return {"propertyNames": {"enum": sorted(engine_args.VLLM_SPECULATIVE_KEYS)}}
    return {}


def _engine_arg_range(key: str) -> dict[str, Any]:
    if key in engine_args.FRACTIONS:
        return {"exclusiveMinimum": 0, "maximum": 1}
    low = 1 if key in engine_args.POSITIVE_INTS else 0 if key in engine_args.NON_NEGATIVE else None
    bounds = {"maximum": engine_args.MAX_INT}
    return bounds if low is None else {"minimum": low, **bounds}


def _model_rules() -> list[dict[str, Any]]:
    """engine_args (and TRT-LLM's own sections) by engine."""
    rules = []
    for engine in spec_mod.ENGINES:
        then: dict[str, Any] = {
            "properties": {"engine_args": _engine_args(engine_args.ENGINE_ARGS[engine])}
        }
        sections = engine_args.EXTRA_SECTIONS.get(engine, ())
        if not set(engine_args.TRTLLM_SECTIONS) & set(sections):
            then["not"] = {"anyOf": [{"required": [key]} for key in engine_args.TRTLLM_SECTIONS]}
        if engine in spec_mod.NEEDS_MODEL:
            then["required"] = ["model"]
            then["properties"]["model"] = {"minLength": 1}
        rules.append({"if": {"properties": {"engine": {"const": engine}}}, "then": then})
    return rules


def deployment_schema() -> dict[str, Any]:
    classes = [
        spec_mod.ServerSpec,
        spec_mod.HardwareSpec,
        spec_mod.EngineCacheSpec,
        spec_mod.ModelSpec,
        spec_mod.PlacementSpec,
        spec_mod.MatchSpec,
        spec_mod.RuleSpec,
        spec_mod.BreakerSpec,
        spec_mod.RouterSpec,
        trtllm_spec.Checkpoint,
        trtllm_spec.BuildSettings,
        trtllm_spec.Plugins,
        trtllm_spec.Speculative,
        trtllm_spec.Profile,
        trtllm_spec.Tokenizer,
        *tenants_spec.SCHEMA_CLASSES,
        adapters_spec.LoraSettings,
    ]
    defs = {cls.__name__: {**_object(cls), **_OBJECT_RULES.get(cls, {})} for cls in classes}
    model = defs["ModelSpec"]
    model["properties"].update(
        {
            "checkpoint": {"$ref": "#/$defs/Checkpoint"},
            "build": {"$ref": "#/$defs/BuildSettings"},
            "tokenizer": {"$ref": "#/$defs/Tokenizer"},
            "profiles": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"pattern": trtllm_spec.PROFILE_NAME.pattern},
                "additionalProperties": {"$ref": "#/$defs/Profile"},
            },
            "adapters": {
                "type": "object",
                "minProperties": 1,
                "propertyNames": {"pattern": adapters_spec.NAME_RE.pattern},
                "additionalProperties": {"type": "string", "minLength": 1},
            },
            "lora": {"$ref": "#/$defs/LoraSettings"},
        }
    )
    model["allOf"] = _model_rules()
    root = _object(spec_mod.DeploymentSpec)
    root["properties"]["models"]["minItems"] = 1
    root["required"] = ["models"]
    root["allOf"] = [_ROUTER_INSTANCES_NEED_REDIS]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "trident deployment spec",
        **root,
        "$defs": defs,
    }
