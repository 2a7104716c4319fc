"""`trident k8s` with a model rendered as replicas (builder/plan/replicas.py): its
replicas and its forwarder run in the router's pod and are loaded with it; the pod's GPU
resources are the plan's, summed over the model's instances as before."""

from __future__ import annotations

import yaml

from builder.k8s import render
from builder.k8s.workloads import Options
from builder.plan.planner import plan_for_spec
from builder.spec import load_spec

SPEC = {
    "name": "mixed",
    "hardware": {"gpu": "H100-80GB", "count": 8, "nodes": 3},
    "models": [
        {
            "name": "big",
            "engine": "vllm",
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "engine_args": {
                "tensor_parallel_size": 8,
                "pipeline_parallel_size": 2,
                "distributed_executor_backend": "ray",
                "max_model_len": 8192,
                "max_num_seqs": 16,
            },
        },
        {
            "name": "small",
            "engine": "sglang",
            "model": "meta-llama/Meta-Llama-3-8B-Instruct",
            "instances": 2,
            "engine_args": {"context_length": 4096, "max_running_requests": 16},
        },
    ],
    "router": {"default": ["small"]},
}


def _server(tmp_path) -> dict:
    path = tmp_path / "mixed.yaml"  # the pod's ConfigMap carries the file
    path.write_text(yaml.safe_dump(SPEC))
    spec = load_spec(path)
    files = render.manifests(spec, plan_for_spec(spec), Options())
    return files["statefulset-server.yaml"][0]


def test_the_server_pod_loads_the_replicas_before_the_router(tmp_path):
    pod = _server(tmp_path)["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    loaded = [command[i + 1] for i, arg in enumerate(command) if arg == "--load-model"]
    # With a model spanning nodes the pod names what it loads: a model with replicas
    # is its replicas and its forwarder (`trident serve` orders them by dependency).
    assert loaded == ["small__r0", "small__r1", "small", "router"]
    # One GPU per replica, as one per instance before: the plan's, summed.
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
