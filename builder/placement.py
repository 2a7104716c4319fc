"""Where each model's instances run: Triton instance groups and per-instance devices.

This is the seam between the placement planner and the rendered repository. Without GPUs
every instance is KIND_CPU; with GPUs, a model spanning several devices (TP×PP > 1) is
KIND_MODEL (the engine owns its devices, as vLLM and SGLang require), else KIND_GPU.
"""
from __future__ import annotations

from builder.spec import HardwareSpec, ModelSpec


def world_size(model: ModelSpec) -> int:
    args = model.engine_args
    tp = args.get("tensor_parallel_size", args.get("tp_size", 1))
    pp = args.get("pipeline_parallel_size", args.get("pp_size", 1))
    return int(tp) * int(pp)


def instance_kind(model: ModelSpec, hardware: HardwareSpec) -> str:
    kind = model.placement.kind
    if kind == "auto":
        if hardware.gpu == "cpu":
            kind = "cpu"
        else:
            kind = "model" if world_size(model) > 1 or model.placement.mig else "gpu"
    return kind


def instance_groups(model: ModelSpec, hardware: HardwareSpec) -> list[dict]:
    kind = instance_kind(model, hardware)
    gpus = list(model.placement.devices) if kind == "gpu" else []
    return [{"count": model.instances, "kind": f"KIND_{kind.upper()}", "gpus": gpus}]


def instance_parameters(model: ModelSpec, hardware: HardwareSpec) -> dict[str, str]:
    """config.pbtxt parameters that tell each instance which devices it owns."""
    if instance_kind(model, hardware) == "model" and model.placement.devices:
        return {"GPU_DEVICE_IDS": ",".join(map(str, model.placement.devices))}
    return {}
