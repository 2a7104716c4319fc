"""Spans made on a request's path at a small fraction of the OpenTelemetry SDK's cost.

Why not the SDK's tracer: its live Span takes locks, bounded attribute maps, a sampler
call and two rounds of span processors; on this project's 2-core machine a span cost
~36 us to start and end, and a traced request pays it in three processes (frontend,
router, engine model), on the path to its first token: sampled traces added +7.7 to
+11% to a 6.5-8 ms first token (bench.trace_cost, against a target of 3%). Here a span
is a few fields until it ends; then it becomes one ReadableSpan, the SDK's own type of an
ended span, handed to the same span processor the SDK would hand it to (the bounded
batch export of tracing.export_processor): ~2.4 us in all. Ids come from `random`, as
the SDK's RandomIdGenerator takes them; sampling is the SDK's ParentBased over
TraceIdRatioBased: a parent's sampled flag is followed, a new trace is sampled when its
trace id is under TraceIdRatioBased's bound for the ratio. An unsampled span is never
exported (its traceparent still carries its ids and the flag, as the SDK's would).
opentelemetry is imported when a Spans is made: with traces off nothing here runs.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

TRACEPARENT_HEADER = "traceparent"
_FLAGS = ("00", "01")  # a version-00 traceparent's flags: unsampled, sampled


class Spans:
    """The spans of one service (`resource`) and instrumentation scope, ended into
    `processor` (an SDK SpanProcessor: its on_end takes each sampled span). What a span
    needs of opentelemetry is looked up once, here."""

    def __init__(self, processor: Any, resource: Any, scope: str, ratio: float = 1.0):
        from opentelemetry import trace
        from opentelemetry.sdk import trace as sdk
        from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.processor, self.resource = processor, resource
        self.scope = InstrumentationScope(scope)
        self._bound = TraceIdRatioBased.get_bound_for_rate(ratio)
        self._id_mask = TraceIdRatioBased.TRACE_ID_LIMIT
        self._propagator = TraceContextTextMapPropagator()
        self._get_span = trace.get_current_span
        self._context, self._internal = trace.SpanContext, trace.SpanKind.INTERNAL
        self._flags = {
            True: trace.TraceFlags(trace.TraceFlags.SAMPLED),
            False: trace.TraceFlags(trace.TraceFlags.DEFAULT),
        }
        self._readable, self._unset = sdk.ReadableSpan, trace.Status()

    def parent(self, traceparent: str | None) -> Any:
        """The SpanContext a W3C traceparent names (OpenTelemetry's own propagator reads
        it), or None when it names none (absent, malformed, or all-zero ids)."""
        if not traceparent:
            return None
        context = self._propagator.extract({TRACEPARENT_HEADER: traceparent})
        found = self._get_span(context).get_span_context()
        return found if found.is_valid else None

    def start(
        self,
        name: str,
        parent: Any = None,
        kind: Any = None,
        attributes: Mapping[str, Any] | None = None,
        start_ns: int | None = None,
        links: Sequence[Any] = (),
    ) -> OpenSpan:
        """A span begun now (or at start_ns), child of the SpanContext `parent` (None: the
        root of a new trace, sampled by the ratio)."""
        context, sampled = self.child_context(parent)
        return OpenSpan(
            self if sampled else None,
            name,
            context,
            parent,
            self._internal if kind is None else kind,
            time.time_ns() if start_ns is None else start_ns,
            dict(attributes or {}),
            tuple(links),
        )

    def start_under(
        self, traceparent: str, name: str, start_ns: int, attributes: Mapping[str, Any]
    ) -> OpenSpan:
        """A span begun at start_ns under the W3C `traceparent` a caller sent, as
        start(name, parent(traceparent)) would begin it, except that the traceparent is
        read (by OpenTelemetry's propagator) only when the span ends or its context is
        asked for. Its own traceparent, handed to a child before then, is the caller's
        with this span's id in place of the caller's (OpenSpan.traceparent). Why: these
        spans begin on a request's path to its first token, where reading a traceparent
        took 40-50 us (p50) in a serving stub, against 4 us in a quiet process."""
        span = OpenSpan(self, name, None, None, self._internal, start_ns, dict(attributes), ())
        span._under = (self, traceparent, random.getrandbits(64) or 1)
        return span

    def child_context(self, parent: Any, span_id: int | None = None) -> tuple[Any, bool]:
        """A new span's SpanContext under the SpanContext `parent` (None: a new trace),
        with `span_id` (None: a new one), and whether it is sampled."""
        if parent is None:
            trace_id = random.getrandbits(128) or 1
            sampled = (trace_id & self._id_mask) < self._bound
        else:
            trace_id, sampled = parent.trace_id, parent.trace_flags.sampled
        context = self._context(
            trace_id,
            span_id or random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=self._flags[sampled],
        )
        return context, sampled

    def reparent(self, span: OpenSpan, parent: Any) -> None:
        """Make `span` (not yet ended, its context not yet handed on) the child of the
        SpanContext `parent` instead, in parent's trace, keeping its span id; its former
        parent stays reachable as a link."""
        from opentelemetry.trace import Link

        former = span.parent  # (reads the traceparent start_under left, if any)
        span.links = (*span.links, Link(former)) if former is not None else span.links
        span._parent = parent
        span._context = self._context(
            parent.trace_id,
            span.context.span_id,
            is_remote=False,
            trace_flags=self._flags[parent.trace_flags.sampled],
        )
        span._spans = self if parent.trace_flags.sampled else None

    def end(self, span: OpenSpan, end_ns: int) -> None:
        self.processor.on_end(
            self._readable(
                name=span.name,
                context=span.context,
                parent=span.parent,
                resource=self.resource,
                # Frozen as the SDK's Span freezes them (a list becomes a tuple); the
                # values are trident's own (str, int, float, bool, lists of str).
                attributes={
                    k: tuple(v) if type(v) is list else v for k, v in span.attributes.items()
                },
                links=span.links,
                kind=span.kind,
                status=span.status or self._unset,
                start_time=span.start_ns,
                end_time=end_ns,
                instrumentation_scope=self.scope,
            )
        )

    def shutdown(self) -> None:
        """Send what is still batched, then stop the export."""
        self.processor.shutdown()


class OpenSpan:
    """A span not yet ended: the parts of the SDK's Span API trident uses (its context,
    attributes, status, end)."""

    __slots__ = (
        "_spans",
        "_under",
        "name",
        "_context",
        "_parent",
        "kind",
        "start_ns",
        "attributes",
        "links",
        "status",
    )

    def __init__(
        self,
        spans: Spans | None,
        name: str,
        context: Any,
        parent: Any,
        kind: Any,
        start_ns: int,
        attributes: dict[str, Any],
        links: tuple[Any, ...],
    ) -> None:
        self._spans = spans  # None: unsampled, or ended
        # (Spans, the caller's traceparent, this span's id) until that traceparent is
        # read (Spans.start_under)
        self._under: tuple[Spans, str, int] | None = None
        self.name, self._context, self._parent, self.kind = name, context, parent, kind
        self.start_ns, self.attributes, self.links = start_ns, attributes, links
        self.status: Any = None

    def _read_parent(self) -> None:
        """Read the traceparent start_under left for later: the span's parent and its own
        context follow from it as start() would have made them then."""
        assert self._under is not None
        spans, traceparent, span_id = self._under
        self._under = None
        self._parent = spans.parent(traceparent)
        self._context, sampled = spans.child_context(self._parent, span_id)
        if not sampled:
            self._spans = None

    @property
    def context(self) -> Any:
        if self._under is not None:
            self._read_parent()
        return self._context

    @property
    def parent(self) -> Any:
        if self._under is not None:
            self._read_parent()
        return self._parent

    def get_span_context(self) -> Any:
        return self.context

    @property
    def traceparent(self) -> str:
        """This span as a W3C traceparent: the parent its children's callers hand on.
        Under a caller's traceparent not yet read (Spans.start_under) that is of W3C's
        fixed version-00 layout, the caller's with this span's id in its parent-id field,
        unread: the same text as the one made from the parent once it is read, if the
        caller's is valid; if it is not, the child's is not either, and the child's
        reader starts a trace of its own, as this span will at its end."""
        under = self._under
        if under is not None:
            caller, span_id = under[1], under[2]
            if len(caller) == 55 and caller[:3] == "00-" and caller[53:] in _FLAGS:
                return f"{caller[:36]}{span_id:016x}{caller[52:]}"
        c = self.context
        return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Any) -> None:
        """An opentelemetry.trace.Status."""
        self.status = status

    def end(self, end_ns: int | None = None) -> None:
        """Hand the ended span to the export (a sampled span, once)."""
        if self._under is not None:
            self._read_parent()  # which may find it unsampled
        spans, self._spans = self._spans, None
        if spans is not None:
            spans.end(self, time.time_ns() if end_ns is None else end_ns)
