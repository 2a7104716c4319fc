"""A vLLM or SGLang model with several instances behind a router renders one Triton
model per instance (`<model>__rN`, one instance each, on that instance's devices) and
`<model>` itself as the router's code over its replicas; router.json names the replicas
with their policy and capacity (builder/render/replicas.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import parse_config, validate_repository
from builder.render.write import write_repository
from builder.serve import loading
from builder.spec import parse_spec

GROUP = model_config_pb2.ModelInstanceGroup
# SmolLM2-135M by its hub id: the planner knows its shape, no file is read.
CHAT = {
    "name": "chat",
    "engine": "vllm",
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "instances": 2,
    "engine_args": {"max_model_len": 2048, "max_num_seqs": 8},
}
ONE = {
    "name": "one",
    "engine": "sglang",
    "model": "/models/one",
    "engine_args": {"context_length": 1024},
}


def render(tmp_path: Path, models=(CHAT, ONE), router=None, hardware=None) -> Path:
    data = {"name": "x", "models": list(models), "router": {"default": ["chat"], **(router or {})}}
    if hardware:
        data["hardware"] = hardware
    spec = parse_spec(data, "test.yaml")
    out = tmp_path / "repo"
    write_repository(
        render_files(RenderContext(spec, {}, {}, plan_for_spec(spec))), out, validate_repository
    )
    return out


def router_json(repo: Path, name: str = "router") -> dict:
    return json.loads((repo / name / "1" / "router.json").read_text())


def test_each_replica_is_one_instance_on_its_own_gpu(tmp_path):
    repo = render(tmp_path, models=(CHAT,), hardware={"gpu": "H100-80GB", "count": 2})
    for index in (0, 1):
        config = parse_config(repo / f"chat__r{index}" / "config.pbtxt")
        assert config.name == f"chat__r{index}"
        assert [(g.count, g.kind, list(g.gpus)) for g in config.instance_group] == [
            (1, GROUP.KIND_GPU, [index])
        ]
        args = json.loads((repo / f"chat__r{index}" / "1" / "model.json").read_text())
        assert args["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert args["max_num_seqs"] == 8
    assert not (repo / "chat__r2").exists()
    # Without a router nothing would choose among replicas: the model stays one.
    spec = parse_spec({"name": "x", "models": [CHAT]}, "test.yaml")
    files = render_files(RenderContext(spec, {}, {}, plan_for_spec(spec)))
    assert "chat/1/model.json" in files and not any("__r" in p for p in files)


def test_router_json_lists_replicas_policy_and_capacity(tmp_path):
    repo = render(tmp_path)
    # A one-instance model stays one model: nothing to choose between.
    assert not (repo / "one__r0").exists() and (repo / "one" / "1" / "model.json").is_file()
    backends = router_json(repo)["backends"]
    assert backends["chat"]["replicas"] == ["chat__r0", "chat__r1"]
    assert backends["chat"]["policy"] == "prefix_aware"  # the default
    assert backends["chat"]["capacity"] == 8  # max_num_seqs, per replica
    assert "replicas" not in backends["one"]
    assert backends["one"]["capacity"] is None  # the engine's own default


def test_policy_per_router_backend_and_rule(tmp_path):
    repo = render(
        tmp_path,
        router={
            "policy": "least_loaded",
            "backend_policies": {"chat": "round_robin"},
            "rules": [
                {
                    "name": "rr",
                    "match": {"hint": "rr"},
                    "backends": ["chat"],
                    "policy": "prefix_aware",
                },
                {"name": "plain", "match": {"hint": "plain"}, "backends": ["one"]},
            ],
        },
    )
    config = router_json(repo)
    assert config["backends"]["chat"]["policy"] == "round_robin"
    assert config["backends"]["one"]["policy"] == "least_loaded"
    assert [(r["name"], r["policy"]) for r in config["rules"]] == [
        ("rr", "prefix_aware"),
        ("plain", None),
    ]


def test_the_model_itself_is_the_router_code_over_its_replicas(tmp_path, root):
    repo = render(tmp_path)
    assert (repo / "chat" / "1" / "bls" / "model.py").read_bytes() == (
        (root / "bls/model.py").read_bytes()
    )
    assert (
        "from bls.model import TritonPythonModel" in (repo / "chat" / "1" / "model.py").read_text()
    )
    config = parse_config(repo / "chat" / "config.pbtxt")
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, GROUP.KIND_CPU)]
    assert "route" in {t.name for t in config.input}  # the router's inputs
    forwarder = router_json(repo, "chat")
    assert forwarder["name"] == "chat" and forwarder["instances"] == 1
    assert list(forwarder["backends"]) == ["chat"]
    assert forwarder["backends"]["chat"] == router_json(repo)["backends"]["chat"]
    # A direct call names the model: no rule or fallback may send it elsewhere.
    assert forwarder["default"] == ["chat"]
    assert forwarder["rules"] == [] and forwarder["fallback"] == {}


def test_replicas_load_before_the_router_and_the_forwarder(tmp_path):
    repo = render(tmp_path, router={"fallback": {"chat": ["one"]}})
    depends = loading.dependencies(repo)
    assert depends["chat"] == {"chat__r0", "chat__r1"}
    assert depends["router"] >= {"chat", "chat__r0", "chat__r1", "one"}
    order = loading.load_order(depends, depends)
    assert order.index("chat__r1") < order.index("chat") < order.index("router")


def test_a_missing_replica_fails_validation(tmp_path):
    repo = render(tmp_path)
    for path in sorted((repo / "chat__r1").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (repo / "chat__r1").rmdir()
    problems = validate_repository(repo)
    assert any("'chat__r1' is not a model of this repository" in p for p in problems)


def test_a_tensor_parallel_replica_owns_its_group(tmp_path):
    chat = {
        **CHAT,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "engine_args": {**CHAT["engine_args"], "tensor_parallel_size": 2},
    }
    repo = render(tmp_path, models=(chat,), hardware={"gpu": "H100-80GB", "count": 4})
    for index, devices in enumerate(["0,1", "2,3"]):
        config = parse_config(repo / f"chat__r{index}" / "config.pbtxt")
        assert [(g.count, g.kind) for g in config.instance_group] == [(1, GROUP.KIND_MODEL)]
        assert config.parameters["INSTANCE_DEVICES"].string_value == devices
        args = json.loads((repo / f"chat__r{index}" / "1" / "model.json").read_text())
        assert args["tensor_parallel_size"] == 2


def test_on_the_cpu_each_vllm_replica_takes_its_own_share_of_cores(tmp_path):
    """vLLM's CPU build would bind both replicas' compute to the same core: each replica
    carries its share ("i/N") for cpu_binding.py to turn into cores at load."""
    three = {**CHAT, "instances": 3}
    sglang = {**ONE, "name": "sg", "instances": 2}
    repo = render(tmp_path, models=(three, sglang), hardware={"gpu": "cpu"})
    for index in range(3):
        config = parse_config(repo / f"chat__r{index}" / "config.pbtxt")
        assert [g.kind for g in config.instance_group] == [GROUP.KIND_CPU]
        assert config.parameters["CPU_SHARE"].string_value == f"{index}/3"
        assert config.parameters["REPORT_CUSTOM_METRICS"].string_value == "true"
    for index in range(2):  # SGLang's CPU build does not start here: nothing to bind
        config = parse_config(repo / f"sg__r{index}" / "config.pbtxt")
        assert "CPU_SHARE" not in config.parameters
    # On GPUs a replica's devices are its placement: no CPU share.
    gpu = render(tmp_path / "gpu", models=(CHAT,), hardware={"gpu": "H100-80GB", "count": 2})
    for index in (0, 1):
        assert "CPU_SHARE" not in parse_config(gpu / f"chat__r{index}" / "config.pbtxt").parameters
