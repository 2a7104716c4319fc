"""The spec's `tenants:` section: parsing, one-line errors naming the field, the JSON
Schema, and what reaches the rendered repository (no secret; vLLM's priority policy)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from builder.spec import SpecError, parse_spec
from builder.spec.schema import deployment_schema
from tests.helpers.servers import render

BASE = {
    "models": [{"name": "llm", "engine": "vllm", "model": "/m/llm"}],
    "router": {"default": ["llm"]},
    "tenants": {
        "redis": "redis://127.0.0.1:6379/0",
        "password_env": "TRIDENT_REDIS_PASSWORD",
        "on_redis_error": "deny",
        "default": {
            "tier": "standard",
            "requests_per_minute": 600,
            "tokens_per_minute": 200000,
            "max_concurrent": 32,
        },
        "limits": {"alice": {"tier": "premium", "requests_per_minute": 3}, "bob": {}},
        "unknown": "reject",
        "share_prefix_cache": ["trusted-team"],
    },
}


def spec_with(**tenants):
    data = copy.deepcopy(BASE)
    data["tenants"].update(tenants)
    return data


def error_of(data):
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "t.yaml")
    return str(caught.value)


def test_a_tenant_overrides_the_default_field_by_field():
    tenants = parse_spec(BASE, "t.yaml").tenants
    alice, bob = tenants.limits["alice"], tenants.limits["bob"]
    assert (
        alice.tier,
        alice.requests_per_minute,
        alice.tokens_per_minute,
        alice.max_concurrent,
    ) == ("premium", 3, 200000, 32)
    assert bob == tenants.default
    assert tenants.on_redis_error == "deny" and tenants.unknown == "reject"
    assert parse_spec({k: v for k, v in BASE.items() if k != "tenants"}).tenants is None


@pytest.mark.parametrize(
    "change, field, reason",
    [
        ({"colour": 1}, "tenants.colour", "unknown key"),
        ({"on_redis_error": "maybe"}, "tenants.on_redis_error", "is not one of allow, deny"),
        ({"unknown": "allow"}, "tenants.unknown", "is not one of default, reject"),
        (
            {"default": {"requests_per_minute": 0}},
            "tenants.default.requests_per_minute",
            "must be >= 1",
        ),
        (
            {"limits": {"alice": {"tokens_per_minute": "lots"}}},
            "tenants.limits.alice.tokens_per_minute",
            "expected an integer",
        ),
        ({"limits": {"alice": {"tier": "gold"}}}, "tenants.limits.alice.tier", "is not one of"),
        ({"limits": {"al ice": {}}}, "tenants.limits.al ice", "tenant name"),
        ({"redis": "http://cache:6379"}, "tenants.redis", "is not a redis://"),
        ({"redis": "redis://cache:99999"}, "tenants.redis", "port 99999"),
        ({"password_env": "1BAD"}, "tenants.password_env", "environment variable name"),
        ({"password_file": "/run/secrets/redis"}, "tenants.password_file", "not both"),
        ({"share_prefix_cache": ["ok", "no way"]}, "tenants.share_prefix_cache[1]", "tenant name"),
    ],
)
def test_bad_sections_name_the_field(change, field, reason):
    message = error_of(spec_with(**change))
    assert message.startswith(f"t.yaml: {field}: ") and reason in message
    assert "\n" not in message


def test_a_password_in_the_url_is_refused_and_never_echoed():
    message = error_of(spec_with(redis="redis://:hunter2@cache:6379/0"))
    assert message.startswith("t.yaml: tenants.redis: must not hold a password")
    assert "hunter2" not in message


@pytest.mark.parametrize(
    "url, reason",
    [
        ("redis://cache:6379/hunter2", "the db (after the host's '/') is not a number"),
        ("redis://cache/hunter2", "the db (after the host's '/') is not a number"),
        ("redis://[::1]:6379/hunter2", "the db (after the host's '/') is not a number"),
        ("redis://cache:6379/100", "the db (after the host's '/') is not a number"),
        ("redis://[::1]:70000/0", "port 70000 is not in 1..65535"),
        ("redis://cache:0", "port 0 is not in 1..65535"),
        ("redis://cache:hunter2/0", "is not a redis://host[:port][/db] URL"),
    ],
)
def test_a_bad_redis_url_gets_its_own_reason_without_echo(url, reason):
    # Before: a db that is not a number was blamed on the port ("port 6379 is not in
    # 1..65535"), and the port of a bracketed IPv6 host was never named.
    message = error_of(spec_with(redis=url))
    assert message.startswith("t.yaml: tenants.redis: ") and reason in message, message
    assert "hunter2" not in message and "\n" not in message
    if "port" not in reason:
        assert "port" not in message, message


def test_tenants_need_a_router():
    data = copy.deepcopy(BASE)
    del data["router"]
    assert error_of(data).startswith("t.yaml: tenants: needs a router")


def test_the_schema_covers_the_section():
    schema = deployment_schema()
    jsonschema.validate(BASE, schema)
    for bad in (
        spec_with(unknown="allow"),
        spec_with(colour=1),
        spec_with(limits={"alice": {"requests_per_minute": 0}}),
        spec_with(limits={"alice": {"tier": "gold"}}),
        spec_with(redis="redis://:pw@cache:6379"),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_the_rendered_repository_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENT_REDIS_PASSWORD", "s3cret-value")
    repo = render(BASE, tmp_path / "repo")
    texts = [p.read_bytes() for p in repo.rglob("*") if p.is_file()]
    assert not any(b"s3cret-value" in t for t in texts)
    config = json.loads((repo / "router" / "1" / "router.json").read_text())
    assert config["tenants"]["password_env"] == "TRIDENT_REDIS_PASSWORD"
    assert config["tenants"]["limits"]["alice"]["priority"] == 0
    # Tiers differ: vLLM schedules by priority.
    args = json.loads((repo / "llm" / "1" / "model.json").read_text())
    assert args["scheduling_policy"] == "priority"


def test_one_tier_leaves_vllm_scheduling_alone(tmp_path):
    data = spec_with(limits={"bob": {}})
    repo = render(data, tmp_path / "repo")
    assert "scheduling_policy" not in json.loads((repo / "llm" / "1" / "model.json").read_text())
