"""Where each model's instances run: Triton instance groups and per-instance devices.

This is the seam between the placement planner (builder.plan.planner) and the rendered
repository: every function takes the whole deployment's Plan, since all models compete
for the same GPUs. Without GPUs every instance is KIND_CPU; with GPUs, a model spanning
several devices (TP×PP > 1), on a MIG slice, or served by TensorRT-LLM is KIND_MODEL (the
engine owns its devices, as vLLM and SGLang require), else KIND_GPU.
"""

from __future__ import annotations

from builder.engines.traits import traits
from builder.plan.model import Plan
from builder.spec import ModelSpec


def instance_groups(model: ModelSpec, plan: Plan) -> list[dict]:
    """Triton instance groups. KIND_GPU lists one GPU per instance and lets Triton pass
    each instance its device; KIND_MODEL instances learn theirs from INSTANCE_DEVICES."""
    placed = plan.model(model.name)
    if placed.kind == "gpu" and placed.instances:
        gpus = [instance.devices[0] for instance in placed.instances]
        return [{"count": 1, "kind": "KIND_GPU", "gpus": gpus}]
    return [{"count": model.instances, "kind": f"KIND_{placed.kind.upper()}", "gpus": []}]


def instance_parameters(model: ModelSpec, plan: Plan) -> dict[str, str]:
    """config.pbtxt parameters that tell each KIND_MODEL instance which devices it owns:
    INSTANCE_DEVICES, one ';'-separated entry per instance, each what that instance's
    CUDA_VISIBLE_DEVICES gets (GPU ordinals "0,1", or a MIG slice "mig:GPU:PROFILE:N"
    that trident_common.devices resolves to the slice's UUID on the live box)."""
    placed = plan.model(model.name)
    if placed.kind != "model" or not placed.instances:
        return {}
    return {"INSTANCE_DEVICES": ";".join(i.visible_devices for i in placed.instances)}


def device_ids(model: ModelSpec, plan: Plan) -> list[list[int]]:
    """GPU ordinals per instance (TRT-LLM's `gpu_device_ids "0,1;2,3"`); MIG instances
    give the GPU their slice is on."""
    return [list(i.devices) for i in plan.model(model.name).instances]


def parallel_engine_args(model: ModelSpec, plan: Plan) -> dict[str, int]:
    """The TP/PP the plan chose, spelled as the engine's own arguments (none for an
    engine built for its TP × PP)."""
    placed = plan.model(model.name)
    if placed.kind == "cpu":
        return {}
    return traits(model.engine).parallel_args(placed.tp, placed.pp)


def kubernetes_resources(model: ModelSpec, plan: Plan) -> dict[str, int]:
    """Extended resources one instance's pod requests (`nvidia.com/gpu: 2`,
    `nvidia.com/mig-3g.40gb: 1`); empty on the CPU."""
    return plan.model(model.name).kubernetes_resources
