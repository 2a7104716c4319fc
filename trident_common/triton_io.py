"""The Triton side of trident's LLM interface: input getters, responses, metrics.

Only imported inside a Python-backend stub (it needs triton_python_backend_utils).
Errors that happen after the first streamed response are also written into the `error`
output: Triton 2.51's BLS drops an error response that follows a data response, and the
router must still see it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trident_common import interface
from trident_common.error_classes import triton_error
from trident_common.metrics import COUNTER, GAUGE, HISTOGRAM, Metric, MetricSet
from trident_common.request import CLIENT_FAULT_PREFIX

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]


def input_getter(request: pb_utils.InferenceRequest) -> Callable[[str], Any]:
    def get(name: str) -> Any:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get


def request_parameters(request: pb_utils.InferenceRequest) -> dict[str, Any]:
    """The request's Triton parameters (gRPC `parameters`, HTTP `parameters`) as a dict;
    pb_utils hands them over as JSON text."""
    parameters = getattr(request, "parameters", None)
    if parameters is None:
        return {}
    try:
        value = json.loads(parameters() or "{}")
    except (TypeError, ValueError):
        return {}  # Triton writes this JSON itself; nothing a client could fix
    return value if isinstance(value, dict) else {}


# Each output's numpy dtype, from its Triton dtype in the interface.
_OUTPUT_DTYPES = {
    name: np.dtype(interface.NUMPY_DTYPES[dtype]) for name, dtype in interface.OUTPUT_DTYPES.items()
}


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """config.pbtxt's `parameters` of the model being initialized, name → string value."""
    config = json.loads(args.get("model_config") or "{}")
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _output(name: str, value: Any) -> pb_utils.Tensor:
    dtype = _OUTPUT_DTYPES[name]
    if dtype == np.object_:
        value = value.encode("utf-8")
    return pb_utils.Tensor(name, np.array([value], dtype=dtype))


class ResponseFactory:
    """Builds this model's responses; `served_by` is fixed per model.

    It keeps the text, never a pb_utils.Tensor: a Tensor that lives as long as the model
    is freed when the stub's interpreter shuts down, after the stub has released the
    shared memory the Tensor points into, and the stub segfaulted at every unload
    (PbTensor::~PbTensor in Py_FinalizeEx). Tensors built per response die with it."""

    def __init__(self, served_by: str):
        self._served_by = served_by

    def chunk(self, values: dict[str, Any], usual: bool = True) -> pb_utils.InferenceResponse:
        """A data response from returns.Outputs' values; served_by and an empty error
        join them unless the client chose its outputs (return_* flags)."""
        tensors = [_output(name, value) for name, value in values.items()]
        if usual:
            tensors += [_output("served_by", self._served_by), _output("error", "")]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def error_output(self, message: str) -> pb_utils.InferenceResponse:
        """A data response that carries the error in the `error` output (mid-stream)."""
        return pb_utils.InferenceResponse(
            output_tensors=[
                _output("text_output", ""),
                _output("finish_reason", "error"),
                _output("served_by", self._served_by),
                _output("error", message),
            ]
        )

    @staticmethod
    def error(message: str, client_fault: bool = False) -> pb_utils.InferenceResponse:
        """An error response; client_fault marks it INVALID_ARG, which tells the router
        not to count it against this backend's health nor to retry elsewhere. Otherwise
        the message's marker sets the code (a drain's refusal is UNAVAILABLE: Triton's
        HTTP endpoint answers 503); a message without one is INTERNAL."""
        if client_fault:
            message = CLIENT_FAULT_PREFIX + message
        return pb_utils.InferenceResponse(error=triton_error(pb_utils, message))


def send_error(
    sender: pb_utils.ResponseSender,
    factory: ResponseFactory,
    message: str,
    started: bool,
    client_fault: bool = False,
    in_band: bool = False,
) -> None:
    """Finish a request with an error: an error response before any data, else the
    error output; then a flags-only final response. Triton drops the final flag of an
    error response: a gRPC stream client waiting for it would wait forever. For a caller
    that asked for errors in band (interface.ERRORS_IN_BAND: a BLS caller) the error
    output and the final flag go as one response, with the message's class marked."""
    if in_band:
        marked = CLIENT_FAULT_PREFIX + message if client_fault else message
        sender.send(factory.error_output(marked), flags=FINAL)
        return
    if started:
        sender.send(factory.error_output(message))
    else:
        sender.send(factory.error(message, client_fault))
    sender.send(flags=FINAL)


def errors_in_band(parameters: dict[str, Any]) -> bool:
    """Did the caller ask for its errors in band (interface.ERRORS_IN_BAND)?"""
    return parameters.get(interface.ERRORS_IN_BAND) is True


# LlmMetrics' series: (attribute, name, help, kind, histogram buckets).
_LLM_METRICS = [
    (
        "ttft",
        "trident_time_to_first_token_seconds",
        "Time from request arrival to its first generated token",
        HISTOGRAM,
        TTFT_BUCKETS,
    ),
    (
        "itl",
        "trident_inter_token_latency_seconds",
        "Mean time between generated tokens after the first, one observation per request",
        HISTOGRAM,
        ITL_BUCKETS,
    ),
    ("prompt_tokens", "trident_prompt_tokens_total", "Prompt tokens processed", COUNTER, None),
    ("generation_tokens", "trident_generation_tokens_total", "Tokens generated", COUNTER, None),
    ("in_flight", "trident_requests_in_flight", "Requests being generated", GAUGE, None),
    (
        "aborted",
        "trident_requests_aborted_total",
        "Requests aborted in the engine (client cancel or router abort)",
        COUNTER,
        None,
    ),
    ("errors", "trident_request_errors_total", "Requests that ended in an error", COUNTER, None),
    ("requests", "trident_requests_total", "Requests finished (any outcome)", COUNTER, None),
    # Prompt tokens the engine's prefix cache served instead of computing them (vLLM:
    # RequestOutput.num_cached_tokens; SGLang: meta_info.cached_tokens), counted once
    # per request even when it ends early. With prompt_tokens it gives the hit rate.
    (
        "prefix_cached_tokens",
        "trident_prefix_cached_tokens_total",
        "Prompt tokens served from the engine's prefix cache",
        COUNTER,
        None,
    ),
    # Set by the engine model's periodic health check; `trident serve` watches it.
    (
        "engine_healthy",
        "trident_engine_healthy",
        "1 while the engine passes its health check, 0 once it died",
        GAUGE,
        None,
    ),
]


class LlmMetrics:
    """Per-model Prometheus metrics on Triton's metrics port. They outlive the instance
    (see trident_common.metrics): the model's next instance continues the same series."""

    # One per _LLM_METRICS row (set from it in __init__), declared for the type checker.
    ttft: Metric
    itl: Metric
    prompt_tokens: Metric
    generation_tokens: Metric
    in_flight: Metric
    aborted: Metric
    errors: Metric
    requests: Metric
    prefix_cached_tokens: Metric
    engine_healthy: Metric

    def __init__(self, model: str):
        self._set = metrics = MetricSet()
        self._model = model
        self._adapters: dict[str, Metric] = {}
        for attribute, name, description, kind, buckets in _LLM_METRICS:
            setattr(
                self, attribute, metrics.metric(name, description, kind, {"model": model}, buckets)
            )

    def adapter_requests(self, adapter: str) -> Metric:
        """Requests served with a LoRA adapter, per adapter (a series on first use)."""
        if adapter not in self._adapters:
            self._adapters[adapter] = self._set.metric(
                "trident_adapter_requests_total",
                "Requests served with a LoRA adapter",
                COUNTER,
                {"model": self._model, "adapter": adapter},
            )
        return self._adapters[adapter]

    def trace_losses(self) -> tuple[Metric, Metric]:
        """The engine model's spans lost on their way to the collector (traces on only:
        trident_common/tracing.py): dropped at a full export queue, failed to export."""
        return tuple(  # type: ignore[return-value]
            self._set.metric(name, description, COUNTER, {"model": self._model})
            for name, description in (
                (
                    "trident_trace_spans_dropped_total",
                    "Spans of the engine model dropped: its export queue was full",
                ),
                (
                    "trident_trace_spans_export_failed_total",
                    "Spans of the engine model the collector refused or did not take in time",
                ),
            )
        )

    def finalize(self) -> None:
        """Stop writing; the series stay for the model's next instance."""
        self._set.close()
