"""The router's span of a traced request (trident_common/tracing.py's RouteRecord): its
parent, the traceparent it hands the backend, and the decision written on it. The span
as the served process exports it is checked end to end in tests/server/test_drain.py."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from trident_common import tracing
from trident_common.spans import Spans

TRITON_TRACE, TRITON_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture
def traces():
    exporter = InMemorySpanExporter()
    spans = Spans(SimpleSpanProcessor(exporter), Resource.create({}), "trident.engine")
    yield tracing.EngineTraces(spans, "router", tracing.SpanLosses()), exporter
    spans.shutdown()


def triton_context(flags: str = "01") -> str:
    return json.dumps({"traceparent": f"00-{TRITON_TRACE}-{TRITON_SPAN}-{flags}"})


def test_an_untraced_request_gets_no_record(traces):
    router, exporter = traces
    assert router.route(None) is None
    assert router.route("{}") is None
    assert exporter.get_finished_spans() == ()


def test_the_span_is_the_child_of_tritons_and_the_backend_gets_its_own_traceparent(traces):
    router, exporter = traces
    record = router.route(triton_context())
    version, trace_id, span_id, flags = record.traceparent.split("-")
    assert (version, trace_id, flags) == ("00", TRITON_TRACE, "01")
    assert span_id != TRITON_SPAN  # the router's own span, not Triton's
    record.end()
    (span,) = exporter.get_finished_spans()
    assert span.name == "route router"
    assert format(span.parent.span_id, "016x") == TRITON_SPAN
    assert format(span.context.span_id, "016x") == span_id


def test_a_fallback_answered_request_names_the_failed_backend_and_the_one_that_answered(traces):
    router, exporter = traces
    record = router.route(triton_context())
    record.route, record.candidates = "default", ("qwen", "qwen-backup")
    record.failures.append("qwen: connection refused")
    record.backend, record.breaker = "qwen-backup", "closed"
    record.tenant, record.admission = tracing.tenant_hash(b"k" * 32, "acme"), "admitted"
    record.end()
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes) == {
        "trident.route.outcome": "answered",
        "trident.route": "default",
        "trident.route.candidates": ("qwen", "qwen-backup"),
        "trident.route.failures": ("qwen: connection refused",),
        "trident.route.backend": "qwen-backup",
        "trident.route.breaker_state": "closed",
        "trident.tenant.hash": tracing.tenant_hash(b"k" * 32, "acme"),
        "trident.tenant.admission": "admitted",
    }
    assert span.status.status_code is StatusCode.UNSET


def test_a_refused_request_is_an_error_span_with_the_reason_and_no_backend(traces):
    router, exporter = traces
    record = router.route(triton_context())
    record.route, record.outcome, record.admission = "default", "tenant", "refused"
    record.end()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["trident.route.outcome"] == "tenant"
    assert span.attributes["trident.tenant.admission"] == "refused"
    assert "trident.route.backend" not in span.attributes
    assert span.status.status_code is StatusCode.ERROR


def test_the_tenant_hash_is_keyed_and_names_no_tenant():
    key, other = b"k" * 32, b"o" * 32
    digest = tracing.tenant_hash(key, "acme")
    assert len(digest) == 16 and "acme" not in digest
    assert digest == tracing.tenant_hash(key, "acme")  # one tenant, one name in the traces
    assert digest != tracing.tenant_hash(key, "acme2")
    assert digest != tracing.tenant_hash(other, "acme")  # without the key, no guess confirms


CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
CALLERS = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def test_when_triton_lost_the_callers_parent_the_span_joins_the_callers_trace(traces):
    # Triton traced the request as a new root (TRITON_TRACE) though the caller's
    # metadata named CALLER_TRACE: the router's span keeps the caller's trace whole.
    router, exporter = traces
    record = router.route(triton_context())
    router.follow_caller(record, CALLERS)
    assert record.traceparent.split("-")[1] == CALLER_TRACE  # the engine's span follows
    record.end()
    (span,) = exporter.get_finished_spans()
    assert format(span.parent.trace_id, "032x") == CALLER_TRACE
    assert format(span.parent.span_id, "016x") == CALLER_SPAN
    (link,) = span.links  # Triton's orphaned span, still reachable
    assert format(link.context.trace_id, "032x") == TRITON_TRACE
    assert format(link.context.span_id, "016x") == TRITON_SPAN
    assert span.attributes["trident.triton_parent_lost"] is True


@pytest.mark.parametrize(
    "sent", [f"00-{TRITON_TRACE}-{CALLER_SPAN}-01", None, "", "not a traceparent", "00-0-0-01"]
)
def test_otherwise_tritons_span_is_the_parent(traces, sent):
    # The same trace (Triton kept the parent), none sent, or one that is no traceparent.
    router, exporter = traces
    record = router.route(triton_context())
    router.follow_caller(record, sent)
    record.end()
    (span,) = exporter.get_finished_spans()
    assert format(span.parent.span_id, "016x") == TRITON_SPAN
    assert not span.links and "trident.triton_parent_lost" not in span.attributes


def test_each_loss_is_told_as_it_is_counted():
    told = []
    losses = tracing.SpanLosses(capacity=1, on_loss=lambda d, f: told.append((d, f)))
    assert losses.admit() and not losses.admit()  # the second finds the queue full
    losses.failed_export(3)
    assert told == [(1, 0), (0, 3)]
    assert (losses.dropped, losses.failed) == (1, 3)  # the totals, for the frontend's reader
