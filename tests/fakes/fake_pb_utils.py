"""A stand-in for `triton_python_backend_utils`, the module Triton's Python-backend stub
provides: tensors, responses, errors, metrics and a decoupled response sender.

Strict where the real one is strict, so tests catch what would break in a server:
sending after the final flag raises (Triton: "response sender has been closed"), a
response may hold an error or tensors but not both, and a MetricFamily that dies while
one of its metrics is alive is recorded in `metric_violations` (the real stub
segfaults at shutdown then).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

metric_violations: list[str] = []
# is_cancelled() asked of a sender whose final flag went out (or was tried): tritonserver
# 2.51 deleted the request's response factory with that flag and reads the freed memory
# to answer (a segfault of tritonserver, at times). tests/conftest.py fails a test on it.
cancel_checks_after_final: list[str] = []
_metrics_lock = threading.Lock()
_metric_values: dict[tuple, weakref.ref] = {}  # (family name, sorted labels) → Metric


class TritonError(Exception):
    # TRITONSERVER_Error_Code values, as pb_utils.TritonError exposes them.
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED = 0, 1, 2, 3, 4, 5
    ALREADY_EXISTS, CANCELLED = 6, 7

    def __init__(self, message: str, code: int = INTERNAL):
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, value):
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        return self._value


class InferenceResponse:
    def __init__(self, output_tensors=None, error: TritonError | None = None):
        if output_tensors and error is not None:
            raise TritonModelException("a response holds either tensors or an error")
        self._tensors = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def value(self, name: str):
        """The decoded first element of an output tensor (None when absent)."""
        for tensor in self._tensors:
            if tensor.name() == name:
                item = tensor.as_numpy().reshape(-1)[0]
                return item.decode() if isinstance(item, bytes) else item.item()
        return None


def get_input_tensor_by_name(request, name: str) -> Tensor | None:
    return request.inputs.get(name)


class ResponseSender:
    """Records (response, flags) pairs; is_cancelled() is what a test sets."""

    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.cancelled = False
        self.fail_sends = False  # every send raises (a client gone), as Triton's would
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self.closed.is_set():
                raise TritonModelException("response sender has been closed")
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.closed.set()  # the factory goes with a final send, even a failed one
            if self.fail_sends:
                raise TritonModelException("the response could not be sent")
            self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        if self.closed.is_set():
            cancel_checks_after_final.append(f"sender {id(self):x}")
        return self.cancelled

    # -- for tests --------------------------------------------------------------------
    def wait_closed(self, timeout_s: float = 5.0) -> None:
        if not self.closed.wait(timeout_s):
            raise AssertionError(f"no final response within {timeout_s} s: {self.sent}")

    def responses(self) -> list[InferenceResponse]:
        return [r for r, _ in self.sent if r is not None]

    def final_flags(self) -> int:
        return sum(1 for _, flags in self.sent if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class InferenceRequest:
    """What Triton hands execute(): inputs by name and a response sender."""

    def __init__(self, inputs: dict[str, Tensor]):
        self.inputs = inputs
        self.sender = ResponseSender()

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def is_cancelled(self) -> bool:
        return self.sender.cancelled


class Metric:
    def __init__(self, family: MetricFamily, labels: dict, buckets=None):
        self.family_name, self.labels = family.name, dict(labels)
        self._value = 0.0
        self.observations: list[float] = []
        self.buckets = buckets

    def increment(self, value: float) -> None:
        if self.family_name.endswith("_total") and value < 0:
            raise TritonModelException("a counter cannot decrease")
        self._value += value

    def set(self, value: float) -> None:
        self._value = value

    def value(self) -> float:
        return self._value

    def observe(self, value: float) -> None:
        self.observations.append(value)


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

    def __init__(self, name: str, description: str, kind: int):
        self.name, self.description, self.kind = name, description, kind
        self._metrics: list[weakref.ref] = []

    def Metric(self, labels: dict, buckets=None) -> Metric:  # noqa: N802 (pb_utils' name)
        if self.kind == self.HISTOGRAM and not buckets:
            raise TritonModelException("a histogram metric needs buckets")
        metric = Metric(self, labels, buckets)
        self._metrics.append(weakref.ref(metric))
        with _metrics_lock:
            _metric_values[(self.name, tuple(sorted(labels.items())))] = weakref.ref(metric)
        return metric

    def __del__(self):
        if any(ref() is not None for ref in self._metrics):
            metric_violations.append(f"{self.name}: family deleted before its metrics")


def metric(name: str, **labels) -> Metric | None:
    """The latest live Metric created for (family name, labels), or None."""
    with _metrics_lock:
        ref = _metric_values.get((name, tuple(sorted(labels.items()))))
    return None if ref is None else ref()
