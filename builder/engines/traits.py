"""Each engine's vocabulary, in one table: what its arguments that the builder reads are
called, and what the engine supports.

The spec, the planner, placement and the renderer ask this table instead of spelling an
engine's argument names themselves: vLLM calls its tensor parallel size
`tensor_parallel_size`, SGLang `tp_size`, and TensorRT-LLM fixes it at build time in the
model's `build:` section. A new engine, or an engine that renames an argument, is a
change here (plus the engine's argument types in builder/spec/engine_args.py when it is
a new argument the user may set).

The router reads none of this at run time: the builder writes what it needs (each
backend's engine and capacity) into router.json (bls/router_config.py).

This module imports nothing of trident's, so the spec can read it without a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineTraits:
    """One engine. An argument name is None where the engine has no such argument in
    `engine_args` (TensorRT-LLM's parallelism and context come from its build and
    serving profile instead)."""

    name: str  # the spec's `engine:` value
    title: str  # how the rendered config.pbtxt names it
    tp_arg: str | None  # tensor parallel size
    pp_arg: str | None  # pipeline parallel size
    batch_arg: str  # sequences one instance runs at once (the planner's memory sums)
    # The argument the router's in-flight limit per backend follows (router.json's
    # `capacity`); None: the spec's max_inflight_per_backend alone.
    capacity_arg: str | None
    context_arg: str | None  # tokens per sequence
    memory_arg: str | None  # share of a GPU's memory the engine may take
    model_arg: str | None  # where the rendered model.json names the weights
    kv_cache_dtype_arg: str | None
    kv_cache_bytes_arg: str | None  # the KV cache's bytes per GPU, where the spec fixes it
    speculative_arg: str | None  # set (truthy): the engine decodes speculatively
    # Loads the spec's `model:` (TensorRT-LLM serves an engine built from `checkpoint:`).
    needs_model: bool
    # A decoupled Python-backend model running the engine in its stub (python_llm
    # templates, python_backends/<name>/): can be split into replicas behind the router.
    python_backend: bool
    # Parallelism is compiled into the engine (`build:`), not an argument at start.
    built: bool

    def parallelism(self, args: Mapping[str, Any]) -> tuple[int | None, int | None]:
        """The TP and PP the engine arguments `args` fix (None: not set, or set at build)."""
        tp = args.get(self.tp_arg) if self.tp_arg else None
        pp = args.get(self.pp_arg) if self.pp_arg else None
        return tp, pp

    def parallel_args(self, tp: int, pp: int) -> dict[str, int]:
        """The plan's TP and PP, spelled as this engine's arguments; empty when the
        engine takes them from its build."""
        if self.tp_arg is None or self.pp_arg is None:
            return {}
        return {self.tp_arg: tp, self.pp_arg: pp}


VLLM = EngineTraits(
    name="vllm",
    title="vLLM",
    tp_arg="tensor_parallel_size",
    pp_arg="pipeline_parallel_size",
    batch_arg="max_num_seqs",
    capacity_arg="max_num_seqs",
    context_arg="max_model_len",
    memory_arg="gpu_memory_utilization",
    model_arg="model",
    kv_cache_dtype_arg="kv_cache_dtype",
    kv_cache_bytes_arg="kv_cache_memory_bytes",
    speculative_arg="speculative_config",
    needs_model=True,
    python_backend=True,
    built=False,
)

SGLANG = EngineTraits(
    name="sglang",
    title="SGLang",
    tp_arg="tp_size",
    pp_arg="pp_size",
    batch_arg="max_running_requests",
    capacity_arg="max_running_requests",
    context_arg="context_length",
    memory_arg="mem_fraction_static",
    model_arg="model_path",
    kv_cache_dtype_arg="kv_cache_dtype",
    kv_cache_bytes_arg=None,
    speculative_arg="speculative_algorithm",
    needs_model=True,
    python_backend=True,
    built=False,
)

# The tensorrtllm backend's runtime knobs are config.pbtxt parameters; its parallelism,
# context and KV cache precision are fixed when the engine is built (builder/spec/trtllm.py).
TENSORRT_LLM = EngineTraits(
    name="tensorrt_llm",
    title="TensorRT-LLM",
    tp_arg=None,
    pp_arg=None,
    batch_arg="max_batch_size",
    # Not measured behind the router (no TensorRT-LLM here): the ensemble's batch is
    # left out of the in-flight limit, as before the table.
    capacity_arg=None,
    context_arg=None,
    memory_arg=None,
    model_arg=None,
    kv_cache_dtype_arg=None,
    kv_cache_bytes_arg=None,
    speculative_arg=None,
    needs_model=False,
    python_backend=False,
    built=True,
)

# In the order the spec lists them (`trident schema`'s enum, error messages).
TRAITS: dict[str, EngineTraits] = {t.name: t for t in (TENSORRT_LLM, VLLM, SGLANG)}
ENGINES = tuple(TRAITS)
# Engines whose model with `instances: N` behind a router becomes N replicas (one Triton
# model each): the Python-backend ones (builder/plan/replicas.py says why not TRT-LLM).
REPLICA_ENGINES = tuple(t.name for t in TRAITS.values() if t.python_backend)


def traits(engine: str) -> EngineTraits:
    """The engine's traits; the spec admits only the engines of TRAITS."""
    return TRAITS[engine]
