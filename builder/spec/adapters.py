"""LoRA adapters of a model: the spec's `adapters:` and `lora:` sections.

    adapters: {support: ./adapters/support, legal: /srv/lora/legal}   # PEFT folders
    lora: {max_loras: 2, max_lora_rank: 16, max_cpu_loras: 4}

Parsed with the model (names safe and unique, limits in range); the folders themselves are
checked when rendering (`check_files`): each must be a PEFT LoRA adapter whose rank fits
max_lora_rank and whose target modules the model family has, with options, tensors and
shapes vLLM can load into the base model (adapter_weights). Both sections live in
ModelSpec.extra, as typed values, beside TRT-LLM's sections.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from builder.spec import adapter_weights as weights
from builder.spec.node import SpecError
from builder.spec.rules import rule

SECTIONS = ("adapters", "lora")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Also in served_by (`model:adapter`) and Prometheus labels: no ':' and nothing odd.
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The linear layers a LoRA may target, per model family (Hugging Face module names).
FAMILY_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
}
# Engine arguments the lora section sets; in engine_args too they would disagree.
_LORA_ENGINE_ARGS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")


@dataclass(frozen=True)
class LoraSettings:
    # Adapters in one batch (slots).
    max_loras: int = field(default=4, metadata=rule(minimum=1, maximum=256))
    # The largest rank `r` an adapter may have.
    max_lora_rank: int = field(default=16, metadata=rule(minimum=1, maximum=512))
    # Adapters cached in host memory (>= max_loras).
    max_cpu_loras: int | None = field(default=None, metadata=rule(minimum=1, maximum=4096))


def parse_section(key: str, node) -> Any:
    """`adapters` → {name: path} (read-only); `lora` → LoraSettings."""
    if key == "adapters":
        return _parse_adapters(node)
    settings = LoraSettings(
        **{key: node.field(LoraSettings, key) for key in LoraSettings.__dataclass_fields__}
    )
    node.done()
    if settings.max_cpu_loras is not None and settings.max_cpu_loras < settings.max_loras:
        raise node.error(
            f"must be >= max_loras ({settings.max_loras}), got {settings.max_cpu_loras}",
            "max_cpu_loras",
        )
    return settings


def _parse_adapters(node) -> Mapping[str, str]:
    adapters = {}
    for name in list(node.data):
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise node.error(
                f"{name!r} is not a safe adapter name (letters, digits, '_', "
                "'-' and '.', starting with a letter, at most 64 characters)"
            )
        path = node.get(name, str)
        if not path.strip():
            raise node.error("must be the path of a PEFT adapter folder", name)
        adapters[name] = path
    node.done()
    if not adapters:
        raise node.error("must name at least one adapter")
    return MappingProxyType(adapters)


def check_model(engine: str, args: Mapping[str, Any], extra: Mapping[str, Any], node) -> None:
    """The two sections together, and against engine_args."""
    if "lora" in extra and "adapters" not in extra:
        raise node.error("is set but the model declares no adapters", "lora")
    if "adapters" not in extra:
        return
    if engine == "tensorrt_llm":
        _check_trtllm(extra, node)
    for key in _LORA_ENGINE_ARGS:
        if key in args:
            raise node.error(
                "is set by the lora section when a model has adapters (give it there)",
                f"engine_args.{key}",
            )


def _check_trtllm(extra: Mapping[str, Any], node) -> None:
    """What TensorRT-LLM's LoRA (as trident wires it, docs/lora.md) cannot take."""
    build = extra.get("build")
    dtype = getattr(build, "dtype", "fp16")
    if dtype == "bf16":  # the pre-processing model sends the weights as numpy arrays
        raise node.error(
            "TensorRT-LLM adapters need build.dtype fp16 or fp32 (their weights "
            "travel as numpy arrays, which have no bfloat16)",
            "adapters",
        )
    for name, path in extra["adapters"].items():
        if path.startswith("s3://"):
            raise node.error(
                "TensorRT-LLM adapters are local folders (trtllm-build reads "
                "them and trident repo converts them)",
                f"adapters.{name}",
            )
    lora = extra.get("lora")
    if lora is not None and lora.max_cpu_loras is not None:
        raise node.error(
            "applies to vllm; TensorRT-LLM keeps every adapter in a host cache "
            "that trident sizes to hold them all",
            "lora.max_cpu_loras",
        )


def adapters_of(model) -> Mapping[str, str]:
    return model.extra.get("adapters", MappingProxyType({}))


def settings_of(model) -> LoraSettings:
    return model.extra.get("lora") or LoraSettings()


# ---------------------------------------------------------------------------------------
# Render time: the folders, and what each engine is given


def adapter_path(spec_file: str, path: str) -> str:
    """Absolute: the server runs elsewhere than `trident repo` (relative to the spec)."""
    value = Path(path).expanduser()
    return str(value if value.is_absolute() else (Path(spec_file).parent / value).resolve())


def check_files(spec, resolved_models: Mapping[str, str]) -> None:
    """Every adapter folder of every model is a LoRA the model can load; SpecError
    naming models[i].adapters.NAME otherwise."""
    for index, model in enumerate(spec.models):
        adapters = adapters_of(model)
        if not adapters:
            continue  # no config.json to read for a model without adapters
        base = _base_config(resolved_models.get(model.name))
        family = model.family or str(base.get("model_type", ""))
        limits = settings_of(model)
        for name, path in adapters.items():
            reason = adapter_problem(
                adapter_path(spec.file, path), family, limits, weights.base_shape(base)
            )
            if reason:
                raise SpecError(spec.file, f"models[{index}].adapters.{name}", reason)


def adapter_problem(
    folder: str, family: str, limits: LoraSettings, base: weights.BaseShape | None = None
) -> str | None:
    """Why `folder` is not a LoRA adapter this model can load, or None. `base`: the base
    model's dimensions, when its config.json is at hand (else shapes are checked only
    against each other and adapter_config.json)."""
    root = Path(folder)
    if not root.is_dir():
        return f"{folder} is not a folder"
    config = read_config(root)
    if isinstance(config, str):
        return config
    if str(config.get("peft_type", "")).upper() != "LORA":
        return f"{CONFIG_FILE} has peft_type {config.get('peft_type')!r}, not 'LORA'"
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        return f"{CONFIG_FILE}: r must be a positive integer, got {rank!r}"
    unsupported = weights.unsupported_options(config)
    if unsupported:
        return f"{root / CONFIG_FILE}: {unsupported}"
    if weights.max_rank(config) > limits.max_lora_rank:
        return (
            f"rank r={weights.max_rank(config)} is larger than lora.max_lora_rank "
            f"({limits.max_lora_rank})"
        )
    targets = config.get("target_modules")
    targets = [targets] if isinstance(targets, str) else targets
    if not targets or not all(isinstance(t, str) for t in targets):
        return f"{CONFIG_FILE}: target_modules must list module names, got {targets!r}"
    known = FAMILY_MODULES.get(family)
    unknown = [t for t in targets if known is not None and t not in known]
    if unknown:
        return (
            f"target_modules {', '.join(unknown)} are not modules of a {family} model "
            f"(it has: {', '.join(known or ())})"  # known is set: else nothing is unknown
        )
    if not (root / WEIGHTS_FILE).is_file():
        return f"{folder} has no {WEIGHTS_FILE}"
    return weights.weights_problem(root / WEIGHTS_FILE, config, known, base)


def read_config(root: Path) -> dict | str:
    """adapter_config.json as a dict, or the reason it cannot be read."""
    try:
        config = json.loads((root / CONFIG_FILE).read_text())
    except FileNotFoundError:
        return f"{root} has no {CONFIG_FILE} (not a PEFT adapter folder)"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return f"cannot read {root / CONFIG_FILE}: {e}"
    return config if isinstance(config, dict) else f"{CONFIG_FILE} is not a JSON object"


def _base_config(path: str | None) -> dict:
    """A local model folder's config.json: its family when the spec gives none, and the
    dimensions an adapter's matrices must fit."""
    if path is None:
        return {}  # no local folder (Path(None) would raise the TypeError caught below)
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (TypeError, OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}  # a hub id or an unreadable folder: modules and shapes left unchecked
    return config if isinstance(config, dict) else {}


def engine_args(spec_file: str, model) -> dict[str, Any]:
    """What model.json gets for a vLLM or SGLang model with adapters (else nothing).

    vLLM: its LoRA switches, plus `lora_adapters` (name → folder) that trident's model
    pops before building AsyncEngineArgs. SGLang: ServerArgs' lora_paths and limits."""
    adapters = {name: adapter_path(spec_file, path) for name, path in adapters_of(model).items()}
    if not adapters:
        return {}
    limits = settings_of(model)
    if model.engine == "sglang":
        return {
            "enable_lora": True,
            "lora_paths": adapters,
            "max_loras_per_batch": limits.max_loras,
            "max_lora_rank": limits.max_lora_rank,
        }
    args = {
        "enable_lora": True,
        "max_loras": limits.max_loras,
        "max_lora_rank": limits.max_lora_rank,
        "lora_adapters": adapters,
    }
    if limits.max_cpu_loras is not None:
        args["max_cpu_loras"] = limits.max_cpu_loras
    return args
