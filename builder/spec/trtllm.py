"""The TensorRT-LLM sections of a model: `checkpoint:`, `build:`, `profiles:`, `tokenizer:`.

Everything here describes what goes INTO an engine (and so into its cache key). Runtime
knobs of the tensorrtllm backend (KV cache fraction, scheduler policy...) stay in the
model's `engine_args` (builder.spec.engine_args.TRTLLM_ARGS); `check_model` rejects the
runtime settings that the served profile's engine cannot honour.

    checkpoint:            # exactly one of:
      path: s3://b/ckpt    #   a converted TRT-LLM checkpoint (local dir or s3:// URI)
      hf_model: /m/llama   #   a Hugging Face-style folder, converted by trident
      family: llama        #   ...with examples/<family>/convert_checkpoint.py
    build: {dtype: bf16, quantization: fp8, tp_size: 4, pp_size: 1}
    profiles:
      short-context: {max_batch_size: 256, max_input_len: 2048, max_seq_len: 4096,
                      max_num_tokens: 8192, serve: true,
                      plugins: {paged_context_fmha: true}}
    tokenizer: {path: /m/llama}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from builder.spec.node import _Node
from builder.spec.rules import rule, rule_of

DTYPES = ("fp16", "bf16", "fp32")
# trident's quantization name → TRT-LLM's spelling (quantize.py --qformat / weight-only).
QUANTIZATIONS = ("none", "fp8", "int4-awq", "w4a8-awq", "int8-sq", "int8-wo", "int4-wo")
MODELOPT_QUANTIZATIONS = ("fp8", "int4-awq", "w4a8-awq", "int8-sq")  # quantize.py
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
GEMM_PLUGIN = ("auto", "fp16", "bf16", "fp32", "fp8", "disable")
SPECULATIVE_MODES = ("draft-model", "medusa", "eagle")
# Families with an examples/<family>/convert_checkpoint.py in TensorRT-LLM v0.16.
FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen",
    "gemma",
    "phi",
    "gpt",
    "gptj",
    "gptneox",
    "falcon",
    "baichuan",
    "chatglm",
    "bloom",
    "mpt",
    "nemotron",
    "deepseek_v2",
)
PROFILE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


@dataclass(frozen=True)
class Checkpoint:
    path: str | None = None  # a converted TRT-LLM checkpoint (local or s3://)
    hf_model: str | None = None  # a Hugging Face-style folder to convert
    # Convert script (with hf_model).
    family: str | None = field(default=None, metadata=rule(choices=FAMILIES))

    @property
    def needs_conversion(self) -> bool:
        return self.hf_model is not None


@dataclass(frozen=True)
class BuildSettings:
    dtype: str = field(default="fp16", metadata=rule(choices=DTYPES))
    quantization: str = field(default="none", metadata=rule(choices=QUANTIZATIONS))
    kv_cache_dtype: str = field(default="auto", metadata=rule(choices=KV_CACHE_DTYPES))
    tp_size: int = field(default=1, metadata=rule(minimum=1, maximum=64))
    pp_size: int = field(default=1, metadata=rule(minimum=1, maximum=64))

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class Plugins:
    # Auto: the build dtype.
    gemm_plugin: str = field(default="auto", metadata=rule(choices=GEMM_PLUGIN))
    paged_kv_cache: bool = True  # required by inflight fused batching
    paged_context_fmha: bool = False  # required by KV cache reuse and chunked context
    context_fmha: bool = True
    remove_input_padding: bool = True
    multiple_profiles: bool = False
    tokens_per_block: int = field(default=64, metadata=rule(minimum=8, maximum=1024))


@dataclass(frozen=True)
class Speculative:
    mode: str = field(metadata=rule(choices=SPECULATIVE_MODES))
    max_draft_len: int = field(metadata=rule(minimum=1, maximum=64))
    draft_model: str | None = None  # draft-model: the spec name of the draft model
    heads_model: str | None = None  # medusa / eagle: folder of the heads' weights
    # Medusa heads / eagle layers.
    num_heads: int | None = field(default=None, metadata=rule(minimum=1, maximum=16))


@dataclass(frozen=True)
class Profile:
    name: str
    max_batch_size: int = field(metadata=rule(minimum=1, maximum=4096))
    max_input_len: int = field(metadata=rule(minimum=1))
    max_seq_len: int = field(metadata=rule(minimum=1))
    max_num_tokens: int = field(metadata=rule(minimum=1))
    max_beam_width: int = field(default=1, metadata=rule(minimum=1, maximum=64))
    plugins: Plugins = field(default_factory=Plugins)
    weight_streaming: bool = False
    speculative: Speculative | None = None
    serve: bool = False  # the engine `trident repo` renders (else the first)


@dataclass(frozen=True)
class Tokenizer:
    path: str
    skip_special_tokens: bool = True


# ---------------------------------------------------------------------------------------
# Sections (called through builder.spec.engine_args.validate_extra)


def parse_section(key: str, node: _Node) -> Any:
    parsers = {
        "checkpoint": parse_checkpoint,
        "build": parse_build,
        "profiles": parse_profiles,
        "tokenizer": parse_tokenizer,
    }
    return parsers[key](node)


def parse_checkpoint(node: _Node) -> Checkpoint:
    path = node.get("path", str, None)
    hf_model = node.get("hf_model", str, None)
    family = node.get("family", str, None)
    node.done()
    if (path is None) == (hf_model is None):
        raise node.error(
            "give exactly one of path (a converted TRT-LLM checkpoint) or "
            "hf_model (a Hugging Face folder to convert)"
        )
    if hf_model is not None and family is None:
        raise node.error("is required with hf_model (it picks the convert script)", "family")
    problem = family is not None and rule_of(Checkpoint, "family").choice_problem(family)
    if problem:
        raise node.error(problem, "family")
    if path is not None and family is not None:
        raise node.error("only applies to hf_model (path is already converted)", "family")
    if hf_model is not None and hf_model.startswith("s3://"):
        raise node.error(
            "must be a local folder (sync it from S3 first, or convert it "
            "once and give the converted checkpoint as path)",
            "hf_model",
        )
    return Checkpoint(path, hf_model, family)


def parse_build(node: _Node) -> BuildSettings:
    dtype = node.get("dtype", str, BuildSettings.dtype)
    if dtype in QUANTIZATIONS:
        raise node.error(
            f"{dtype!r} is a quantization: set build.quantization: {dtype} "
            f"(dtype is the compute type, one of {', '.join(DTYPES)})",
            "dtype",
        )
    settings = BuildSettings(
        **{f: node.field(BuildSettings, f) for f in BuildSettings.__dataclass_fields__}
    )
    node.done()
    return settings


def parse_profiles(node: _Node) -> Mapping[str, Profile]:
    if not node.data:
        raise node.error("must name at least one build profile")
    profiles = {}
    for name in list(node.data):
        if not isinstance(name, str) or not PROFILE_NAME.match(name):
            raise node.error(
                f"{name!r} is not a profile name (lower-case letters, digits "
                "and '-', starting with a letter)",
                str(name),
            )
        profiles[name] = parse_profile(name, node.child(name))
    node.done()
    serving = [p.name for p in profiles.values() if p.serve]
    if len(serving) > 1:
        raise node.error(f"only one profile may set serve: true (found {', '.join(serving)})")
    return MappingProxyType(profiles)


def parse_profile(name: str, node: _Node) -> Profile:
    max_input_len = node.field(Profile, "max_input_len")
    max_seq_len = node.field(Profile, "max_seq_len")
    if max_seq_len < max_input_len:
        raise node.error(
            f"must be >= max_input_len ({max_input_len}), got {max_seq_len}", "max_seq_len"
        )
    profile = Profile(
        name=name,
        max_batch_size=node.field(Profile, "max_batch_size"),
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        max_num_tokens=node.field(Profile, "max_num_tokens"),
        max_beam_width=node.field(Profile, "max_beam_width"),
        plugins=parse_plugins(node.child("plugins")),
        weight_streaming=node.get("weight_streaming", bool, False),
        speculative=_optional_speculative(node.child("speculative")),
        serve=node.get("serve", bool, False),
    )
    node.done()
    _check_token_budget(node, profile)
    return profile


def _optional_speculative(node: _Node) -> Speculative | None:
    return parse_speculative(node) if node.data else None


def _check_token_budget(node: _Node, profile: Profile) -> None:
    # Without chunked context a whole prompt must fit into one forward pass.
    if not profile.plugins.paged_context_fmha and profile.max_num_tokens < profile.max_input_len:
        raise node.error(
            f"must be >= max_input_len ({profile.max_input_len}) unless "
            "plugins.paged_context_fmha enables chunked context, got "
            f"{profile.max_num_tokens}",
            "max_num_tokens",
        )


def parse_plugins(node: _Node) -> Plugins:
    plugins = Plugins(
        gemm_plugin=node.field(Plugins, "gemm_plugin"),
        paged_kv_cache=node.get("paged_kv_cache", bool, True),
        paged_context_fmha=node.get("paged_context_fmha", bool, False),
        context_fmha=node.get("context_fmha", bool, True),
        remove_input_padding=node.get("remove_input_padding", bool, True),
        multiple_profiles=node.get("multiple_profiles", bool, False),
        tokens_per_block=node.field(Plugins, "tokens_per_block"),
    )
    node.done()
    if not plugins.paged_kv_cache:
        raise node.error(
            "inflight fused batching (the batching trident serves with) needs the paged KV cache",
            "paged_kv_cache",
        )
    if not plugins.remove_input_padding:
        raise node.error("inflight fused batching needs packed inputs", "remove_input_padding")
    if plugins.tokens_per_block & (plugins.tokens_per_block - 1):
        raise node.error(
            f"must be a power of two, got {plugins.tokens_per_block}", "tokens_per_block"
        )
    if plugins.paged_context_fmha and not plugins.context_fmha:
        raise node.error("needs context_fmha: true", "paged_context_fmha")
    return plugins


def parse_speculative(node: _Node) -> Speculative:
    mode = node.field(Speculative, "mode")
    spec = Speculative(
        mode=mode,
        max_draft_len=node.field(Speculative, "max_draft_len"),
        draft_model=node.get("draft_model", str, None),
        heads_model=node.get("heads_model", str, None),
        num_heads=node.field(Speculative, "num_heads"),
    )
    node.done()
    if mode == "draft-model":
        if spec.draft_model is None:
            raise node.error(
                "is required for mode draft-model (the draft model's name)", "draft_model"
            )
        for key in ("heads_model", "num_heads"):
            if getattr(spec, key) is not None:
                raise node.error("only applies to medusa and eagle", key)
    else:
        if spec.heads_model is None:
            raise node.error(
                f"is required for mode {mode} (the folder of its weights)", "heads_model"
            )
        if spec.num_heads is None:
            raise node.error(f"is required for mode {mode}", "num_heads")
        if spec.draft_model is not None:
            raise node.error("only applies to mode draft-model", "draft_model")
    return spec


def parse_tokenizer(node: _Node) -> Tokenizer:
    tokenizer = Tokenizer(
        path=node.get("path", str), skip_special_tokens=node.get("skip_special_tokens", bool, True)
    )
    node.done()
    return tokenizer


# ---------------------------------------------------------------------------------------
# The model as a whole (after every section parsed)


def check_model(args: Mapping[str, Any], extra: Mapping[str, Any], node: _Node) -> None:
    """Cross-section rules of one tensorrt_llm model; `node` is the model's node."""
    for key in ("checkpoint", "profiles"):
        if key not in extra:
            raise node.error("is required for engine tensorrt_llm", key)
    checkpoint: Checkpoint = extra["checkpoint"]
    build: BuildSettings = extra.get("build", BuildSettings())
    if not checkpoint.needs_conversion and build.quantization != "none":
        raise node.error(
            "applies when trident converts checkpoint.hf_model; a converted "
            "checkpoint (checkpoint.path) is already quantized",
            "build.quantization",
        )
    if "tokenizer" not in extra and not checkpoint.needs_conversion:
        raise node.error(
            "is required when checkpoint.path is a converted checkpoint (it holds no tokenizer)",
            "tokenizer",
        )
    for name, profile in extra["profiles"].items():
        _check_profile_build(node, f"profiles.{name}", profile, checkpoint, build)
    _check_runtime_args(node, args, serving_profile(extra))


def _check_profile_build(
    node: _Node, where: str, profile: Profile, checkpoint: Checkpoint, build: BuildSettings
) -> None:
    speculative = profile.speculative
    if speculative and speculative.mode in ("medusa", "eagle"):
        if not checkpoint.needs_conversion:
            raise node.error(
                f"{speculative.mode} heads are merged at conversion: use checkpoint.hf_model",
                f"{where}.speculative.mode",
            )
        if build.quantization in MODELOPT_QUANTIZATIONS or build.kv_cache_dtype == "fp8":
            raise node.error(
                f"the {speculative.mode} convert script merges the heads but "
                "cannot run ModelOpt quantization (fp8, AWQ, SmoothQuant)",
                f"{where}.speculative.mode",
            )
    if profile.plugins.gemm_plugin == "fp8" and build.quantization != "fp8":
        raise node.error("fp8 needs build.quantization: fp8", f"{where}.plugins.gemm_plugin")


def _check_runtime_args(node: _Node, args: Mapping[str, Any], profile: Profile) -> None:
    """Runtime switches that need build support (docs/trtllm.md, 'The spec')."""
    where = f"profiles.{profile.name}"
    if args.get("enable_kv_cache_reuse") and not profile.plugins.paged_context_fmha:
        raise node.error(
            f"needs the served profile {profile.name!r} built with "
            f"{where}.plugins.paged_context_fmha: true",
            "engine_args.enable_kv_cache_reuse",
        )
    if args.get("enable_chunked_context") and not profile.plugins.paged_context_fmha:
        raise node.error(
            f"needs the served profile {profile.name!r} built with "
            f"{where}.plugins.paged_context_fmha: true",
            "engine_args.enable_chunked_context",
        )
    if args.get("gpu_weights_percent", 1) < 1 and not profile.weight_streaming:
        raise node.error(
            f"< 1 needs the served profile {profile.name!r} built with "
            f"{where}.weight_streaming: true",
            "engine_args.gpu_weights_percent",
        )
    batch = args.get("max_batch_size")
    if batch is not None and batch > profile.max_batch_size:
        raise node.error(
            f"{batch} exceeds the served profile's max_batch_size ({profile.max_batch_size})",
            "engine_args.max_batch_size",
        )
    beams = args.get("max_beam_width")
    if beams is not None and beams > profile.max_beam_width:
        raise node.error(
            f"{beams} exceeds the served profile's max_beam_width ({profile.max_beam_width})",
            "engine_args.max_beam_width",
        )


def serving_profile(extra: Mapping[str, Any]) -> Profile:
    """The profile `trident repo` serves: the one marked serve: true, else the first."""
    profiles = list(extra["profiles"].values())
    return next((p for p in profiles if p.serve), profiles[0])


def sections(model) -> tuple[Checkpoint, BuildSettings, Mapping[str, Profile]]:
    """A parsed tensorrt_llm ModelSpec's build inputs."""
    return (
        model.extra["checkpoint"],
        model.extra.get("build", BuildSettings()),
        model.extra["profiles"],
    )


def tokenizer_path(model) -> str:
    tokenizer = model.extra.get("tokenizer")
    return tokenizer.path if tokenizer else model.extra["checkpoint"].hf_model
