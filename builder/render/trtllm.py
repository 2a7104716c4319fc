"""The Triton models of one tensorrt_llm model (TensorRT-LLM's inflight-batcher layout).

    NAME                  ensemble: text in, text out, the tensors TrtllmAdapter sends
    NAME_preprocessing    Python: tokenizer (transformers) text → input_ids
    NAME_tensorrt_llm     tensorrtllm backend: the cached engine, inflight fused batching
    NAME_postprocessing   Python: output_ids → text

Pure: (RenderContext, ModelSpec) → {path: bytes}; the engine directory and its cache key
come from ctx.engines (a ServedEngine each, resolved from the cache by
builder.engines.jobs before rendering).
"""

from __future__ import annotations

import json
from typing import Any

from builder.engines import lora as lora_mod
from builder.engines.jobs import spec_path
from builder.plan import placement as placement_mod
from builder.render.context import (
    COMMON_PACKAGE,
    VERSION,
    RenderContext,
    RenderError,
    python_model,
    render_template,
)
from builder.spec import ModelSpec
from builder.spec import adapters as adapters_spec
from builder.spec import trtllm as trtllm_spec
from trident_common import interface as INTERFACE

TEMPLATE_DIR = "tensorrt_llm"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
DEFAULT_RUNTIME = {
    "batch_scheduler_policy": "guaranteed_no_evict",
    "kv_cache_free_gpu_mem_fraction": 0.9,
    "enable_kv_cache_reuse": False,
    "exclude_input_in_output": True,
}  # the router's text_output is new text
# engine_args consumed by the config itself rather than passed as backend parameters.
_CONFIG_FIELDS = ("max_batch_size", "max_queue_delay_microseconds")

_T = INTERFACE.Tensor
# The tokenizer models' own tensors (TensorRT-LLM's inflight_batcher_llm layout).
PREPROCESSING_IO = {
    "inputs": [_T("QUERY", "TYPE_STRING", (1,)), _T("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,))],
    "outputs": [
        _T("INPUT_ID", "TYPE_INT32", (-1,)),
        _T("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
        _T("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
        _T("OUT_END_ID", "TYPE_INT32", (1,)),
        _T("OUT_PAD_ID", "TYPE_INT32", (1,)),
    ],
}
# With adapters: the ensemble's lora_name (or sampling_parameters.lora_name, vllm_backend's
# dialect) → the pre-processing model → the engine's LoRA
# inputs (tensorrtllm backend v0.16 names; lora_weights in the build dtype).
LORA_INPUTS = {"lora_name": "LORA_NAME", "sampling_parameters": "SAMPLING_PARAMETERS"}
LORA_PREPROCESSING_IO = {
    "inputs": [_T(name, "TYPE_STRING", (1,), True) for name in LORA_INPUTS.values()],
    "outputs": [
        _T("LORA_TASK_ID", "TYPE_UINT64", (1,)),
        _T("LORA_WEIGHTS", "LORA_DTYPE", (-1, -1)),
        _T("LORA_CONFIG", "TYPE_INT32", (-1, 3)),
    ],
}
LORA_ENGINE_INPUTS = {
    "LORA_TASK_ID": "lora_task_id",
    "LORA_WEIGHTS": "lora_weights",
    "LORA_CONFIG": "lora_config",
}
LORA_WEIGHT_TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32"}
LORA_CACHE_GPU_FRACTION = 0.05  # TRT-LLM's own default share of free GPU memory
LORA_CACHE_MIN_HOST_BYTES = 1 << 30
POSTPROCESSING_IO = {
    "inputs": [
        _T("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
        _T("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
    ],
    "outputs": [_T("OUTPUT", "TYPE_STRING", (-1,))],
}


def names(model: ModelSpec) -> dict[str, str]:
    return {
        "ensemble": model.name,
        "preprocessing": f"{model.name}_preprocessing",
        "engine": f"{model.name}_tensorrt_llm",
        "postprocessing": f"{model.name}_postprocessing",
    }


def render(ctx: RenderContext, model: ModelSpec) -> dict[str, bytes]:
    if model.name not in ctx.engines:
        raise RenderError(
            f"model {model.name}: no engine directory was resolved (trident "
            "repo fetches it from the engine cache first)"
        )
    profile = trtllm_spec.serving_profile(model.extra)
    _check_servable(model, profile)
    n = names(model)
    batch = int(model.engine_args.get("max_batch_size", profile.max_batch_size))
    common = {"spec_file": ctx.spec.file, "max_batch_size": batch}
    tokenizer = _tokenizer_parameters(ctx, model)
    lora = _lora(ctx, model, n)
    ensemble_inputs = INTERFACE.TRTLLM_ENSEMBLE_INPUTS + (
        tuple(_T(name, "TYPE_STRING", (1,), True) for name in LORA_INPUTS) if lora else ()
    )
    files = {
        f"{n['ensemble']}/config.pbtxt": render_template(
            f"{TEMPLATE_DIR}/ensemble.pbtxt.j2",
            model_name=n["ensemble"],
            inputs=ensemble_inputs,
            lora_inputs=LORA_INPUTS if lora else {},
            **{k: n[k] for k in ("preprocessing", "engine", "postprocessing")},
            **common,
        ),
        f"{n['engine']}/config.pbtxt": _engine_config(
            ctx, model, profile, n["engine"], common, lora
        ),
        # Triton loads no model without a version folder, an ensemble included.
        f"{n['ensemble']}/{VERSION}/ensemble.txt": (
            b"The ensemble's steps are in config.pbtxt; this folder is its version.\n"
        ),
        # Triton needs a version directory; the engine itself stays in the cache.
        f"{n['engine']}/{VERSION}/engine.txt": (
            f"served engine (gpt_model_path): {ctx.engines[model.name].path}\n".encode()
        ),
    }
    files.update(_python_steps(model, n, common, tokenizer, lora))
    files.update(lora.get("files", {}))
    return files


def _python_steps(
    model: ModelSpec,
    n: dict[str, str],
    common: dict[str, Any],
    tokenizer: dict[str, Any],
    lora: dict[str, Any],
) -> dict[str, bytes]:
    """The ensemble's Python steps (pre- and post-processing): each one's config.pbtxt,
    its model.py shim and its packages."""
    files: dict[str, bytes] = {}
    # (role, its inputs and outputs, its own parameters, what its config says it does)
    roles: tuple[tuple[str, dict[str, Any], dict[str, Any], str], ...] = (
        (
            "preprocessing",
            lora.get("io", PREPROCESSING_IO),
            lora.get("parameters", {}),
            "Tokenizer: text_input → input_ids"
            + (", lora_name → the engine's LoRA inputs." if lora else "."),
        ),
        ("postprocessing", POSTPROCESSING_IO, {}, "Detokenizer: output_ids → text_output."),
    )
    for role, io, extra, purpose in roles:
        files[f"{n[role]}/config.pbtxt"] = render_template(
            f"{TEMPLATE_DIR}/python_model.pbtxt.j2",
            model_name=n[role],
            purpose=purpose,
            instances=model.instances,
            parameters={**tokenizer, **extra},
            **io,
            **common,
        )
        package = f"python_backends.tensorrt_llm.{role}"
        # the pre-processing's refusals (an unknown adapter) are marked through
        # trident_common/error_classes.py
        packages = (package, "python_backends.tensorrt_llm.common") + (
            (COMMON_PACKAGE,) if role == "preprocessing" else ()
        )
        files.update(python_model(f"{n[role]}/{VERSION}", f"{package}.model", packages))
    return files


def _lora(ctx: RenderContext, model: ModelSpec, n: dict[str, str]) -> dict[str, Any]:
    """The pre-processing model's LoRA tensors, parameters and converted adapters, and the
    engine's LoRA inputs and cache parameters ({} for a model without adapters)."""
    if not adapters_spec.adapters_of(model):
        return {}
    _, build, _ = trtllm_spec.sections(model)
    weight_type = LORA_WEIGHT_TYPES[build.dtype]
    files = lora_mod.adapter_files(
        ctx.spec.file, model, build.dtype, f"{n['preprocessing']}/{VERSION}/lora"
    )
    outputs = [
        t._replace(dtype=weight_type) if t.dtype == "LORA_DTYPE" else t
        for t in LORA_PREPROCESSING_IO["outputs"]
    ]
    rank = adapters_spec.settings_of(model).max_lora_rank
    weight_bytes = sum(
        len(data) for path, data in files.items() if path.endswith(lora_mod.WEIGHTS_NPY)
    )
    return {
        "io": {
            "inputs": PREPROCESSING_IO["inputs"] + LORA_PREPROCESSING_IO["inputs"],
            "outputs": PREPROCESSING_IO["outputs"] + outputs,
        },
        "parameters": {
            "model_name": model.name,
            "lora_adapters": json.dumps(lora_mod.task_ids(model), sort_keys=True),
            # each engine instance has its own adapter cache
            "lora_send_weights": "first_use" if model.instances == 1 else "always",
        },
        "files": files,
        "weight_type": weight_type,
        "engine_parameters": {
            "lora_cache_optimal_adapter_size": str(rank),
            "lora_cache_max_adapter_size": str(rank),
            "lora_cache_gpu_memory_fraction": str(LORA_CACHE_GPU_FRACTION),
            # every adapter stays in host memory: the weights are sent only once
            "lora_cache_host_memory_bytes": str(max(LORA_CACHE_MIN_HOST_BYTES, 2 * weight_bytes)),
        },
    }


def _check_servable(model: ModelSpec, profile: trtllm_spec.Profile) -> None:
    if model.placement.mig:
        raise RenderError(
            f"model {model.name}: placement.mig: the tensorrtllm backend "
            "is not rendered on MIG slices; give whole GPUs"
        )
    speculative = profile.speculative
    if speculative and speculative.mode == "draft-model":
        raise RenderError(
            f"model {model.name}: profile {profile.name!r} is built for draft-model "
            "speculative decoding, which needs a BLS that drives draft and target engines; "
            "trident renders medusa and eagle only: serve another profile"
        )


def _tokenizer_parameters(ctx: RenderContext, model: ModelSpec) -> dict[str, str]:

    tokenizer = model.extra.get("tokenizer")
    return {
        "tokenizer_dir": spec_path(ctx.spec, trtllm_spec.tokenizer_path(model)),
        "skip_special_tokens": _text(tokenizer.skip_special_tokens if tokenizer else True),
    }


def _engine_config(
    ctx: RenderContext,
    model: ModelSpec,
    profile: trtllm_spec.Profile,
    name: str,
    common: dict,
    lora: dict[str, Any],
) -> bytes:
    _, build, _ = trtllm_spec.sections(model)
    orchestrator = needs_orchestrator(ctx, model, build.world_size)
    served = ctx.engines[model.name]
    parameters = engine_parameters(
        model, profile, served.path, device_sets(ctx, model, build.world_size), orchestrator
    )
    parameters.update(lora.get("engine_parameters", {}))
    scalar_inputs = [("end_id", "TYPE_INT32"), ("pad_id", "TYPE_INT32")] + [
        (t.engine, t.dtype) for t in INTERFACE.TRTLLM_INPUTS
    ]
    engine = {"profile": profile.name, "orchestrator": orchestrator, "key": served.key}
    return render_template(
        f"{TEMPLATE_DIR}/tensorrt_llm.pbtxt.j2",
        model_name=name,
        engine=engine,
        instances=model.instances,
        parameters=parameters,
        scalar_inputs=scalar_inputs,
        lora_weight_type=lora.get("weight_type"),
        max_queue_delay_microseconds=int(model.engine_args.get("max_queue_delay_microseconds", 0)),
        **common,
    )


def needs_orchestrator(ctx: RenderContext, model: ModelSpec, world_size: int) -> bool:
    """Leader mode (MPI ranks = the server's own processes) serves exactly one single-GPU
    engine instance; anything more must let the backend spawn its workers."""
    trtllm_models = [m for m in ctx.spec.models if m.engine == "tensorrt_llm"]
    return len(trtllm_models) > 1 or model.instances > 1 or world_size > 1


def device_sets(ctx: RenderContext, model: ModelSpec, world_size: int) -> list[list[int]]:
    """GPU ordinals per instance, as the placement plan laid them out (none on the CPU)."""
    sets = placement_mod.device_ids(model, ctx.plan)
    for devices in sets:
        if len(devices) != world_size:
            raise RenderError(
                f"model {model.name}: the placement gives an instance GPUs "
                f"{devices} but its engine has TP×PP = {world_size} ranks"
            )
    return sets


def engine_parameters(
    model: ModelSpec,
    profile: trtllm_spec.Profile,
    engine_dir: str,
    devices: list[list[int]],
    orchestrator: bool,
) -> dict[str, str]:
    """The tensorrtllm backend's parameters: mandatory ones, then the spec's runtime knobs
    (builder.spec.engine_args.TRTLLM_ARGS, already checked against the served profile)."""
    runtime: dict[str, Any] = {
        **DEFAULT_RUNTIME,
        **{k: v for k, v in model.engine_args.items() if k not in _CONFIG_FIELDS},
    }
    runtime.setdefault("max_beam_width", profile.max_beam_width)
    if profile.speculative and "decoding_mode" not in runtime:
        runtime["decoding_mode"] = profile.speculative.mode  # medusa | eagle
    parameters = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
    }
    parameters.update({key: _text(value) for key, value in runtime.items()})
    if devices:
        parameters["gpu_device_ids"] = ";".join(",".join(map(str, d)) for d in devices)
    if orchestrator:
        parameters["executor_worker_path"] = EXECUTOR_WORKER
    return parameters


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
