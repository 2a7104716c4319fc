"""router.json through its one reader and writer (bls/router_config.py): what the builder
renders reads back whole and writes back byte for byte; a file the router cannot use is
refused at load with one line naming the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from bls.router_config import (
    BackendConfig,
    BreakerConfig,
    RouterConfig,
    RouterConfigError,
    TenantsConfig,
    load,
)
from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext, RenderError, render_router_json
from builder.render.repository import render_files
from builder.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]

REPLICATED = {
    "models": [
        {
            "name": "chat",
            "engine": "vllm",
            "model": "/m/chat",
            "instances": 2,
            "engine_args": {"max_num_seqs": 8},
        },
        {"name": "rag", "engine": "sglang", "model": "/m/rag"},
    ],
    "router": {
        "default": ["chat"],
        "fallback": {"chat": ["rag"]},
        "rules": [{"name": "docs", "match": {"task": "rag"}, "backends": ["rag"]}],
    },
    "tenants": {
        "redis": "redis://127.0.0.1:6379/0",
        "limits": {"acme": {"max_concurrent": 2}},
    },
}


def router_files(spec) -> dict[str, bytes]:
    files = render_files(RenderContext(spec, {}, {}, plan_for_spec(spec)))
    return {path: data for path, data in files.items() if path.endswith("/router.json")}


def specs():
    yield "default.yaml", load_spec(ROOT / "deploy" / "default.yaml")
    yield "cpu-fallback.yaml", load_spec(ROOT / "deploy" / "examples" / "cpu-fallback.yaml")
    yield "replicated", parse_spec(REPLICATED, "r.yaml")


@pytest.mark.parametrize("name,spec", list(specs()), ids=[n for n, _ in specs()])
def test_every_rendered_router_json_reads_back_and_writes_back_the_same_bytes(name, spec):
    files = router_files(spec)
    assert files
    for path, data in files.items():
        written = json.loads(data)
        config = RouterConfig.from_dict(written)
        assert config.to_dict() == written, path  # nothing dropped, nothing added
        assert render_router_json(config) == data, path


def test_the_builder_writes_capacity_replicas_and_engines_for_the_router():
    files = router_files(parse_spec(REPLICATED, "r.yaml"))
    router = RouterConfig.from_dict(json.loads(files["router/1/router.json"]))
    assert router.backends["chat"] == BackendConfig(
        engine="vllm",
        family="",
        tasks=(),
        speculative=False,
        adapters=(),
        policy="prefix_aware",
        capacity=8,  # one replica's max_num_seqs
        replicas=("chat__r0", "chat__r1"),
    )
    assert router.backends["rag"].capacity is None  # the spec leaves it to SGLang
    assert router.backends["rag"].engine == "sglang"
    assert router.rule("docs") is not None and router.rule("docs").backends == ("rag",)
    assert router.tenants is not None and router.tenants.redis.startswith("redis://")
    forwarder = RouterConfig.from_dict(json.loads(files["chat/1/router.json"]))
    assert list(forwarder.backends) == ["chat"] and forwarder.instances == 1
    acme = router.tenants.limits["acme"]
    assert (acme.max_concurrent, acme.requests_per_minute, acme.tier) == (2, None, "standard")
    assert router.tenants.default.priority == 1 and router.tenants.unknown == "default"
    assert router.breaker == BreakerConfig()  # the spec's defaults are the router's


def rendered() -> dict:
    files = router_files(parse_spec(REPLICATED, "r.yaml"))
    return json.loads(files["router/1/router.json"])


def _set(path: str, value):
    def change(config: dict) -> None:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return change


_DELETE = object()

DEFECTS = [
    (_set("deadline_s", _DELETE), "deadline_s: is missing"),
    (_set("deadline_s", "soon"), "deadline_s: expected a number, got str"),
    (_set("deadline_s", 0), "deadline_s: expected seconds > 0, got 0"),
    (_set("instances", 0), "instances: expected an integer >= 1, got 0"),
    (_set("max_inflight_per_backend", True), "max_inflight_per_backend: expected an integer"),
    (_set("backends.chat.capacity", 0), "backends.chat.capacity: expected an integer >= 1"),
    (_set("backends.chat.capacity", 2.5), "backends.chat.capacity: expected an integer >= 1"),
    (_set("backends.chat.engine", None), "backends.chat.engine: expected a string, got null"),
    (_set("backends.chat.replicas", "chat__r0"), "backends.chat.replicas: expected a list"),
    (_set("backends.chat.replicas", [1]), "backends.chat.replicas[0]: expected a string"),
    (_set("backends.chat.speculative", "no"), "backends.chat.speculative: expected true or false"),
    (_set("backends.chat.weight", 2), "backends.chat.weight: unknown field"),
    (_set("default", ["gone"]), "default[0]: 'gone' is not one of the backends (chat, rag)"),
    (_set("fallback.chat", ["gone"]), "fallback.chat[0]: 'gone' is not one of the backends"),
    (_set("fallback.gone", []), "fallback: 'gone' is not one of the backends"),
    (_set("rules.0.backends", ["gone"]), "rules[0].backends[0]: 'gone' is not one of"),
    (_set("rules.0.match", []), "rules[0].match: expected a JSON object, got list"),
    # A rule's match is typed too (before: any key went through, and one the policy did
    # not know was a KeyError at the first request it was asked about).
    (_set("rules.0.match.turns", 2), "rules[0].match.turns: unknown field"),
    (_set("rules.0.match.min_turns", -1), "rules[0].match.min_turns: expected an integer >= 0"),
    (_set("rules.0.match.hint", 3), "rules[0].match.hint: expected a string, got int"),
    (_set("rules.0.match.shared_prefix", "yes"), "rules[0].match.shared_prefix: expected true"),
    (_set("breaker.cooldown_s", "1"), "breaker.cooldown_s: expected a number, got str"),
    # The breaker and tenants sections are checked field by field at load, as the rest
    # (before, a missing tenants field was a KeyError at the first request or at load).
    (_set("breaker.cooldown_s", _DELETE), "breaker.cooldown_s: is missing"),
    (_set("breaker.cooldown_s", 0), "breaker.cooldown_s: expected seconds > 0, got 0"),
    (_set("breaker.error_rate", 1.5), "breaker.error_rate: expected a fraction in (0, 1]"),
    (_set("breaker.min_requests", 0.5), "breaker.min_requests: expected an integer >= 1"),
    (_set("breaker.window", 3), "breaker.window: unknown field"),
    (_set("tenants", []), "tenants: expected a JSON object, got list"),
    (_set("tenants.namespace", _DELETE), "tenants.namespace: is missing"),
    (_set("tenants.limits", _DELETE), "tenants.limits: is missing"),
    (_set("tenants.default", _DELETE), "tenants.default: is missing"),
    (_set("tenants.default.tier", _DELETE), "tenants.default.tier: is missing"),
    (_set("tenants.limits.acme.priority", _DELETE), "tenants.limits.acme.priority: is missing"),
    (_set("tenants.limits.acme.max_concurrent", 0), "tenants.limits.acme.max_concurrent: "),
    (_set("tenants.limits.acme.burst", 1), "tenants.limits.acme.burst: unknown field"),
    (_set("tenants.on_redis_error", "retry"), "tenants.on_redis_error: expected one of allow"),
    (_set("tenants.unknown", _DELETE), "tenants.unknown: is missing"),
    (_set("tenants.share_prefix_cache", "acme"), "tenants.share_prefix_cache: expected a list"),
    (_set("tenants.redis", 6379), "tenants.redis: expected a string, got int"),
    (_set("backends", None), "backends: expected a JSON object, got null"),
    (_set("surprise", 1), "surprise: unknown field (a router older than its builder?)"),
]


@pytest.mark.parametrize("change,message", DEFECTS, ids=[m.split(":")[0] for _, m in DEFECTS])
def test_a_defect_is_one_line_naming_its_field(change, message):
    config = copy.deepcopy(rendered())
    change(config)
    with pytest.raises(RouterConfigError) as caught:
        RouterConfig.from_dict(config)
    assert str(caught.value).startswith(f"router.json: {message}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_load_names_a_file_it_cannot_read_or_parse(tmp_path):
    with pytest.raises(RouterConfigError, match=r"^router\.json: cannot read .*: No such file"):
        load(str(tmp_path / "router.json"))
    (tmp_path / "router.json").write_text("{nope")
    with pytest.raises(RouterConfigError, match=r"^router\.json: not JSON: "):
        load(str(tmp_path / "router.json"))
    (tmp_path / "router.json").write_text(json.dumps(rendered()))
    assert load(str(tmp_path / "router.json")).name == "router"


def test_the_builder_refuses_to_write_what_the_router_would_refuse():
    config = RouterConfig.from_dict(rendered())
    chat = dataclasses.replace(config.backends["chat"], capacity=0)
    config = dataclasses.replace(config, backends={**config.backends, "chat": chat})
    with pytest.raises(RenderError, match=r"^router: router\.json: backends\.chat\.capacity: "):
        render_router_json(config)


def test_the_tenants_section_alone_is_checked_as_load_checks_it():
    section = rendered()["tenants"]
    assert TenantsConfig.from_dict(section) == RouterConfig.from_dict(rendered()).tenants
    del section["default"]["priority"]
    with pytest.raises(RouterConfigError, match=r"^router\.json: tenants\.default\.priority: "):
        TenantsConfig.from_dict(section)


def test_the_config_is_read_only():
    config = RouterConfig.from_dict(rendered())
    with pytest.raises(TypeError):
        config.backends["new"] = config.backends["chat"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        config.deadline_s = 1.0  # type: ignore[misc]
