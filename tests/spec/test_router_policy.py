"""`router.policy`, `router.backend_policies` and `router.rules[].policy` (how the router
chooses among a backend's replicas), and model names that a replica could take, refused
in one line with exit 2 (builder/spec/router_policy.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from builder.cli.main import main
from builder.spec import SpecError, parse_spec
from builder.spec.schema import deployment_schema

MODEL = {"name": "m", "engine": "vllm", "model": "/m", "engine_args": {"max_model_len": 512}}
BASE = {"name": "x", "models": [MODEL, {**MODEL, "name": "n"}]}


def spec_data(router=None, name="m"):
    return {
        **BASE,
        "models": [{**MODEL, "name": name}, {**MODEL, "name": "n"}],
        "router": {"default": [name], **(router or {})},
    }


def test_defaults_to_prefix_aware():
    router = parse_spec(spec_data(), "s.yaml").router
    assert router.policy == "prefix_aware" and dict(router.backend_policies) == {}


def test_policy_per_router_backend_and_rule():
    router = parse_spec(
        spec_data(
            {
                "policy": "least_loaded",
                "backend_policies": {"n": "round_robin"},
                "rules": [
                    {
                        "name": "r",
                        "match": {"task": "chat"},
                        "backends": ["m"],
                        "policy": "round_robin",
                    }
                ],
            }
        ),
        "s.yaml",
    ).router
    assert router.policy == "least_loaded"
    assert dict(router.backend_policies) == {"n": "round_robin"}
    assert router.rules[0].policy == "round_robin"


@pytest.mark.parametrize(
    "router, field, reason",
    [
        ({"policy": "random"}, "router.policy", "'random' is not one of round_robin"),
        (
            {"backend_policies": {"zz": "round_robin"}},
            "router.backend_policies.zz",
            "'zz' is not a model",
        ),
        (
            {"backend_policies": {"n": "fastest"}},
            "router.backend_policies.n",
            "'fastest' is not one of",
        ),
        (
            {"rules": [{"backends": ["m"], "policy": 3}]},
            "router.rules[0].policy",
            "expected a string",
        ),
    ],
)
def test_bad_policies_name_the_field(router, field, reason):
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data(router), "s.yaml")
    assert f"{field}: " in str(e.value) and reason in str(e.value)


@pytest.mark.parametrize("name", ["m__r0", "chat__r12"])
def test_a_model_named_like_a_replica_is_refused(name):
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data(name=name), "s.yaml")
    assert "models[0].name" in str(e.value) and "__r<digits>" in str(e.value)
    # Names that only look alike cannot collide with a replica's: they are kept.
    for kept in ("m__r", "m__rx", "m_r0", "r0", f"{name}x"):
        assert parse_spec(spec_data(name=kept), "s.yaml").models[0].name == kept


def test_a_router_named_like_a_replica_is_refused():
    with pytest.raises(SpecError) as e:
        parse_spec(spec_data({"name": "m__r1"}), "s.yaml")
    assert "router.name" in str(e.value)


def test_the_schema_refuses_what_the_parser_refuses():
    schema = deployment_schema()
    jsonschema.validate(spec_data({"policy": "round_robin"}), schema)
    for bad in (
        spec_data(name="m__r0"),
        spec_data({"policy": "random"}),
        spec_data({"backend_policies": {"n": "fastest"}}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_cli_refuses_a_replica_name_in_one_line_with_exit_2(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec_data(name="m__r0")))  # JSON is YAML, without aliases
    before = path.read_bytes()
    assert main(["repo", "--spec", str(path), "--out", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "models[0].name" in err[0]
    assert "Traceback" not in err[0] and path.read_bytes() == before
    assert not (tmp_path / "repo").exists()
