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


@pytest.mark.parametrize("flags, exported", [("01", 1), ("00", 0)])
def test_a_span_begun_under_a_traceparent_is_the_one_start_would_make(flags, exported):
    # start_under reads the traceparent at the span's end, not at its start.
    spans, exporter = memory()
    span = spans.start_under(f"00-{TRACE}-{SPAN}-{flags}", "generate m", 1_000, {"a": 1})
    span.end(end_ns=2_000)
    assert len(exporter.get_finished_spans()) == exported
    assert span.traceparent.startswith(f"00-{TRACE}-") and span.traceparent.endswith(flags)
    if exported:
        (sent,) = exporter.get_finished_spans()
        assert format(sent.parent.span_id, "016x") == SPAN
        assert (sent.start_time, sent.end_time, dict(sent.attributes)) == (1_000, 2_000, {"a": 1})


def test_a_childs_traceparent_asked_before_the_end_is_the_one_exported():
    spans, exporter = memory()
    span = spans.start_under(f"00-{TRACE}-{SPAN}-01", "generate m", 1_000, {})
    handed_on = span.traceparent  # vLLM's trace headers, before the span ends
    span.end()
    (sent,) = exporter.get_finished_spans()
    assert handed_on == f"00-{TRACE}-{sent.context.span_id:016x}-01"


def test_a_span_under_what_is_no_traceparent_starts_a_trace_of_its_own():
    spans, exporter = memory()
    spans.start_under("not a traceparent", "generate m", 1_000, {}).end()
    (sent,) = exporter.get_finished_spans()
    assert sent.parent is None and format(sent.context.trace_id, "032x") != TRACE


def test_a_reparented_span_joins_the_new_parents_trace_and_links_the_old_one():
    spans, exporter = memory()
    other = "0af7651916cd43dd8448eb211c80319c"
    span = spans.start("route router", spans.parent(f"00-{TRACE}-{SPAN}-01"))
    span_id = span.context.span_id
    spans.reparent(span, spans.parent(f"00-{other}-b7ad6b7169203331-01"))
    span.end()
    (sent,) = exporter.get_finished_spans()
    assert format(sent.context.trace_id, "032x") == other and sent.context.span_id == span_id
    assert format(sent.parent.span_id, "016x") == "b7ad6b7169203331"
    (link,) = sent.links
    assert format(link.context.trace_id, "032x") == TRACE


@pytest.mark.parametrize(
    "caller", [f" 00-{TRACE}-{SPAN}-01", f"cc-{TRACE}-{SPAN}-01-more", f"00-{TRACE}-{SPAN}-03"]
)
def test_a_traceparent_of_another_layout_is_read_before_it_is_handed_on(caller):
    # Valid, but not the fixed version-00 layout the unread form takes its text from.
    spans, exporter = memory()
    span = spans.start_under(caller, "route router", 1_000, {})
    handed_on = span.traceparent
    span.end()
    (sent,) = exporter.get_finished_spans()
    assert handed_on == f"00-{TRACE}-{sent.context.span_id:016x}-01"


def test_an_invalid_traceparent_hands_on_one_its_reader_refuses_too():
    spans, exporter = memory()
    span = spans.start_under(f"00-{'0' * 32}-{SPAN}-01", "route router", 1_000, {})
    assert spans.parent(span.traceparent) is None  # the child starts a trace of its own
    span.end()
    (sent,) = exporter.get_finished_spans()
    assert sent.parent is None  # and so does this span
