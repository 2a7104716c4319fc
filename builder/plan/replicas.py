"""Which models the router addresses replica by replica, and what each replica is.

A vLLM or SGLang model with `instances: N` (N > 1) in a spec with a router becomes N
Triton models `<model>__r0` ... `<model>__r<N-1>`, one instance each: Triton's
scheduler picks an instance blindly, and a BLS call cannot name one, so the router can
only steer a conversation to the replica holding its KV cache when each replica is a
model of its own (docs/router.md, "Replicas and cache-aware routing").

Left as they are:
- models in a spec without a router: nothing chooses among their instances but Triton;
- TensorRT-LLM: its model is an ensemble of four with one `gpu_device_ids` list for all
  instances of the tensorrtllm backend (orchestrator mode), and an ensemble's graph
  cannot choose; splitting it would mean four models per replica;
- a model spanning nodes (LeaderWorkerSet): the router reaches only its own server's
  models, so it cannot address replicas on other nodes.

Pure: spec + plan in, names and per-replica plans out.
"""

from __future__ import annotations

import dataclasses

from builder.engines.traits import REPLICA_ENGINES
from builder.plan.model import ModelPlan, Plan
from builder.spec import DeploymentSpec, ModelSpec
from builder.spec.router_policy import REPLICA_SEPARATOR

# config.pbtxt parameter: the share of the server's CPU cores a replica's engine binds to
# (python_backends/vllm/cpu_binding.py reads it at load).
CPU_SHARE = "CPU_SHARE"


def replica_name(model: str, index: int) -> str:
    """The spec refuses model names of this shape (router_policy.check_model_name)."""
    return f"{model}{REPLICA_SEPARATOR}{index}"


def has_replicas(spec: DeploymentSpec, model: ModelSpec, plan: Plan) -> bool:
    return (
        spec.router is not None
        and model.engine in REPLICA_ENGINES
        and model.instances > 1
        and plan.model(model.name).nodes == 1
    )


def routed_replicas(spec: DeploymentSpec, plan: Plan) -> dict[str, tuple[str, ...]]:
    """model name → its replicas' model names, for the models rendered as replicas."""
    return {
        m.name: tuple(replica_name(m.name, i) for i in range(m.instances))
        for m in spec.models
        if has_replicas(spec, m, plan)
    }


def replica(model: ModelSpec, plan: Plan, index: int) -> tuple[ModelSpec, Plan]:
    """Replica `index` of `model` as a model of its own: one instance, taking instance
    `index` of the plan (its GPUs, its TP/PP group or its MIG slice). The plan keeps
    every other model as it was, so the memory arithmetic is the model's own."""
    name = replica_name(model.name, index)
    placed: ModelPlan = plan.model(model.name)
    instances = placed.instances[index : index + 1]  # () on the CPU: no devices to take
    models = {**plan.models, name: dataclasses.replace(placed, name=name, instances=instances)}
    return (
        dataclasses.replace(model, name=name, instances=1),
        dataclasses.replace(plan, models=models),
    )


def cpu_share(model: ModelSpec, plan: Plan, index: int) -> dict[str, str]:
    """The CPU_SHARE parameter of replica `index` of a vLLM model planned on the CPU:
    "i/N", replica i of N. The engine model turns it into cores at load, from the cores
    its process may use: the plan knows the replica count, not the serving machine's
    cores. Left to itself, vLLM's CPU build binds every engine to the same cores (one
    core of two here). Empty on GPUs (a replica's devices are its placement) and for
    SGLang (its CPU build does not start here)."""
    if model.engine != "vllm" or plan.model(model.name).kind != "cpu":
        return {}
    return {CPU_SHARE: f"{index}/{model.instances}"}
