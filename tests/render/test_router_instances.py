"""The router's instance count reaches its rendered config.pbtxt (instance_group count,
KIND_CPU) and router.json; a backend's in-flight limit is the router's as a whole,
whatever its instance count (bls/inflight.py shares the counts)."""

from __future__ import annotations

import json
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from bls.inbound import inflight_limit
from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import parse_config, validate_repository
from builder.render.write import write_repository
from builder.spec import parse_spec

CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU
MODEL = {
    "name": "m",
    "engine": "vllm",
    "model": "/m",
    "engine_args": {"max_model_len": 512},
    "placement": {"kind": "cpu"},
}


def rendered(tmp_path: Path, hardware=None, router=None) -> tuple:
    data = {"name": "x", "models": [MODEL], "router": {"default": ["m"], **(router or {})}}
    if hardware:
        data["hardware"] = hardware
    spec = parse_spec(data, "test.yaml")
    write_repository(
        render_files(RenderContext(spec, {}, {}, plan_for_spec(spec))),
        tmp_path / "repo",
        validate_repository,
    )
    config = parse_config(tmp_path / "repo" / "router" / "config.pbtxt")
    router_json = json.loads((tmp_path / "repo" / "router" / "1" / "router.json").read_text())
    return config.instance_group, router_json


def test_cpu_target_renders_one_instance(tmp_path):
    groups, router_json = rendered(tmp_path)
    assert [(g.count, g.kind) for g in groups] == [(1, CPU)]
    assert router_json["instances"] == 1


def test_gpu_target_renders_the_derived_count(tmp_path):
    groups, router_json = rendered(tmp_path, {"gpu": "H100-80GB", "count": 2})
    assert [(g.count, g.kind) for g in groups] == [(4, CPU)]
    assert router_json["instances"] == 4


def test_explicit_count_is_rendered(tmp_path):
    groups, router_json = rendered(tmp_path, router={"instances": 3})
    assert [g.count for g in groups] == [3] and router_json["instances"] == 3


def test_a_backends_limit_is_the_whole_routers():
    # The spec's 256, capped at twice an engine running 32: 64 for the whole router,
    # not split over its instances (they share their counts).
    assert inflight_limit(256, 32) == 64
    assert inflight_limit(10, None) == 10
