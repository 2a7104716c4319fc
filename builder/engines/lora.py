"""LoRA adapters of a tensorrt_llm model: trtllm-build's LoRA flags and TRT-LLM's weights.

Build side (TensorRT-LLM v0.16, `tensorrt_llm/commands/build.py` "LoRA arguments" and the
`lora_plugin` flag of `tensorrt_llm/plugin/plugin.py`): the engine gets the LoRA plugin
in the build dtype, the adapters' folders (`--lora_dir`, read by the build for their
configuration), the largest rank it must hold (`--max_lora_rank`, which sizes the plugin
workspace) and the modules it applies LoRA to (`--lora_target_modules`, TRT-LLM names).
All of it enters the engine cache key, the adapters by content.

Runtime side: the tensorrtllm backend takes an adapter per request as `lora_weights`
[modules, row] and `lora_config` [modules, 3] (`module id, layer, rank` per row), each row
being A flattened ([rank, in]) then B × alpha/rank flattened ([out, rank]), rows zero-padded
to the longest. `convert_adapter` turns a PEFT folder into that layout with numpy and the
`safetensors` package (no torch, no TensorRT-LLM), once, when the repository is rendered.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builder.errors import EXIT_USAGE, TridentError
from builder.spec import adapters as adapters_spec

# Hugging Face module name → TRT-LLM's LoRA module (llama-style models).
HF_TO_TRTLLM = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
# TRT-LLM's module ids (LoraModule::ModuleType; the first column of lora_config).
MODULE_IDS = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
# Build dtypes whose LoRA weights numpy can carry (it has no bfloat16).
WEIGHT_DTYPES = {"fp16": "float16", "fp32": "float32"}
PLUGIN_DTYPES = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}
WEIGHTS_NPY = "model.lora_weights.npy"
CONFIG_NPY = "model.lora_config.npy"
# safetensors dtype → how to read its bytes (BF16: the high half of a float32).
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_KEY = re.compile(r".*\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$")


class AdapterError(TridentError):
    """An adapter folder that cannot be turned into TRT-LLM's LoRA format."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class LoraBuild:
    """What trtllm-build is told about LoRA for one engine."""

    plugin_dtype: str  # --lora_plugin
    adapter_dirs: tuple[str, ...]  # --lora_dir, in adapter-name order
    max_rank: int  # --max_lora_rank
    target_modules: tuple[str, ...]  # --lora_target_modules (TRT-LLM names, sorted)


def lora_build(spec_file: str, model, dtype: str) -> LoraBuild | None:
    """The LoRA part of a tensorrt_llm model's build (None without adapters). Reads each
    adapter's adapter_config.json: the engine gets the union of their target modules."""
    adapters = adapters_spec.adapters_of(model)
    if not adapters:
        return None
    dirs = tuple(adapters_spec.adapter_path(spec_file, adapters[name]) for name in sorted(adapters))
    modules = set()
    for folder in dirs:
        modules.update(trtllm_modules(_config(Path(folder))))
    return LoraBuild(
        PLUGIN_DTYPES[dtype],
        dirs,
        adapters_spec.settings_of(model).max_lora_rank,
        tuple(sorted(modules)),
    )


def build_flags(lora: LoraBuild) -> list[str]:
    return [
        "--lora_plugin",
        lora.plugin_dtype,
        "--lora_dir",
        *lora.adapter_dirs,  # nargs="+": every adapter folder
        "--lora_ckpt_source",
        "hf",  # PEFT folders, not NeMo checkpoints
        "--max_lora_rank",
        str(lora.max_rank),
        "--lora_target_modules",
        *lora.target_modules,
    ]


def key_args(lora: LoraBuild | None, digest: Callable[[str], str]) -> dict | None:
    """The LoRA build arguments for the cache key; folders by content, never by path."""
    if lora is None:
        return None
    return {
        "plugin": lora.plugin_dtype,
        "max_rank": lora.max_rank,
        "target_modules": list(lora.target_modules),
        "adapters": [digest(folder) for folder in lora.adapter_dirs],
    }


def trtllm_modules(config: Mapping) -> list[str]:
    targets = config.get("target_modules")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    unknown = [t for t in targets if t not in HF_TO_TRTLLM]
    if unknown:
        raise AdapterError(
            f"target_modules {', '.join(unknown)}: TensorRT-LLM's LoRA takes "
            f"{', '.join(HF_TO_TRTLLM)}"
        )
    return [HF_TO_TRTLLM[t] for t in targets]


def _config(folder: Path) -> dict:
    config = adapters_spec.read_config(folder)
    if isinstance(config, str):
        raise AdapterError(config)
    return config


# ---------------------------------------------------------------------------------------
# PEFT → TRT-LLM weights


def convert_adapter(folder: str | Path, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(lora_weights [1, modules, row] in `dtype`, lora_config int32 [1, modules, 3]),
    the layout TRT-LLM's own hf_lora_convert.py writes; rows ordered by (layer, module)."""
    folder = Path(folder)
    config = _config(folder)
    rank = config["r"]  # a positive int: the spec's adapter check (builder/spec/adapters.py)
    alpha = config.get("lora_alpha", rank)
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    pairs = _pairs(read_safetensors(folder / adapters_spec.WEIGHTS_FILE), folder)
    rows, meta = [], []
    for (layer, module), (a, b) in sorted(pairs.items()):
        if a.shape[0] != b.shape[1]:
            raise AdapterError(
                f"{folder}: layer {layer} {module}: lora_A has rank "
                f"{a.shape[0]} but lora_B has {b.shape[1]}"
            )
        rows.append(np.concatenate([a.reshape(-1), (b * scale).reshape(-1)]))
        meta.append([MODULE_IDS[HF_TO_TRTLLM[module]], layer, a.shape[0]])
    width = max(len(row) for row in rows)
    weights = np.zeros((1, len(rows), width), dtype=WEIGHT_DTYPES[dtype])
    for i, row in enumerate(rows):
        weights[0, i, : len(row)] = row
    return weights, np.array([meta], dtype=np.int32)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as float32 (bf16 widened: numpy has none)."""
    import safetensors

    try:
        entries = safetensors.deserialize(path.read_bytes())
    except (OSError, safetensors.SafetensorError) as e:
        raise AdapterError(f"cannot read {path}: {e}") from None
    tensors = {}
    for name, entry in entries:
        kind = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if kind is None:
            raise AdapterError(
                f"{path}: tensor {name} has dtype {entry['dtype']} "
                "(LoRA weights are F32, F16 or BF16)"
            )
        raw = np.frombuffer(bytes(entry["data"]), dtype=kind)
        if entry["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float32).reshape(entry["shape"])
    return tensors


def _pairs(tensors: Mapping[str, np.ndarray], folder: Path) -> dict:
    """(layer, HF module) → (A [rank, in], B [out, rank])."""
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name, value in tensors.items():
        match = _KEY.match(name)
        if not match or match.group(2) not in HF_TO_TRTLLM or value.ndim != 2:
            raise AdapterError(
                f"{folder}: tensor {name} is not the LoRA A or B matrix of a "
                f"layer module TensorRT-LLM takes ({', '.join(HF_TO_TRTLLM)})"
            )
        halves.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = value
    if not halves:
        raise AdapterError(f"{folder}: {adapters_spec.WEIGHTS_FILE} holds no LoRA weights")
    for (layer, module), half in halves.items():
        if set(half) != {"A", "B"}:
            raise AdapterError(
                f"{folder}: layer {layer} {module} lacks lora_{'B' if 'A' in half else 'A'}"
            )
    return {key: (half["A"], half["B"]) for key, half in halves.items()}


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def adapter_files(spec_file: str, model, dtype: str, prefix: str) -> dict[str, bytes]:
    """Rendered files: `prefix/NAME/model.lora_{weights,config}.npy` per adapter."""
    files = {}
    for name, path in sorted(adapters_spec.adapters_of(model).items()):
        weights, config = convert_adapter(adapters_spec.adapter_path(spec_file, path), dtype)
        files[f"{prefix}/{name}/{WEIGHTS_NPY}"] = npy_bytes(weights)
        files[f"{prefix}/{name}/{CONFIG_NPY}"] = npy_bytes(config)
    return files


def task_ids(model) -> dict[str, int]:
    """Adapter name → lora_task_id (1.. in name order, as trident's vLLM model numbers them)."""
    return {name: i for i, name in enumerate(sorted(adapters_spec.adapters_of(model)), 1)}
