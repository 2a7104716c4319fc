"""Replicas with tenants need Redis: a model rendered as replicas answers direct calls
through `<model>`, a router of its own, whose tenant counters would otherwise live apart
from the router's (each limit granted twice). Refused in one line, exit 2."""

from __future__ import annotations

import pytest
import yaml

from builder.cli.main import main
from builder.spec import SpecError, parse_spec

LIMITS = {"default": {"requests_per_minute": 3}}


def spec(engine="vllm", instances=2, router=True, tenants=LIMITS) -> dict:
    data = {
        "name": "x",
        "models": [
            {"name": "m", "engine": "vllm", "model": "/m", "engine_args": {"max_model_len": 512}},
            {"name": "pair", "engine": engine, "model": "/p", "instances": instances},
        ],
    }
    if router:
        data["router"] = {"default": ["m"]}
    if tenants is not None:
        data["tenants"] = tenants
    return data


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_replicas_with_local_tenant_counters_are_refused(engine):
    with pytest.raises(SpecError) as e:
        parse_spec(spec(engine), "s.yaml")
    text = str(e.value)
    assert text.startswith("s.yaml: models[1].instances: 2 replicas of 'pair'")
    assert "tenants.redis" in text and "\n" not in text


@pytest.mark.parametrize(
    "changes",
    [
        {"tenants": {**LIMITS, "redis": "redis://127.0.0.1:6379/0"}},  # shared counters
        {"tenants": None},  # no tenants to count
        {"instances": 1},  # no replicas: the router alone counts
        {"router": False, "tenants": None},  # no router: instances stay one Triton model
    ],
)
def test_accepted_where_one_process_counts_or_redis_shares(changes):
    assert parse_spec(spec(**changes), "s.yaml").models[1].instances == changes.get("instances", 2)


def test_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec("sglang")))
    before = path.read_bytes()
    assert main(["repo", "--spec", str(path), "--out", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "models[1].instances" in err[0]
    assert "Traceback" not in err[0] and path.read_bytes() == before
    assert not (tmp_path / "repo").exists()
