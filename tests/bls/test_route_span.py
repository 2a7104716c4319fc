"""The router's span of a traced request (bls/model.py with trident_common/tracing.py's
RouteRecord), on the router with its fake backends: a fallback names the backend that
failed and the one that answered, the backend's request is the span's child, an
untraced request makes no span, and a request no backend takes is an error span."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.bls.test_model import ClientRequest, FakeBackend, router, run  # noqa: F401
from trident_common import interface, tracing
from trident_common.spans import Spans

TRITON_TRACE, TRITON_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRITONS = f"00-{TRITON_TRACE}-{TRITON_SPAN}-01"  # Triton's span of the router's request


@pytest.fixture
def traced(router):  # noqa: F811 - test_model's fixture, used by name
    """A router whose spans go to memory: (make(backends), exporter)."""
    exporter = InMemorySpanExporter()
    spans = Spans(SimpleSpanProcessor(exporter), Resource.create({}), "trident.engine")

    def make(backends):
        model = router(backends=backends)
        model.traces = tracing.EngineTraces(spans, model.name, tracing.SpanLosses())
        return model

    yield make, exporter
    spans.shutdown()


def test_a_fallback_names_the_failed_backend_and_the_one_that_answered(traced):
    make, exporter = traced
    backup = FakeBackend("backup")
    model = make([FakeBackend("primary", first_error="boom"), backup])
    request = ClientRequest(traced=TRITONS)
    run(model, request)
    assert request.served_by() == {"backup"}
    (span,) = exporter.get_finished_spans()
    assert span.name == f"route {model.name}"
    assert format(span.parent.span_id, "016x") == TRITON_SPAN
    attributes = dict(span.attributes)
    assert attributes.pop("trident.route.failures") == ("primary: boom",)
    assert attributes == {
        "trident.route.outcome": "answered",
        "trident.route": "default",
        "trident.route.candidates": ("primary", "backup"),
        "trident.route.backend": "backup",
        "trident.route.breaker_state": "closed",
    }
    # The backend's request is the router span's child (its engine model's span is).
    context = span.context
    own = f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
    assert backup.parameters[-1][interface.TRACEPARENT] == own


def test_an_untraced_request_makes_no_span(traced):
    make, exporter = traced
    backend = FakeBackend("primary")
    model = make([backend])
    run(model, ClientRequest())
    assert exporter.get_finished_spans() == ()
    assert interface.TRACEPARENT not in backend.parameters[-1]


def test_a_request_every_backend_failed_is_an_error_span_with_the_reason(traced):
    make, exporter = traced
    model = make([FakeBackend("primary", first_error="p"), FakeBackend("backup", first_error="b")])
    run(model, ClientRequest(traced=TRITONS))
    (span,) = exporter.get_finished_spans()
    assert span.attributes["trident.route.outcome"] == "all_failed"
    assert span.attributes["trident.route.failures"] == ("primary: p", "backup: b")
    assert span.status.status_code is StatusCode.ERROR


def test_the_spans_the_router_loses_are_counted_as_they_are_lost(router, monkeypatch):  # noqa: F811
    """The router's export counts each loss on the thread that saw it (SpanLosses'
    on_loss): written at once, not with some later request (a bench saw a router's
    count stand still after its last traced request)."""
    monkeypatch.setenv(tracing.ENDPOINT_ENV, "http://127.0.0.1:9/v1/traces")  # nobody there
    model = router(backends=[FakeBackend("primary")])
    assert ("trace_failed", ()) not in model.metrics.metrics
    model.traces.losses.failed_export(2)  # as the exporter's thread counts a failed batch
    assert ("trace_failed", ()) in model.metrics.metrics
    assert ("trace_dropped", ()) not in model.metrics.metrics
