"""Which engine arguments each engine accepts, checked at `trident repo` time.

An unknown or mistyped argument fails the render with the field path, instead of failing
minutes later when the engine starts inside Triton. The tables list the arguments
trident supports and passes through verbatim to the engine.
"""

from __future__ import annotations

import math
from typing import Any

from builder.spec import adapters as adapters_spec
from builder.spec import trtllm as trtllm_spec
from builder.spec.node import SpecError

_NUM = (int, float)
_OPT_STR = (str, type(None))

# vLLM AsyncEngineArgs fields (vllm 0.x naming), the knobs a deployment tunes.
VLLM_ARGS: dict[str, tuple] = {
    "block_size": (int,),
    "enable_prefix_caching": (bool,),
    "enable_chunked_prefill": (bool,),
    "max_num_seqs": (int,),
    "max_num_batched_tokens": (int,),
    "max_model_len": (int,),
    "gpu_memory_utilization": _NUM,
    # The KV cache's size in bytes per device, instead of a share of its memory (on a CPU
    # instance it replaces trident's 1 GiB default, python_backends/vllm/model.py).
    "kv_cache_memory_bytes": (int,),
    "kv_cache_dtype": (str,),
    "quantization": _OPT_STR,
    "dtype": (str,),
    "tensor_parallel_size": (int,),
    "pipeline_parallel_size": (int,),
    "speculative_config": (dict,),
    "enforce_eager": (bool,),
    "seed": (int,),
    "trust_remote_code": (bool,),
    "tokenizer": (str,),
    "served_model_name": (str,),
    "max_logprobs": (int,),
    "disable_log_stats": (bool,),
    "enable_lora": (bool,),
    "max_loras": (int,),
    "max_lora_rank": (int,),
    "max_cpu_loras": (int,),
    "cpu_offload_gb": _NUM,
    "distributed_executor_backend": (str,),
    # vLLM's StructuredOutputsConfig fields (backend, disable_any_whitespace, ...): trident's
    # vLLM model fills only what this leaves unset (structured_outputs_settings).
    "structured_outputs_config": (dict,),
    # Not an AsyncEngineArgs field: trident's vLLM model takes it out and reads tool calls
    # with vLLM's ToolParserManager parser of that name (tool_choice "auto").
    "tool_call_parser": (str,),
    # Tokens per streamed response after the first (which leaves at once), as vLLM's
    # `--stream-interval`: fewer responses for every hop to carry, longer gaps between
    # them (docs/spec.md says where that helps, measured).
    "stream_interval": (int,),
}

# sglang.Engine / ServerArgs fields.
SGLANG_ARGS: dict[str, tuple] = {
    "tp_size": (int,),
    "pp_size": (int,),
    "dp_size": (int,),
    "mem_fraction_static": _NUM,
    "context_length": (int,),
    "chunked_prefill_size": (int,),
    "schedule_policy": (str,),
    "quantization": _OPT_STR,
    "dtype": (str,),
    "kv_cache_dtype": (str,),
    "max_running_requests": (int,),
    "max_prefill_tokens": (int,),
    "disable_radix_cache": (bool,),
    "speculative_algorithm": (str,),
    "speculative_draft_model_path": (str,),
    "speculative_num_steps": (int,),
    "speculative_eagle_topk": (int,),
    "speculative_num_draft_tokens": (int,),
    "random_seed": (int,),
    "trust_remote_code": (bool,),
    "tokenizer_path": (str,),
    "attention_backend": (str,),
    "enable_metrics": (bool,),
    "log_level": (str,),
    "incremental_streaming_output": (bool,),  # trident's model handles both stream forms
    "tool_call_parser": (str,),  # SGLang's FunctionCallParser name (qwen25, llama3, ...)
    "stream_interval": (int,),  # as vLLM's (above)
}

# Runtime knobs of the tensorrtllm backend (config.pbtxt parameters); build-time knobs live
# in the model's `build:` and `profiles:` sections instead.
TRTLLM_ARGS: dict[str, tuple] = {
    "kv_cache_free_gpu_mem_fraction": _NUM,
    "enable_kv_cache_reuse": (bool,),
    "batch_scheduler_policy": (str,),
    "max_tokens_in_paged_kv_cache": (int,),
    "max_attention_window_size": (int,),
    "enable_chunked_context": (bool,),
    "exclude_input_in_output": (bool,),
    "max_queue_delay_microseconds": (int,),
    "max_beam_width": (int,),
    "decoding_mode": (str,),
    "gpu_weights_percent": _NUM,
    "max_batch_size": (int,),
}

ENGINE_ARGS = {"vllm": VLLM_ARGS, "sglang": SGLANG_ARGS, "tensorrt_llm": TRTLLM_ARGS}

# Sections of a model besides engine_args: TRT-LLM build inputs, LoRA adapters.
TRTLLM_SECTIONS = ("checkpoint", "build", "profiles", "tokenizer")
EXTRA_SECTIONS: dict[str, tuple[str, ...]] = {
    "tensorrt_llm": TRTLLM_SECTIONS + adapters_spec.SECTIONS,
    "vllm": adapters_spec.SECTIONS,
    "sglang": adapters_spec.SECTIONS,
}

_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
CHOICES = {
    ("sglang", "schedule_policy"): (
        "lpm",
        "random",
        "fcfs",
        "dfs-weight",
        "lof",
        "priority",
        "routing-key",
        "hrrn",
        "shortest-prefill-first",
    ),
    ("tensorrt_llm", "batch_scheduler_policy"): ("max_utilization", "guaranteed_no_evict"),
    ("vllm", "kv_cache_dtype"): ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
    # The weights' dtype: vLLM 0.32's ModelDType and SGLang's --dtype choices (the same).
    ("vllm", "dtype"): _DTYPES,
    ("sglang", "dtype"): _DTYPES,
    # vLLM 0.32's registered tool parsers (vllm/tool_parsers/__init__.py); a test checks
    # this list against the installed vLLM. SGLang's names are its own to check at start.
    ("vllm", "tool_call_parser"): (
        "apertus",
        "cohere_command3",
        "cohere_command4",
        "deepseek_v3",
        "deepseek_v31",
        "deepseek_v32",
        "deepseek_v4",
        "deepseek_v41",
        "dots",
        "ernie45",
        "functiongemma",
        "gemma4",
        "gigachat3",
        "glm45",
        "glm47",
        "granite",
        "granite-20b-fc",
        "granite4",
        "hermes",
        "hf",
        "hunyuan_a13b",
        "hy_v3",
        "hy_v4",
        "inkling",
        "internlm",
        "jamba",
        "k2_horizon",
        "kimi_k2",
        "kimi_k3",
        "lfm2",
        "ling3",
        "llama3_json",
        "llama4_json",
        "llama4_pythonic",
        "longcat",
        "mimo",
        "minicpm5",
        "minimax_m2",
        "minimax_m3",
        "mistral",
        "muse_glimmer",
        "olmo3",
        "openai",
        "phi4_mini_json",
        "plamo3",
        "poolside_v1",
        "pythonic",
        "qwen3_coder",
        "qwen3_json",
        "qwen3_xml",
        "seed_oss",
        "step3",
        "step3p5",
        "xlam",
    ),
}

POSITIVE_INTS = {
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "tp_size",
    "pp_size",
    "dp_size",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "context_length",
    "max_batch_size",
    "kv_cache_memory_bytes",
    "stream_interval",
}
NON_NEGATIVE = {
    "cpu_offload_gb",
    "max_logprobs",
    "seed",
    "max_loras",
    "max_lora_rank",
    "random_seed",
    "max_running_requests",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_tokens_in_paged_kv_cache",
    "max_attention_window_size",
    "max_queue_delay_microseconds",
    "max_beam_width",
}
MAX_INT = 2**63 - 1  # what the engines' C++ sides can hold

# vLLM's SpeculativeConfig fields a spec may set (vllm/config/speculative.py, vllm 0.32;
# the *_config fields vLLM fills in itself are left out).
VLLM_SPECULATIVE_KEYS = frozenset(
    {
        "enforce_eager",
        "num_speculative_tokens",
        "model",
        "method",
        "draft_tensor_parallel_size",
        "tensor_parallel_size",
        "quantization",
        "moe_backend",
        "attention_backend",
        "kv_cache_dtype",
        "max_model_len",
        "revision",
        "code_revision",
        "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch",
        "disable_eagle_block_drop",
        "use_local_argmax_reduction",
        "use_heterogeneous_vocab",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "enable_adaptive_verification",
        "draft_sample_method",
        "dspark_draft_topk",
    }
)
FRACTIONS = {
    "gpu_memory_utilization",
    "mem_fraction_static",
    "kv_cache_free_gpu_mem_fraction",
    "gpu_weights_percent",
}


def validate(engine: str, args: Any, path: str, file: str) -> dict[str, Any]:
    """Check `engine_args` of one model against its engine's table; returns a plain dict."""
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise SpecError(file, path, "expected a mapping")
    table = ENGINE_ARGS[engine]
    checked = dict(args)
    for key, value in args.items():
        where = f"{path}.{key}"
        if key not in table:
            raise SpecError(
                file, where, f"unknown {engine} engine argument (known: {', '.join(sorted(table))})"
            )
        kinds = table[key]
        if int in kinds and float not in kinds and isinstance(value, float) and value.is_integer():
            # 1024.0 is an integer to JSON Schema (the spec's schema says "integer").
            value = checked[key] = int(value)
        if isinstance(value, bool) and bool not in kinds:
            raise SpecError(file, where, "expected a number or string, got a boolean")
        if not isinstance(value, kinds):
            names = "/".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise SpecError(file, where, f"expected {names}, got {type(value).__name__}")
        _check_number(file, where, value)
        if key == "speculative_config":
            _check_speculative(file, where, value)
        options = CHOICES.get((engine, key))
        if options and value not in options:
            raise SpecError(file, where, f"{value!r} is not one of {', '.join(options)}")
        if key in POSITIVE_INTS and value < 1:
            raise SpecError(file, where, f"must be >= 1, got {value}")
        if key in NON_NEGATIVE and value < 0:
            raise SpecError(file, where, f"must be >= 0, got {value}")
        if key in FRACTIONS and not 0 < value <= 1:
            raise SpecError(file, where, f"must be in (0, 1], got {value}")
    return checked


def _check_number(file: str, where: str, value: Any) -> None:
    """Numbers anywhere in an argument (nested ones too) are finite and fit a 64-bit int:
    NaN, inf and 10**100 would reach the engine as nonsense or crash JSON readers."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_number(file, f"{where}.{key}", item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_number(file, f"{where}[{i}]", item)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SpecError(file, where, f"must be a finite number, got {value}")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise SpecError(file, where, "is too large (more than 64 bits)")


def _check_speculative(file: str, where: str, config: dict) -> None:
    """Unknown keys fail here, not minutes later when vLLM builds its SpeculativeConfig."""
    for key in config:
        if key not in VLLM_SPECULATIVE_KEYS:
            raise SpecError(
                file,
                f"{where}.{key}",
                "unknown vLLM speculative_config field "
                f"(known: {', '.join(sorted(VLLM_SPECULATIVE_KEYS))})",
            )


def validate_extra(engine: str, key: str, node) -> Any:
    """Engine-specific sections (TRT-LLM checkpoint/build/profiles) are parsed by their
    engine module into frozen objects; LoRA sections by builder/spec/adapters.py."""
    if key in adapters_spec.SECTIONS:
        return adapters_spec.parse_section(key, node)

    return trtllm_spec.parse_section(key, node)


def check_model(engine: str, args: dict[str, Any], extra: dict[str, Any], node) -> None:
    """Rules across a model's sections, e.g. runtime switches that need build support."""
    adapters_spec.check_model(engine, args, extra, node)
    if engine == "tensorrt_llm":
        trtllm_spec.check_model(args, extra, node)
