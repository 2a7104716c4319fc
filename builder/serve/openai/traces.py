"""The frontend's span of one request (builder/serve/tracing.py says what is traced and
how it is configured): a SERVER span from the client's `traceparent` (a new trace
without one), open from admission to the answer's last byte, whose own traceparent the
request's gRPC call to Triton carries (TRACEPARENT, read by triton.py), so Triton's spans
of the router and the engine model are its children. opentelemetry is imported only
when traces are on: with tracing off the frontend pays one `is None` per request."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# The traceparent of the request being served, for its calls to Triton (None: untraced).
TRACEPARENT: ContextVar[str | None] = ContextVar("trident_traceparent", default=None)


@contextmanager
def request_span(spans: Any, scope: dict) -> Iterator[Any]:
    """The span of the ASGI request `scope` (trident_common.spans.Spans makes it), its
    traceparent in TRACEPARENT for the duration when it is sampled."""
    from opentelemetry.trace import SpanKind

    parent = None
    for key, value in scope.get("headers", ()):
        if key == b"traceparent":
            parent = spans.parent(value.decode("latin-1"))
    span = spans.start(
        f"{scope.get('method', 'POST')} {scope.get('path', '')}",
        parent,
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": scope.get("method", ""),
            "url.path": scope.get("path", ""),
        },
    )
    # Only a sampled one: tritonserver 2.51 traces every request that carries a
    # traceparent, its sampled flag and its own rate notwithstanding (bench/trace_cost.py
    # counted Triton's spans of unsampled requests).
    sampled = span.get_span_context().trace_flags.sampled
    token = TRACEPARENT.set(span.traceparent if sampled else None)
    try:
        yield span
    finally:
        TRACEPARENT.reset(token)
        span.end()


def finish(span: Any, status: int) -> None:
    """The answer's status on its span (a 5xx marks the span as failed)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
