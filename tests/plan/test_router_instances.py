"""The router's instance count: the spec's `router.instances`, else the default for the
host the spec targets (builder/plan/router_instances.py), and `trident plan` shows it."""

from __future__ import annotations

import pytest
import yaml

from builder.cli.main import main
from builder.plan.router_instances import MAX_DEFAULT, PER_GPU, router_instances
from builder.spec import parse_spec

MODELS = [
    {
        "name": "m",
        "engine": "vllm",
        "model": "/m",
        "engine_args": {"max_model_len": 512},
        "placement": {"kind": "cpu"},
    }
]


def spec(hardware=None, router=None, tenants=None):
    data = {"name": "x", "models": MODELS, "router": {"default": ["m"], **(router or {})}}
    if hardware:
        data["hardware"] = hardware
    if tenants is not None:
        data["tenants"] = tenants
    return parse_spec(data, "s.yaml")


def test_no_router_no_count():
    assert router_instances(parse_spec({"models": MODELS}, "s.yaml")) is None


def test_cpu_host_gets_one_instance():
    assert router_instances(spec()).count == 1


@pytest.mark.parametrize("gpus, expected", [(1, 2), (2, 4), (4, 8), (8, 8), (64, 8)])
def test_gpu_host_gets_two_per_gpu_capped(gpus, expected):
    got = router_instances(spec({"gpu": "H100-80GB", "count": gpus}))
    assert got.count == expected == min(PER_GPU * gpus, MAX_DEFAULT)
    assert f"{gpus}x H100-80GB" in got.why


def test_an_explicit_count_wins_over_the_default():
    assert router_instances(spec({"gpu": "H100-80GB", "count": 8}, {"instances": 3})).count == 3
    assert router_instances(spec(router={"instances": 5})).count == 5


def test_tenants_without_redis_default_to_one_instance():
    # Each instance would count a tenant on its own: the default stays 1 there ...
    local = spec({"gpu": "H100-80GB", "count": 8}, tenants={"default": {}})
    assert router_instances(local).count == 1
    # ... and follows the host once the counters are shared in Redis.
    shared = spec({"gpu": "H100-80GB", "count": 8}, tenants={"redis": "redis://h:6379/0"})
    assert router_instances(shared).count == 8


def test_trident_plan_shows_the_count(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "x",
                "hardware": {"gpu": "H100-80GB", "count": 2},
                "models": [{**MODELS[0]}],
                "router": {"default": ["m"]},
            }
        )
    )
    assert main(["plan", "--spec", str(path)]) == 0
    out = capsys.readouterr().out
    assert "router: router, 4 instance(s) KIND_CPU (default: 2 per GPU" in out
