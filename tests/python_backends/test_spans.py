"""trident_common/spans.py: spans made without the SDK's live Span, ended into the SDK's
own span processors as its ReadableSpan. What an exporter receives must be what the
SDK's tracer would have handed it: ids, parent, sampling, attributes, status, times."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from trident_common.spans import Spans

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def memory(ratio: float = 1.0) -> tuple[Spans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "test"})
    return Spans(SimpleSpanProcessor(exporter), resource, "trident.test", ratio), exporter


def test_a_child_keeps_its_parents_trace_and_is_exported_once_with_what_was_set():
    spans, exporter = memory()
    parent = spans.parent(f"00-{TRACE}-{SPAN}-01")
    span = spans.start("route router", parent, attributes={"a": 1}, start_ns=1_000)
    span.set_attributes({"list": ["x", "y"], "flag": True})
    span.set_status(Status(StatusCode.ERROR, "no backend"))
    span.end(end_ns=5_000)
    span.end()  # a second end sends nothing more
    (sent,) = exporter.get_finished_spans()
    assert format(sent.context.trace_id, "032x") == TRACE
    assert format(sent.parent.span_id, "016x") == SPAN
    assert span.traceparent == f"00-{TRACE}-{sent.context.span_id:016x}-01"
    assert dict(sent.attributes) == {"a": 1, "list": ("x", "y"), "flag": True}
    assert (sent.status.status_code, sent.status.description) == (StatusCode.ERROR, "no backend")
    assert (sent.start_time, sent.end_time, sent.kind) == (1_000, 5_000, SpanKind.INTERNAL)
    assert sent.resource.attributes["service.name"] == "test"
    assert sent.instrumentation_scope.name == "trident.test"


def test_an_unsampled_parent_makes_an_unsampled_child_that_is_never_exported():
    spans, exporter = memory()
    span = spans.start("generate m", spans.parent(f"00-{TRACE}-{SPAN}-00"))
    assert span.traceparent.endswith("-00") and TRACE in span.traceparent
    span.end()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("ratio, exported", [(0.0, 0), (1.0, 50)])
def test_a_new_trace_is_sampled_by_the_ratio(ratio, exported):
    spans, exporter = memory(ratio)
    for _ in range(50):
        spans.start("POST /v1/completions", kind=SpanKind.SERVER).end()
    assert len(exporter.get_finished_spans()) == exported


def test_half_the_new_traces_are_sampled_at_ratio_one_half():
    spans, exporter = memory(0.5)
    for _ in range(2000):
        spans.start("POST /v1/completions").end()
    assert 800 < len(exporter.get_finished_spans()) < 1200  # 1000 +- 9 sigma


@pytest.mark.parametrize(
    "header", [None, "", "garbage", f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01"]
)
def test_what_names_no_parent_is_none(header):
    spans, _ = memory()
    assert spans.parent(header) is None
