"""trident's tensor interface, defined once.

The router and the vLLM/SGLang models speak it (Triton's LLM dialect, see DESIGN.md
"Interface conventions"); the TRT-LLM ensemble speaks its own batch-dimension variant,
mapped here too. The Python code reads these lists, and the builder hands this module to
the jinja templates (builder.render.context), which write every config.pbtxt from them:
a new hint, input or output is added here and nowhere else.

Pure Python with no imports from trident: the builder and the frontend import it
without the rest, and every rendered model directory carries it inside its copy of
trident_common.
"""

from __future__ import annotations

from typing import NamedTuple


class Tensor(NamedTuple):
    name: str
    dtype: str  # Triton's data_type
    dims: tuple[int, ...]  # as in config.pbtxt (-1: any length)
    optional: bool = False  # inputs only


def _text(name: str) -> Tensor:
    return Tensor(name, "TYPE_STRING", (1,), True)


# vllm_backend's `return_<output>` flags: a client that sends any of them gets text_output
# and the outputs it asked for (trident_common/returns.py); one that sends none gets the
# usual outputs (LLM_OUTPUTS less the two logprob ones).
RETURNABLE = (
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
)

# What a client sends to the router, and the router to a vLLM or SGLang model.
REQUEST_INPUTS = (
    (
        _text("text_input"),
        _text("messages"),  # chat: JSON list of {role, content} (request.py)
        Tensor("stream", "TYPE_BOOL", (1,), True),
        _text("sampling_parameters"),  # JSON object of vLLM-style sampling values
        Tensor("max_tokens", "TYPE_INT32", (1,), True),
        Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True),
    )
    + tuple(Tensor(f"return_{name}", "TYPE_BOOL", (1,), True) for name in RETURNABLE)
    + (
        # Tool calling (chat only; trident_common/tool_calls.py): OpenAI's `tools` as a JSON
        # list, and `tool_choice` as none / auto / required / a function's name (or OpenAI's
        # {"type": "function", "function": {"name": ...}} object as JSON).
        _text("tools"),
        _text("tool_choice"),
    )
)
# Control inputs: the router names each request it forwards, and aborts it by that name
# (a BLS response iterator cannot cancel).
REQUEST_ID, ABORT_REQUEST_ID = "request_id", "abort_request_id"
CONTROL_INPUTS = (_text(REQUEST_ID), _text(ABORT_REQUEST_ID))
# Routing hints: the router reads them (as inputs or request parameters) and never
# forwards them; bls/policy.py gives each its meaning.
HINT_NAMES = ("route", "task", "family", "tenant", "tier", "conversation_id", "shared_prefix")
# One choice of an OpenAI request's n (the frontend's fan-out: one Triton request per
# choice): request parameters the frontend sets on each of the n, read by the router,
# which admits the n under the tenant's limits as one unit (bls/tenants.py) and never
# forwards them. The group is a random id per OpenAI request, the same on its n calls.
FAN_OUT_GROUP, FAN_OUT_N, FAN_OUT_INDEX = "fan_out_group", "fan_out_n", "fan_out_index"

# Set by the router from the spec's `tenants:` (bls/tenants.py), never by a client: the
# tenant's tier as vLLM's request priority, and its prefix-cache salt (the router's proof
# covers both, trust.py).
PRIORITY, CACHE_SALT = "priority", "cache_salt"
TENANT_INPUTS = (Tensor(PRIORITY, "TYPE_INT32", (1,), True), _text(CACHE_SALT))

# The environment variable holding the per-server secret the router proves itself with to the
# engine models (trident_common/trust.py). `trident serve` sets it per start when absent; the
# engine models honour tenant-sensitive inputs (TENANT_INPUTS, ABORT_REQUEST_ID) only from a
# request that carries a proof derived from it.
ROUTER_SECRET_ENV = "TRIDENT_ROUTER_SECRET"
# The environment variable naming the folder through which `trident serve` tells its models
# that it drains (trident_common/drain.py says what is in it). Unset: the models never drain.
DRAIN_DIR_ENV = "TRIDENT_DRAIN_DIR"
# The environment variable naming the folder where engines that keep their own gauges in
# files (SGLang's scheduler) write them, one folder per model instance, for the OpenAI
# frontend's pod load (trident_common/engine_gauges.py). Unset: they keep none.
ENGINE_GAUGES_DIR_ENV = "TRIDENT_ENGINE_GAUGES_DIR"
# The request parameter that carries the router's proof (trust.py); the router never
# forwards a client's parameter of this name.
ROUTER_PROOF = "trident_router_proof"
# The request parameter (true) a BLS caller, the router, sets to receive an engine model's
# refusal as a data response (the `error` output, with the final flag) rather than as an
# error response. Triton 2.51's python_backend loses the id of an error response to a BLS
# call: the caller's iterator never ends (a router thread waits forever per refused
# request) and another call's iterator may get the error. A direct client may set it too:
# it changes only how its own errors reach it.
ERRORS_IN_BAND = "trident_errors_in_band"
# The request parameter by which the router hands a backend request the W3C traceparent
# of its own span in Triton's trace (traces on: builder/serve/tracing.py), so the engine
# model's span (trident_common/tracing.py) joins the request's trace. The router never
# forwards a client's parameter of this name; the OpenAI frontend sends the router its own
# span's in it, which the router's span falls back on when tritonserver loses the gRPC
# metadata's (tracing.EngineTraces.route).
TRACEPARENT = "trident_traceparent"
# How many of a router instance's BLS calls wait for their engine's first response at once
# (the rest wait in the router, bls/model.py). In tritonserver each such call holds a thread
# of the Python backend's per-instance pool until that response, and the same pool carries
# every response the instance sends, so `trident serve` sizes the pool (python_backend's
# `thread-pool-size`, 32 by default) at twice this (builder/serve/server.py). 24 calls in
# Triton's default pool made 64 streams start in waves: +46 to +63 ms TTFT p50 over direct at
# 64 x 100 tokens/s on 16 cores (docs/results/2026-12-04-gpu-rate-h200.md).
BLS_CALL_SLOTS = 64
PYTHON_THREAD_POOL_SIZE = 2 * BLS_CALL_SLOTS
# The priority of a request without the router's proof: the least urgent tenant tier's
# (batch, builder/spec/tenants.py TIERS; lower is scheduled first), so a direct caller,
# who is nobody's tenant, never goes ahead of any tenant.
UNPROVEN_PRIORITY = 2

ENGINE_INPUTS = REQUEST_INPUTS + CONTROL_INPUTS + TENANT_INPUTS
ROUTER_INPUTS = REQUEST_INPUTS + CONTROL_INPUTS + tuple(_text(name) for name in HINT_NAMES)
# Inputs the router consumes itself (it sets its own request_id per backend call).
ROUTER_ONLY_INPUTS = frozenset(HINT_NAMES) | {REQUEST_ID, ABORT_REQUEST_ID}

# Every response of the router and of the vLLM/SGLang models carries these. Token counts
# are UINT32 as in vllm_backend; `error` carries a failure after the first response
# (Triton 2.51's BLS drops an error response that follows data).
LLM_OUTPUTS = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("num_input_tokens", "TYPE_UINT32", (1,)),
    Tensor("num_output_tokens", "TYPE_UINT32", (1,)),
    Tensor("served_by", "TYPE_STRING", (1,)),
    Tensor("error", "TYPE_STRING", (1,)),
    Tensor("cumulative_logprob", "TYPE_FP32", (1,)),  # only when asked (return_*)
    Tensor("logprobs", "TYPE_STRING", (1,)),  # JSON, only when asked
    # JSON list of calls in OpenAI's shape, on the last response of an answer that
    # called tools (its finish_reason is then "tool_calls").
    Tensor("tool_calls", "TYPE_STRING", (1,)),
)
OUTPUT_NAMES = tuple(tensor.name for tensor in LLM_OUTPUTS)
OUTPUT_DTYPES = {tensor.name: tensor.dtype for tensor in LLM_OUTPUTS}


# -- TensorRT-LLM's ensemble ----------------------------------------------------------------
class TrtllmInput(NamedTuple):
    ensemble: str  # the ensemble's input (what the router sends)
    dtype: str
    engine: str  # the tensorrtllm backend's input it is mapped to
    sampling: str | None = None  # the vLLM-style sampling name it carries, if any


# Optional ensemble inputs, in config order (tensorrtllm backend v0.16 names and dtypes).
TRTLLM_INPUTS = (
    TrtllmInput("stream", "TYPE_BOOL", "streaming"),
    TrtllmInput("exclude_input_in_output", "TYPE_BOOL", "exclude_input_in_output"),
    TrtllmInput("temperature", "TYPE_FP32", "temperature", "temperature"),
    TrtllmInput("top_p", "TYPE_FP32", "runtime_top_p", "top_p"),
    TrtllmInput("top_k", "TYPE_INT32", "runtime_top_k", "top_k"),
    TrtllmInput("repetition_penalty", "TYPE_FP32", "repetition_penalty", "repetition_penalty"),
    TrtllmInput("presence_penalty", "TYPE_FP32", "presence_penalty", "presence_penalty"),
    TrtllmInput("frequency_penalty", "TYPE_FP32", "frequency_penalty", "frequency_penalty"),
    TrtllmInput("random_seed", "TYPE_UINT64", "random_seed", "seed"),
    TrtllmInput("min_length", "TYPE_INT32", "min_length", "min_tokens"),
)
# vLLM-style sampling name → the ensemble input that carries it.
TRTLLM_SAMPLING = {t.sampling: t for t in TRTLLM_INPUTS if t.sampling}
# The ensemble has batch dimensions (a request is [1, 1]) and needs max_tokens.
TRTLLM_ENSEMBLE_INPUTS = (
    Tensor("text_input", "TYPE_STRING", (1,)),
    Tensor("max_tokens", "TYPE_INT32", (1,)),
) + tuple(Tensor(t.ensemble, t.dtype, (1,), True) for t in TRTLLM_INPUTS)
TRTLLM_ENSEMBLE_OUTPUTS = (Tensor("text_output", "TYPE_STRING", (-1,)),)

# numpy's name for each Triton dtype used above (numpy itself is the stub's to import).
NUMPY_DTYPES = {
    "TYPE_STRING": "object",
    "TYPE_BOOL": "bool",
    "TYPE_INT32": "int32",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_FP32": "float32",
}
