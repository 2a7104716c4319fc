"""Each spec rule is written once, on its field (builder/spec/rules.py), and the parser and
`trident schema` both read it: at every edge of every range and choice, the parser's check
of the field and the schema's property accept and refuse the same values, and a value past
the edge, put into a whole spec, is refused by the parser naming that field."""

from __future__ import annotations

import copy
import dataclasses
import importlib
from dataclasses import dataclass, field

import jsonschema
import pytest

from bls.tenant_names import TENANT_NAME
from builder.spec import SpecError, parse_spec
from builder.spec import schema as schema_mod
from builder.spec.node import MAX_INT, _Node
from builder.spec.rules import RULE, Rule, kind_of, rule, rule_of
from builder.spec.schema import deployment_schema
from builder.spec.tenants import TenantsSpec

_VLLM = {"name": "m", "engine": "vllm", "model": "x", "adapters": {"a": "x"}}
BASE = {
    "name": "t",
    "models": [_VLLM],
    "router": {"rules": [{"name": "r", "match": {}, "backends": ["m"]}]},
    "tenants": {"default": {}},
}
_PROFILE = {"max_batch_size": 8, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 128}
TRT = {
    "name": "t",
    "models": [
        {
            "name": "big",
            "engine": "tensorrt_llm",
            "checkpoint": {"path": "/ckpt"},
            "tokenizer": {"path": "/tok"},
            "profiles": {
                "p": {
                    **_PROFILE,
                    "speculative": {"mode": "draft-model", "max_draft_len": 4, "draft_model": "d"},
                }
            },
        }
    ],
}
# Where each spec dataclass sits in a spec that is otherwise valid.
WHERE = {
    "ServerSpec": (BASE, ("server",)),
    "HardwareSpec": (BASE, ("hardware",)),
    "EngineCacheSpec": (BASE, ("engine_cache",)),
    "DeploymentSpec": (BASE, ()),
    "ModelSpec": (BASE, ("models", 0)),
    "PlacementSpec": (BASE, ("models", 0, "placement")),
    "LoraSettings": (BASE, ("models", 0, "lora")),
    "RouterSpec": (BASE, ("router",)),
    "RuleSpec": (BASE, ("router", "rules", 0)),
    "MatchSpec": (BASE, ("router", "rules", 0, "match")),
    "BreakerSpec": (BASE, ("router", "breaker")),
    "TenantsSpec": (BASE, ("tenants",)),
    "TenantLimits": (BASE, ("tenants", "default")),
    "Checkpoint": (TRT, ("models", 0, "checkpoint")),
    "BuildSettings": (TRT, ("models", 0, "build")),
    "Profile": (TRT, ("models", 0, "profiles", "p")),
    "Plugins": (TRT, ("models", 0, "profiles", "p", "plugins")),
    "Speculative": (TRT, ("models", 0, "profiles", "p", "speculative")),
}
MODULES = ("deployment", "trtllm", "tenants", "cache_spec", "adapters")


def _ruled_classes() -> list[type]:
    """Every spec dataclass with at least one field that carries a Rule."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(f"builder.spec.{name}")
        for value in vars(module).values():
            if dataclasses.is_dataclass(value) and isinstance(value, type):
                if any(RULE in f.metadata for f in dataclasses.fields(value)):
                    found[value.__name__] = value
    return sorted(found.values(), key=lambda c: c.__name__)


def _edges(rule_: Rule, kind: type) -> list[tuple[object, bool]]:
    """(value, inside the rule) at each edge of its range and choices."""
    edges: list[tuple[object, bool]] = []
    low, high = rule_.minimum, rule_.maximum
    if kind is int:
        if low is not None:
            edges += [(int(low) - 1, False), (int(low), True)]
        top = MAX_INT if high is None else int(high)
        edges += [(top, True), (top + 1, False)]
    if kind is float and low is not None:
        edges += [(float(low), not rule_.above), (float(low) + 1e-6, True)]
    if kind is float and high is not None:
        edges += [(float(high), True), (float(high) * 1.001 + 1e-6, False)]
    if rule_.choices is not None:
        edges += [(choice, True) for choice in rule_.choices]
        edges += [("no-such-choice", False)]
        if rule_.ignore_case:
            edges += [(choice.upper(), True) for choice in rule_.choices]
    return edges


def _cases():
    for cls in _ruled_classes():
        for f in dataclasses.fields(cls):
            rule_ = f.metadata.get(RULE)
            kind, _ = kind_of(cls, f.name)
            if rule_ is None or kind not in (int, float, str):
                continue  # lists and mappings: their items' rules are the parsers' own tests
            for value, inside in _edges(rule_, kind):
                yield pytest.param(
                    cls, f.name, value, inside, id=f"{cls.__name__}.{f.name}={value}"
                )


@pytest.fixture(scope="module")
def schema():
    return deployment_schema()


def test_every_ruled_class_has_a_place_in_a_spec():
    missing = [c.__name__ for c in _ruled_classes() if c.__name__ not in WHERE]
    assert missing == [], "add where these sit in a valid spec to WHERE"


def test_the_bases_are_valid_specs():
    parse_spec(copy.deepcopy(BASE), "base.yaml")
    parse_spec(copy.deepcopy(TRT), "trt.yaml")


@pytest.mark.parametrize("cls, key, value, inside", list(_cases()))
def test_parser_and_schema_agree_at_every_edge(schema, cls, key, value, inside):
    prop = schema["$defs"][cls.__name__]["properties"][key]
    schema_ok = jsonschema.Draft202012Validator(prop).is_valid(value)
    try:
        _Node({key: value}, "here", "s.yaml").field(cls, key)
        parser_ok = True
    except SpecError:
        parser_ok = False
    assert (parser_ok, schema_ok) == (inside, inside)
    if not inside:
        # The whole schema refuses it in a whole spec, and so does the whole parser,
        # naming this field: it reads the same rule.
        base, where = WHERE[cls.__name__]
        data = copy.deepcopy(base)
        target = data
        for step in where:
            target = target.setdefault(step, {}) if isinstance(step, str) else target[step]
        target[key] = value
        assert not jsonschema.Draft202012Validator(schema).is_valid(data)
        with pytest.raises(SpecError) as refused:
            parse_spec(data, "s.yaml")
        path = ".".join(str(s) for s in where).replace(".0", "[0]")
        assert refused.value.path == (f"{path}.{key}" if path else key)


@dataclass(frozen=True)
class _Knob:
    level: int = field(default=3, metadata=rule(minimum=2, maximum=9))
    rate: float = field(default=0.5, metadata=rule(minimum=0, above=True, maximum=1))


def test_one_rule_is_what_both_the_parser_and_the_schema_state():
    """A bound changed on the field changes the parser's message and the schema alike."""
    with pytest.raises(SpecError, match=r"^s.yaml: knob.level: must be <= 9, got 10$"):
        _Node({"level": 10}, "knob", "s.yaml").field(_Knob, "level")
    with pytest.raises(SpecError, match=r"knob.rate: must be in \(0, 1\], got 0.0$"):
        _Node({"rate": 0}, "knob", "s.yaml").field(_Knob, "rate")
    assert _Node({}, "knob", "s.yaml").field(_Knob, "level") == 3
    props = schema_mod._object(_Knob)["properties"]
    assert props["level"] == {"type": "integer", "minimum": 2, "maximum": 9, "default": 3}
    assert props["rate"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.5}


def test_tenant_names_are_the_routers_pattern():
    assert rule_of(TenantsSpec, "limits").keys is TENANT_NAME
    item = rule_of(TenantsSpec, "share_prefix_cache").item
    assert item is not None and item.pattern is TENANT_NAME
