"""Memory math for placing a model: weights, KV cache per token, workspace headroom.

A model's size facts come from its Hugging Face `config.json` when the spec's `model` is
a local folder (or a `builtin:` asset), else from KNOWN_MODELS below, a small table of
well-known models keyed by their Hugging Face id (the same fields config.json holds).
Parameter counts are derived from the architecture, not stored: a decoder layer holds
the attention projections (q, k, v, o), a gated MLP (gate, up, down) per expert and two
norms; embeddings and the LM head are counted separately because quantization leaves
them in 16 bit. Small terms (biases, q/k norms) are left out: < 0.1% on these models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3

# Bytes per weight or cache element. "auto" means the checkpoint's own 16-bit dtype.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "auto": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "w8a8": 1,
    "int8_wo": 1,
    "int4": 0.5,
    "int4_awq": 0.5,
    "awq": 0.5,
    "gptq": 0.5,
    "w4a16": 0.5,
    "nvfp4": 0.5,
    "fp4": 0.5,
}

# Fixed per-GPU overhead: CUDA context, cuBLAS/NCCL workspaces, the engine's runtime.
RUNTIME_OVERHEAD_GIB = 1.0
# Live activations of one prefill chunk, per token: the residual stream and attention
# outputs (~4 × hidden) plus the MLP's gate/up outputs on this rank (2 × intermediate).
PREFILL_CHUNK_TOKENS = 8192


def _llama(layers, hidden, heads, kv_heads, intermediate, vocab, max_pos, **extra):
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        **extra,
    }


_LLAMA3_8B = _llama(32, 4096, 32, 8, 14336, 128256, 8192)
_LLAMA31_8B = _llama(32, 4096, 32, 8, 14336, 128256, 131072)
_LLAMA3_70B = _llama(80, 8192, 64, 8, 28672, 128256, 131072)
_MIXTRAL_8X7B = _llama(32, 4096, 32, 8, 14336, 32000, 32768, num_local_experts=8)
_LLAMA31_405B = _llama(126, 16384, 128, 8, 53248, 128256, 131072)

KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "meta-llama/Meta-Llama-3-8B": _LLAMA3_8B,
    "meta-llama/Meta-Llama-3-8B-Instruct": _LLAMA3_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
    "meta-llama/Llama-3.1-70B-Instruct": _LLAMA3_70B,
    "meta-llama/Llama-3.3-70B-Instruct": _LLAMA3_70B,
    "meta-llama/Llama-3.1-405B-Instruct": _LLAMA31_405B,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": _MIXTRAL_8X7B,
    "mistralai/Mixtral-8x7B-v0.1": _MIXTRAL_8X7B,
    "Qwen/Qwen2.5-7B-Instruct": _llama(28, 3584, 28, 4, 18944, 152064, 32768),
    "Qwen/Qwen3-30B-A3B": _llama(
        48,
        2048,
        32,
        4,
        6144,
        151936,
        40960,
        head_dim=128,
        num_experts=128,
        moe_intermediate_size=768,
    ),
    "HuggingFaceTB/SmolLM2-135M-Instruct": _llama(
        30, 576, 9, 3, 1536, 49152, 8192, tie_word_embeddings=True
    ),
}
# builtin: assets trident ships (builder.engines.assets) and the public model each one is.
BUILTIN_MODELS = {"builtin:smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class UnknownModelSize(ValueError):
    """Neither a config.json nor a KNOWN_MODELS entry says how big the model is."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # per expert for MoE models
    vocab: int
    experts: int = 1
    tied_embeddings: bool = False
    max_context: int = 4096
    max_context_known: bool = True  # False: config.json does not say (4096 is a guess)

    @property
    def layer_linear_params(self) -> int:
        """Weights of one decoder layer's matrices (what quantization shrinks)."""
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = self.experts * 3 * self.hidden * self.intermediate
        router = self.hidden * self.experts if self.experts > 1 else 0
        return q_and_o + k_and_v + mlp + router

    @property
    def embedding_params(self) -> int:
        """Token embeddings plus the LM head (one matrix when tied) plus norms."""
        tables = 1 if self.tied_embeddings else 2
        norms = self.layers * 2 * self.hidden + self.hidden
        return tables * self.vocab * self.hidden + norms

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_linear_params + self.embedding_params


class BadModelConfig(UnknownModelSize):
    """A config.json that exists but holds an unusable number: `FILE: KEY: reason`."""


_CONFIG_LIMIT = 2**40  # larger than any real layer count, width or vocabulary


def _count(config: Mapping[str, Any], key: str) -> int:
    """A positive whole number from config.json (1e999, 0, -3 and "x" are refused)."""
    value = config[key]
    if isinstance(value, float) and value.is_integer() and abs(value) <= _CONFIG_LIMIT:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadModelConfig(f"{key}: expected a whole number, got {value!r}")
    if not 1 <= value <= _CONFIG_LIMIT:
        raise BadModelConfig(f"{key}: must be between 1 and {_CONFIG_LIMIT}, got {value}")
    return value


def _optional(config: Mapping[str, Any], key: str, default: int) -> int:
    """Like _count; absent, null or 0 means the default (as Hugging Face reads them)."""
    return _count(config, key) if config.get(key) else default


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """A ModelShape from the fields of a Hugging Face config.json."""
    if not isinstance(config, Mapping):
        raise BadModelConfig("expected a JSON object")
    heads = _count(config, "num_attention_heads")
    hidden = _count(config, "hidden_size")
    experts = _optional(config, "num_local_experts", _optional(config, "num_experts", 1))
    moe = experts > 1 and config.get("moe_intermediate_size")
    return ModelShape(
        layers=_count(config, "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=_optional(config, "num_key_value_heads", heads),
        head_dim=_optional(config, "head_dim", max(1, hidden // heads)),
        intermediate=_count(config, "moe_intermediate_size" if moe else "intermediate_size"),
        vocab=_count(config, "vocab_size"),
        experts=experts,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=_optional(config, "max_position_embeddings", 4096),
        max_context_known=bool(config.get("max_position_embeddings")),
    )


def load_shape(model: str) -> ModelShape:
    """The shape of a spec's `model`: a local folder's config.json, else KNOWN_MODELS
    (builtin assets are looked up by the public model they are, so planning never has
    to build them)."""
    config_path = Path(model).expanduser() / "config.json"
    if not model.startswith("builtin:") and config_path.is_file():
        try:
            return shape_from_config(json.loads(config_path.read_text()))
        except BadModelConfig as e:
            raise BadModelConfig(f"{config_path}: {e}") from None
        except KeyError as e:
            raise BadModelConfig(f"{config_path}: {e.args[0]}: missing") from None
        except (TypeError, ValueError) as e:  # not JSON, not UTF-8
            raise BadModelConfig(f"{config_path}: not a usable config.json ({e})") from None
    known = KNOWN_MODELS.get(BUILTIN_MODELS.get(model, model))
    if known is None:
        raise UnknownModelSize(
            f"size of {model!r} unknown: give a local folder holding config.json, or one "
            f"of {', '.join(sorted(KNOWN_MODELS))}"
        )
    return shape_from_config(known)


def dtype_bytes(dtype: str, field: str) -> float:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise ValueError(
            f"{field}: unknown precision {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})"
        ) from None


def weight_bytes(shape: ModelShape, weight_dtype_bytes: float) -> float:
    """Quantization applies to the decoder layers; embeddings and LM head stay 16 bit
    (or 32 bit for an fp32 model)."""
    embedding_bytes = max(weight_dtype_bytes, 2)
    return (
        shape.layers * shape.layer_linear_params * weight_dtype_bytes
        + shape.embedding_params * embedding_bytes
    )


def kv_bytes_per_token(shape: ModelShape, kv_dtype_bytes: float) -> float:
    """K and V for every layer: layers × KV heads × head dim × 2 × bytes."""
    return shape.layers * shape.kv_heads * shape.head_dim * 2 * kv_dtype_bytes


@dataclass(frozen=True)
class MemoryNeed:
    """What one GPU (or MIG slice) of an instance holds, in GiB."""

    weights_gib: float
    kv_cache_gib: float
    workspace_gib: float

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.workspace_gib


@dataclass(frozen=True)
class Workload:
    """What one instance must serve at once, and in which precision."""

    weight_dtype_bytes: float
    kv_dtype_bytes: float
    max_batch: int
    max_context: int
    # The engine's KV cache per GPU where the spec fixes it in bytes (vLLM's
    # kv_cache_memory_bytes): the engine allocates that, whatever the batch and context.
    kv_bytes_per_gpu: int | None = None


def per_gpu_need(shape: ModelShape, load: Workload, tp: int, pp: int) -> MemoryNeed:
    """Memory on each of the tp × pp GPUs of one instance.

    Weights shard evenly over tp × pp. The KV cache of a full batch at full context is
    split by pipeline stage (layers) and by tensor rank (KV heads; a rank holds at least
    one head, so TP beyond the KV head count replicates heads), unless the engine is told
    its size per GPU (`kv_bytes_per_gpu`)."""
    weights = weight_bytes(shape, load.weight_dtype_bytes) / (tp * pp)
    kv_heads_per_rank = max(1, math.ceil(shape.kv_heads / tp))
    kv_per_token = (
        math.ceil(shape.layers / pp) * kv_heads_per_rank * shape.head_dim * 2 * load.kv_dtype_bytes
    )
    kv = (
        kv_per_token * load.max_batch * load.max_context
        if load.kv_bytes_per_gpu is None
        else load.kv_bytes_per_gpu
    )
    chunk = min(PREFILL_CHUNK_TOKENS, load.max_batch * load.max_context)
    activations = chunk * (4 * shape.hidden + 2 * shape.intermediate / tp) * 2
    return MemoryNeed(weights / GIB, kv / GIB, RUNTIME_OVERHEAD_GIB + activations / GIB)
