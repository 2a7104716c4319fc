"""An engine model's spans lost on their way to the collector are counted on its Triton
counters as they are lost (SpanLosses' on_loss, written from the outbox thread), with
no periodic task to read them: trident's SGLang model on the engine double, traces on."""

from __future__ import annotations

import json

from builder.serve.server import free_port
from tests.python_backends.test_sglang_model import _serve, make_request, repo  # noqa: F401
from trident_common.interface import TRACEPARENT
from trident_common.tracing import ENDPOINT_ENV

DROPPED = "trident_trace_spans_dropped_total"
FAILED = "trident_trace_spans_export_failed_total"
SAMPLED_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_dropped_and_a_failed_span_are_counted_as_they_are_lost(repo, monkeypatch):  # noqa: F811
    # The collector's port listens to nobody: nothing sent there could arrive.
    monkeypatch.setenv(ENDPOINT_ENV, f"http://127.0.0.1:{free_port()}/v1/traces")
    for served in _serve(repo, monkeypatch):
        losses = served.model.traces.losses
        losses.capacity = 0  # the export queue is full: the request's span is dropped
        request = make_request(text_input="hi", max_tokens=4)
        request.parameters = lambda: json.dumps({TRACEPARENT: SAMPLED_PARENT})
        served.model.execute([request])
        request.sender.wait_closed()
        served.wait_metric(DROPPED, 1)
        losses.failed_export(3)  # as the export thread counts a refused batch of three
        served.wait_metric(FAILED, 3)
        assert served.metric(DROPPED) == 1
