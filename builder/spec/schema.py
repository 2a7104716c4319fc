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

from builder.spec import adapters as adapters_spec
from builder.spec import deployment as spec_mod
from builder.spec import engine_args
from builder.spec import tenants as tenants_spec
from builder.spec import trtllm as trtllm_spec
from builder.spec.node import MAX_INT, anchored
from builder.spec.rules import Rule, kind_of, rule_of

SCHEMA_ID = "https://trident.invalid/deployment-spec.schema.json"
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin is tuple:
        return {"type": "array", "items": _json_type(args[0], owner, name)}
    if origin in (collections.abc.Mapping, dict) or hint in (Mapping, dict):
        value = args[1] if len(args) == 2 else Any
        return {
            "type": "object",
            "additionalProperties": {} if value is Any else _json_type(value, owner, name),
        }
    simple: dict[Any, dict[str, Any]] = {
        str: {"type": "string"},
        bool: {"type": "boolean"},
        int: {"type": "integer", "maximum": MAX_INT},
        float: {"type": "number"},
    }
    return dict(simple.get(hint, {}))


def _rule(rule: Rule, nullable: bool) -> dict[str, Any]:
    """A field's Rule (builder/spec/rules.py) in JSON Schema words; `item` is the
    caller's, which knows whether the field is a list or a mapping."""
    out: dict[str, Any] = {}
    if rule.minimum is not None:
        out["exclusiveMinimum" if rule.above else "minimum"] = rule.minimum
    if rule.maximum is not None:
        out["maximum"] = rule.maximum
    if rule.choices is not None and rule.ignore_case:
        # The parser compares in lower case: so does the pattern, letter by letter.
        out["pattern"] = anchored(
            "|".join(
                "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in name)
                for name in rule.choices
            )
        )
    elif rule.choices is not None:
        out["enum"] = [*rule.choices, *([None] if nullable else [])]
    if rule.pattern is not None:
        out["pattern"] = _pattern(rule)
    if rule.min_items is not None:
        out["minItems"] = rule.min_items
    if rule.unique:
        out["uniqueItems"] = True
    if rule.keys is not None:
        out["propertyNames"] = {"pattern": anchored(rule.keys)}
    return out


def _pattern(rule: Rule) -> str:
    """pattern and excludes as one ECMA-262 regex over the whole string."""
    text = anchored(rule.pattern or "[\\s\\S]*")
    if rule.excludes is None:
        return text
    # A lookahead at the start refuses what excludes matches whole.
    return f"^(?!(?:{rule.excludes})(?![\\s\\S])){text[1:]}"


def _with_rule(prop: dict[str, Any], rule: Rule, nullable: bool) -> dict[str, Any]:
    """prop (the field's type) with its rule; an item's rule goes into the items of a
    list or the values of a mapping, beside their type."""
    prop = {**prop, **_rule(rule, nullable)}
    if rule.item is not None:
        inner = "items" if prop.get("type") == "array" else "additionalProperties"
        prop[inner] = _with_rule(prop.get(inner) or {}, rule.item, False)
    return prop


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        if (cls, f.name) in _NOT_IN_YAML:
            continue
        prop = _with_rule(
            _json_type(hints[f.name], cls, f.name), rule_of(cls, f.name), kind_of(cls, f.name)[1]
        )
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


def _engine_args(engine: str) -> dict[str, Any]:
    table = engine_args.ENGINE_ARGS[engine]
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
                **_choices(engine, key),
            }
            for key, kinds in sorted(table.items())
        },
    }


def _choices(engine: str, key: str) -> dict[str, Any]:
    """The values an engine argument may take, where the parser lists them."""
    options = engine_args.CHOICES.get((engine, key))
    return {"enum": list(options)} if options else {}


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
        then: dict[str, Any] = {"properties": {"engine_args": _engine_args(engine)}}
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
    root["required"] = ["models"]
    root["allOf"] = [_ROUTER_INSTANCES_NEED_REDIS]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "trident deployment spec",
        **root,
        "$defs": defs,
    }
