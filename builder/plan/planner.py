"""Which GPUs (or MIG slices) each model's instances run on, and with which TP × PP.

`plan_deployment` is pure: spec + topology + a model-shape loader → Plan. All models
compete for the node's GPUs, so the plan is made for the whole spec at once, in spec
order: models on whole GPUs first (each instance gets the smallest TP that fits its
target batch and context, on the fastest-linked free GPUs; pipeline stages across such
groups only when tensor parallelism alone cannot fit), then models on MIG slices, packed
onto the GPUs left over. Anything that cannot be laid out raises PlacementError saying
how much memory is missing, or SpecError for a field that makes no sense.

`plan_for_spec` is the I/O around it (reads the topology file or nvidia-smi, and
config.json of local models).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, overload

from builder.engines.traits import traits
from builder.errors import TridentError
from builder.plan import memory, mig
from builder.plan import topology as topo
from builder.plan.gpus import GPU_TYPES, GpuType, MigProfile
from builder.plan.limits import check_context_lengths
from builder.plan.model import InstancePlacement, ModelPlan, Plan
from builder.spec import DeploymentSpec, ModelSpec, SpecError
from builder.spec.trtllm import BuildSettings, serving_profile

DEFAULT_UTILIZATION = 0.9  # share of a GPU's memory an engine may take
DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_CONTEXT = 4096  # capped by the model's own max_position_embeddings

ShapeLoader = Callable[[str], memory.ModelShape]


class PlacementError(TridentError):
    """The models do not fit the hardware; the message says by how much."""


# ---------------------------------------------------------------------------------------
# What a model asks for


# TensorRT-LLM quantization (builder.spec.trtllm) → the weight precision it stores.
_TRTLLM_WEIGHTS = {
    "fp8": "fp8",
    "int8-sq": "int8",
    "int8-wo": "int8",
    "int4-wo": "int4",
    "int4-awq": "int4",
    "w4a8-awq": "int4",
}


def _trtllm_build(model: ModelSpec):

    return model.extra.get("build") or BuildSettings()


def explicit_parallelism(model: ModelSpec) -> tuple[int | None, int | None]:
    """TP and PP the spec fixes: the engine's own arguments, or for an engine compiled
    for one TP × PP (TensorRT-LLM) its `build:` section."""
    engine = traits(model.engine)
    if engine.built:
        build = _trtllm_build(model)
        return build.tp_size, build.pp_size
    return engine.parallelism(model.engine_args)


def _arg(model: ModelSpec, name: str | None):
    """An engine argument the spec sets, by its role's name (None: no such argument)."""
    return model.engine_args.get(name) if name is not None else None


def _weight_dtype(model: ModelSpec) -> str:
    if model.placement.dtype:
        return model.placement.dtype
    if traits(model.engine).built:
        build = _trtllm_build(model)
        return _TRTLLM_WEIGHTS.get(build.quantization, build.dtype)
    quant = model.engine_args.get("quantization")
    if quant and quant.lower() in memory.DTYPE_BYTES:
        return quant
    return model.engine_args.get("dtype", "auto")


def _kv_dtype(model: ModelSpec) -> str:
    engine = traits(model.engine)
    if engine.built:
        value = _trtllm_build(model).kv_cache_dtype
    else:
        value = _arg(model, engine.kv_cache_dtype_arg)
    return value if value and value.lower() in memory.DTYPE_BYTES else "auto"


def _targets(model: ModelSpec) -> tuple[int | None, int | None]:
    """Max batch and context from the engine's own settings; a built engine's serving
    profile fills in what its arguments leave out."""
    engine = traits(model.engine)
    batch, context = _arg(model, engine.batch_arg), _arg(model, engine.context_arg)
    if not engine.built or "profiles" not in model.extra:
        return batch, context
    profile = serving_profile(model.extra)
    return batch or profile.max_batch_size, context or profile.max_seq_len


def workload(model: ModelSpec, shape: memory.ModelShape, where: str) -> memory.Workload:
    batch, context = _targets(model)
    batch = model.placement.max_batch or batch or DEFAULT_MAX_BATCH
    context = model.placement.max_context or context or min(DEFAULT_MAX_CONTEXT, shape.max_context)
    try:
        weight = memory.dtype_bytes(_weight_dtype(model), f"{where}.placement.dtype")
    except ValueError as e:
        raise PlacementError(str(e)) from None
    kv_bytes = _arg(model, traits(model.engine).kv_cache_bytes_arg)
    return memory.Workload(
        weight, memory.DTYPE_BYTES[_kv_dtype(model).lower()], batch, context, kv_bytes
    )


def utilization(model: ModelSpec) -> float:
    share = _arg(model, traits(model.engine).memory_arg)
    return float(share if share is not None else DEFAULT_UTILIZATION)


# ---------------------------------------------------------------------------------------
# Planning


@dataclass
class _State:
    """Mutable bookkeeping of one planning pass."""

    gpu: GpuType
    topology: topo.Topology
    free: list[int]


def plan_deployment(
    spec: DeploymentSpec, topology: topo.Topology | None, load_shape: ShapeLoader
) -> Plan:
    hardware = spec.hardware
    if hardware.gpu == "cpu":
        return Plan(None, 0, None, {m.name: _without_gpus(m) for m in spec.models})
    gpu = GPU_TYPES[hardware.gpu]
    topology = topology or topo.uniform_topology(hardware.count)
    state = _State(gpu, topology, list(range(hardware.count)))
    plans: dict[str, ModelPlan] = {}
    indexed = list(enumerate(spec.models))
    spanning = {m.name for m in spec.models if _spans_nodes(m, hardware.count)}
    for i, model in indexed:
        if model.name in spanning:
            plans[model.name] = _plan_multi_node(spec, i, model, gpu, load_shape)
    whole = sum(plans[name].nodes * spec.model(name).instances for name in spanning)
    if whole + (len(spanning) < len(spec.models)) > hardware.nodes:
        raise PlacementError(
            f"models spanning nodes take {whole} whole node(s), the others "
            f"one more; hardware.nodes is {hardware.nodes}"
        )
    for i, model in indexed:
        if not model.placement.mig and model.name not in spanning:
            plans[model.name] = _plan_whole_gpus(spec, i, model, state, load_shape)
    mig_models = [(i, m) for i, m in indexed if m.placement.mig]
    layouts = _plan_mig(spec, mig_models, state, load_shape, plans) if mig_models else {}
    ordered = {m.name: plans[m.name] for m in spec.models}
    return Plan(gpu, hardware.count, topology, ordered, layouts)


def _spans_nodes(model: ModelSpec, per_node: int) -> bool:
    tp, pp = explicit_parallelism(model)  # explicit TP×PP over one node's GPUs
    return (tp or 1) * (pp or 1) > per_node


def _plan_multi_node(
    spec: DeploymentSpec, i: int, model: ModelSpec, gpu: GpuType, load_shape: ShapeLoader
) -> ModelPlan:
    """Each instance takes whole nodes, a TP group inside one node, pipeline stages
    filling the nodes in order; devices: the GPUs of each node (0..count-1)."""
    where = f"models[{i}]"
    hardware = spec.hardware
    tp, pp = explicit_parallelism(model)
    tp, pp = tp or 1, pp or 1
    per_node = hardware.count
    if hardware.nodes == 1:
        raise PlacementError(
            f"{model.name}: TP×PP {tp}×{pp} needs {tp * pp} GPUs, the node "
            f"has {per_node} (set hardware.nodes to span nodes)"
        )
    placement = model.placement
    if placement.mig or placement.devices or placement.kind in ("cpu", "gpu"):
        raise SpecError(
            spec.file,
            f"{where}.placement",
            "a model spanning nodes takes "
            "whole nodes as KIND_MODEL: no mig, devices, kind cpu or gpu",
        )
    if per_node % tp or (tp * pp) % per_node:
        raise SpecError(
            spec.file,
            where,
            f"TP×PP {tp}×{pp} does not fill whole nodes of "
            f"{per_node} GPUs with each TP group inside one node",
        )
    nodes = tp * pp // per_node
    if nodes * model.instances > hardware.nodes:
        raise PlacementError(
            f"{model.name}: {model.instances} instance(s) × {nodes} nodes "
            f"= {nodes * model.instances} nodes; hardware.nodes is "
            f"{hardware.nodes}"
        )
    shape = _shape(spec, i, model, load_shape, required=True)
    usable = gpu.memory_gib * utilization(model)
    need = memory.per_gpu_need(shape, workload(model, shape, where), tp, pp)
    if need.total_gib > usable:
        raise PlacementError(_missing(model, tp, pp, need, usable, gpu.name))
    return ModelPlan(
        model.name,
        model.engine,
        "model",
        tp,
        pp,
        (InstancePlacement(tuple(range(per_node))),) * model.instances,
        None,
        need,
        usable,
        "-",
        nodes,
    )


def _without_gpus(model: ModelSpec) -> ModelPlan:
    """hardware.gpu: cpu. An explicit placement kind is kept as written (the devices,
    if any, are the user's to vouch for); auto means the CPU."""
    kind = "cpu" if model.placement.kind == "auto" else model.placement.kind
    instances = (
        tuple(InstancePlacement((d,)) for d in model.placement.devices) if kind == "gpu" else ()
    )
    return ModelPlan(model.name, model.engine, kind, instances=instances)


def _model_ref(model: ModelSpec) -> str:
    """Where the model's size facts are: `model:`, else TRT-LLM's Hugging Face folder."""
    checkpoint = model.extra.get("checkpoint")
    if not model.model and checkpoint is not None and checkpoint.hf_model:
        return checkpoint.hf_model
    return model.model


# Overloaded so that a required shape reads as present: with required=True a missing
# one raises SpecError instead of returning None.
@overload
def _shape(
    spec: DeploymentSpec, i: int, model: ModelSpec, load_shape: ShapeLoader, required: Literal[True]
) -> memory.ModelShape: ...
@overload
def _shape(
    spec: DeploymentSpec, i: int, model: ModelSpec, load_shape: ShapeLoader, required: bool
) -> memory.ModelShape | None: ...
def _shape(
    spec: DeploymentSpec, i: int, model: ModelSpec, load_shape: ShapeLoader, required: bool
) -> memory.ModelShape | None:
    try:
        return load_shape(_model_ref(model))
    except memory.UnknownModelSize as e:
        if not required and not isinstance(e, memory.BadModelConfig):
            return None
        raise SpecError(
            spec.file,
            f"models[{i}].model",
            f"{e} (or pin it with placement.devices and an explicit tensor parallel size)",
        ) from None


def _plan_whole_gpus(
    spec: DeploymentSpec, i: int, model: ModelSpec, state: _State, load_shape: ShapeLoader
) -> ModelPlan:
    if model.placement.kind == "cpu":
        return ModelPlan(model.name, model.engine, "cpu")
    where = f"models[{i}]"
    tp, pp = explicit_parallelism(model)
    pinned = bool(model.placement.devices)
    shape = _shape(spec, i, model, load_shape, required=not (pinned and tp))
    usable = state.gpu.memory_gib * utilization(model)
    if pinned:
        groups, tp, pp = _pinned_groups(spec, where, model, state, tp, pp)
    else:
        assert shape is not None  # unpinned: required=True above, so _shape raised instead
        groups, tp, pp = _choose_groups(model, shape, state, usable, tp, pp, where)
    need = memory.per_gpu_need(shape, workload(model, shape, where), tp, pp) if shape else None
    if need is not None and need.total_gib > usable:
        raise PlacementError(_missing(model, tp, pp, need, usable, state.gpu.name))
    kind = model.placement.kind
    if kind == "gpu" and tp * pp > 1:
        raise SpecError(
            spec.file,
            f"{where}.placement.kind",
            f"KIND_GPU gives an instance one GPU but TP×PP is {tp}×{pp}: use kind model (or auto)",
        )
    if kind == "auto":
        # vLLM and SGLang own all GPUs of a multi-GPU instance (KIND_MODEL); a built
        # engine's (TRT-LLM) instances always get their devices through gpu_device_ids
        # (KIND_MODEL too).
        kind = "model" if tp * pp > 1 or traits(model.engine).built else "gpu"
    links = [state.topology.slowest_link(g) for g in groups if len(g) > 1]
    link = min(links, key=topo.link_score) if links else "-"
    return ModelPlan(
        model.name,
        model.engine,
        kind,
        tp,
        pp,
        tuple(InstancePlacement(tuple(g)) for g in groups),
        None,
        need,
        usable,
        link,
    )


def _pinned_groups(spec, where, model, state, tp, pp):
    """Devices the spec lists: split into one group per instance."""
    devices = list(model.placement.devices)
    field_path = f"{where}.placement.devices"
    if len(devices) % model.instances:
        raise SpecError(
            spec.file,
            field_path,
            f"{len(devices)} devices do not split evenly over {model.instances} instances",
        )
    world = len(devices) // model.instances
    tp = tp or world // (pp or 1)
    pp = pp or world // tp
    if tp * pp != world:
        raise SpecError(
            spec.file, field_path, f"each instance gets {world} devices but TP × PP is {tp} × {pp}"
        )
    for device in devices:
        if device >= state.topology.count:
            raise SpecError(
                spec.file,
                field_path,
                f"GPU {device} does not exist (hardware.count is {state.topology.count})",
            )
        if device not in state.free:
            raise SpecError(spec.file, field_path, f"GPU {device} is already used by another model")
        state.free.remove(device)
    return [devices[k * world : (k + 1) * world] for k in range(model.instances)], tp, pp


def candidate_layouts(
    shape: memory.ModelShape, gpus: int, tp: int | None, pp: int | None
) -> list[tuple[int, int]]:
    """(tp, pp) pairs to try: tensor parallelism alone first (smallest TP first), then
    pipelines of ever more stages. TP must divide the attention heads; PP cannot exceed
    the layers; an explicit TP or PP is the only one tried."""
    tps = (
        [tp] if tp else [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= gpus and shape.heads % t == 0]
    )
    layouts = []
    for t in tps:
        pps = [pp] if pp else range(1, gpus // t + 1)
        layouts += [(t, p) for p in pps if p <= shape.layers]
    return sorted(layouts, key=lambda tp_pp: (tp_pp[1], tp_pp[0]))


def _choose_groups(
    model: ModelSpec,
    shape: memory.ModelShape,
    state: _State,
    usable: float,
    tp: int | None,
    pp: int | None,
    where: str,
) -> tuple[list[list[int]], int, int]:
    """The first candidate layout that fits in memory and can be allocated; else the
    error for the layout that came closest (or for the free GPUs lacking)."""
    load = workload(model, shape, where)
    needs = {
        (t, p): memory.per_gpu_need(shape, load, t, p)
        for t, p in candidate_layouts(shape, state.topology.count, tp, pp) or [(tp or 1, pp or 1)]
    }
    fitting = [layout for layout, need in needs.items() if need.total_gib <= usable]
    if not fitting:
        (t, p), need = min(needs.items(), key=lambda item: item[1].total_gib)
        raise PlacementError(
            _missing(model, t, p, need, usable, state.gpu.name, explicit=bool(tp or pp))
        )
    for t, p in fitting:
        groups = _allocate(state, t, p, model.instances)
        if groups is not None:
            return groups, t, p
    t, p = fitting[0]
    raise PlacementError(
        f"{model.name}: needs {model.instances} instance(s) × TP×PP {t}×{p} = "
        f"{model.instances * t * p} GPUs with TP groups inside one fast-link domain; "
        f"free GPUs: {', '.join(map(str, state.free)) or 'none'} "
        f"(of {state.topology.count}, topology {state.topology.source})"
    )


def _allocate(state: _State, tp: int, pp: int, instances: int) -> list[list[int]] | None:
    """One TP group per pipeline stage per instance from the free GPUs, or None.
    A TP group must not cross NUMA nodes over the CPU interconnect (SYS links)."""
    free = list(state.free)
    min_score = topo.CROSS_NUMA_SCORE + 1 if state.topology.known and tp > 1 else None
    groups = []
    for _ in range(instances):
        devices: list[int] = []
        for _ in range(pp):
            group = topo.best_group(state.topology, free, tp, min_score)
            if group is None:
                return None
            devices += group
            free = [g for g in free if g not in group]
        groups.append(devices)
    state.free[:] = free
    return groups


def _missing(
    model: ModelSpec,
    tp: int,
    pp: int,
    need: memory.MemoryNeed,
    usable: float,
    where_name: str,
    explicit: bool = True,
) -> str:
    hint = ""
    if explicit and traits(model.engine).built:
        hint = "; raise build.tp_size / build.pp_size, or lower the batch or context"
    elif explicit:
        hint = "; raise the tensor/pipeline parallel size, or lower the batch or context"
    return (
        f"{model.name}: does not fit: with TP×PP {tp}×{pp} each {where_name} needs "
        f"{need.total_gib:.1f} GiB (weights {need.weights_gib:.1f} + KV cache "
        f"{need.kv_cache_gib:.1f} + workspace {need.workspace_gib:.1f}) but "
        f"{usable:.1f} GiB are usable: {need.total_gib - usable:.1f} GiB missing{hint}"
    )


# ---------------------------------------------------------------------------------------
# MIG


def _plan_mig(
    spec: DeploymentSpec,
    mig_models: list[tuple[int, ModelSpec]],
    state: _State,
    load_shape: ShapeLoader,
    plans: dict[str, ModelPlan],
) -> dict[int, tuple[mig.Slice, ...]]:
    requests: list[mig.SliceRequest] = []
    chosen: dict[str, tuple[MigProfile, memory.MemoryNeed, float]] = {}
    for i, model in mig_models:
        profile, shape, need, usable = _mig_profile(spec, i, model, state.gpu, load_shape)
        chosen[model.name] = (profile, need, usable)
        requests += [mig.SliceRequest(model.name, k, profile) for k in range(model.instances)]
    try:
        layouts, assignments = mig.pack(state.gpu, requests, list(state.free))
    except mig.MigError as e:
        raise PlacementError(f"MIG: {e}") from None
    state.free[:] = [g for g in state.free if g not in layouts]
    for _, model in mig_models:
        profile, need, usable = chosen[model.name]
        mine = sorted(
            (a for a in assignments if a.request.owner == model.name),
            key=lambda a: a.request.instance,
        )
        plans[model.name] = ModelPlan(
            model.name,
            model.engine,
            "model",
            1,
            1,
            tuple(InstancePlacement((a.gpu,), a) for a in mine),
            profile,
            need,
            usable,
            "-",
        )
    return layouts


def _mig_profile(
    spec: DeploymentSpec, i: int, model: ModelSpec, gpu: GpuType, load_shape: ShapeLoader
) -> tuple[MigProfile, memory.ModelShape, memory.MemoryNeed, float]:
    where = f"models[{i}].placement.mig"
    tp, pp = explicit_parallelism(model)
    if (tp or 1) * (pp or 1) > 1:
        raise SpecError(
            spec.file,
            where,
            "a MIG slice is one CUDA device: tensor or "
            "pipeline parallelism > 1 cannot run on slices",
        )
    if model.placement.devices:
        raise SpecError(spec.file, where, "give either placement.mig or placement.devices")
    if not gpu.mig_profiles:
        raise SpecError(spec.file, where, f"{gpu.name} does not support MIG")
    shape = _shape(spec, i, model, load_shape, required=True)
    need = memory.per_gpu_need(shape, workload(model, shape, f"models[{i}]"), 1, 1)
    share = utilization(model)
    mig_name = model.placement.mig
    assert mig_name  # _plan_mig is only given the models that name a MIG profile
    if mig_name == "auto":
        profile = _smallest_fitting(gpu, need, share)
    else:
        try:
            profile = mig.profile_named(gpu, mig_name)
        except mig.MigError as e:
            raise SpecError(spec.file, where, str(e)) from None
    usable = profile.memory_gib * share
    if need.total_gib > usable:
        raise PlacementError(_missing(model, 1, 1, need, usable, f"{profile.name} slice"))
    return profile, shape, need, usable


def _smallest_fitting(gpu: GpuType, need: memory.MemoryNeed, share: float) -> MigProfile:
    """`mig: auto`: the smallest slice (memory, then compute) that holds the model; the
    largest one if none does (the caller then reports what is missing)."""
    plain = sorted(
        (p for p in gpu.mig_profiles if "+" not in p.name),
        key=lambda p: (p.memory_gib, p.compute_slices),
    )
    return next((p for p in plain if p.memory_gib * share >= need.total_gib), plain[-1])


# ---------------------------------------------------------------------------------------
# I/O


def plan_for_spec(spec: DeploymentSpec, live=topo.read_live) -> Plan:
    """Plan a spec as written: its topology file (or the live one) and model sizes from
    local config.json files or the table of well-known models."""
    load_shape = functools.cache(memory.load_shape)  # each config.json is read once
    check_context_lengths(spec, load_shape, _model_ref)
    topology = (
        None
        if spec.hardware.gpu == "cpu"
        else topo.load_topology(spec.hardware.topology, spec.hardware.count, spec.file, live)
    )
    return plan_deployment(spec, topology, load_shape)
