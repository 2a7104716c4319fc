"""What one span costs the process that makes it: trident's spans (trident_common/spans.py)
against the OpenTelemetry SDK's tracer, for the shapes of trident's three spans of a
request (issue 38).

- frontend: a SERVER span of a new trace (sampled), two attributes at its start, the
  status code at its end, its traceparent formatted for Triton;
- router: a child of Triton's traceparent, seven decision attributes at its end (two of
  them lists), its traceparent formatted for the backend;
- engine model: a child of the router's traceparent, three attributes at its start and
  four at its end.

Each path ends its spans into the same kind of processor, the SDK's BatchSpanProcessor
(as trident's bounded export does) whose exporter takes the batches and drops them: the
export's own cost (encoding, HTTP) is trace_cost's, not this. Start to end of each span
in a loop, the two paths alternated over ROUNDS rounds; the figure is the median round's
microseconds per span. In-process, one thread: what a request's path pays, warm.

Usage: .venv/bin/python -m bench.span_cost [--out DIR] [--spans N]  (about 10 s)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import bench_result, run_alone

ROUNDS = 5
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ROUTE = {
    "trident.route.outcome": "answered",
    "trident.route": "default",
    "trident.route.candidates": ["qwen", "qwen-backup"],
    "trident.route.failures": ["qwen: connection refused"],
    "trident.route.backend": "qwen-backup",
    "trident.route.breaker_state": "closed",
    "trident.tenant.hash": "0123456789abcdef",
}
ENGINE_START = {
    "gen_ai.operation.name": "text_completion",
    "gen_ai.request.model": "qwen",
    "trident.request_id": "router-1",
}
ENGINE_END = {
    "gen_ai.usage.input_tokens": 12,
    "gen_ai.usage.output_tokens": 64,
    "gen_ai.response.finish_reasons": ["stop"],
    "trident.time_to_first_token_s": 0.012,
}


def _processor() -> Any:
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return BatchSpanProcessor(Dropped(), max_queue_size=8192, schedule_delay_millis=200)


def _traceparent(span: Any) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def sdk_shapes(tracer: Any) -> dict[str, Callable[[], None]]:
    """The three spans through the SDK's tracer (what trident did before spans.py)."""
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()

    def frontend() -> None:
        span = tracer.start_span(
            "POST /v1/chat/completions",
            context=propagator.extract({}),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "url.path": "/v1/chat/completions"},
        )
        _traceparent(span)
        span.set_attribute("http.response.status_code", 200)
        span.end()

    def router() -> None:
        span = tracer.start_span(
            "route router", context=propagator.extract({"traceparent": PARENT})
        )
        _traceparent(span)
        span.set_attributes(ROUTE)
        span.end()

    def engine() -> None:
        context = propagator.extract({"traceparent": PARENT})
        span = tracer.start_span("generate qwen", context=context, attributes=ENGINE_START)
        span.set_attributes(ENGINE_END)
        span.end()

    return {"frontend": frontend, "router": router, "engine model": engine}


def trident_shapes(spans: Any) -> dict[str, Callable[[], None]]:
    """The same three spans through trident_common.spans.Spans."""
    from opentelemetry.trace import SpanKind

    def frontend() -> None:
        span = spans.start(
            "POST /v1/chat/completions",
            None,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "url.path": "/v1/chat/completions"},
        )
        span.traceparent  # noqa: B018 - formatted for Triton, as the frontend does
        span.set_attribute("http.response.status_code", 200)
        span.end()

    def router() -> None:
        span = spans.start("route router", spans.parent(PARENT))
        span.traceparent  # noqa: B018 - handed to the backend, as the router does
        span.set_attributes(ROUTE)
        span.end()

    def engine() -> None:
        span = spans.start("generate qwen", spans.parent(PARENT), attributes=ENGINE_START)
        span.set_attributes(ENGINE_END)
        span.end()

    return {"frontend": frontend, "router": router, "engine model": engine}


def _per_span_us(make: Callable[[], None], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        make()
    return (time.perf_counter() - started) / count * 1e6


def run(out_dir: Any = None, spans: int = 5000) -> dict:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from trident_common.spans import Spans

    resource = Resource.create({"service.name": "bench"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(_processor())
    ours = Spans(_processor(), resource, "bench")
    paths = {"sdk": sdk_shapes(provider.get_tracer("bench")), "trident": trident_shapes(ours)}
    timings: dict[str, dict[str, list[float]]] = {p: {s: [] for s in paths[p]} for p in paths}
    for _ in range(ROUNDS):
        for shape in paths["sdk"]:
            for path in ("sdk", "trident"):
                timings[path][shape].append(_per_span_us(paths[path][shape], spans))
    provider.shutdown()
    ours.shutdown()
    rows = []
    for shape in paths["sdk"]:
        mine = statistics.median(timings["trident"][shape])
        theirs = statistics.median(timings["sdk"][shape])
        rows.append(
            {
                "metric": f"us per span, {shape} (start to end)",
                "ours": mine,
                "direct": theirs,
                "ratio": mine / theirs,
                "target": "< the SDK's tracer",
                "met": mine < theirs,
            }
        )
    return bench_result(
        "span_cost",
        rows,
        {"spans_per_round": spans, "rounds": ROUNDS, "direct": "OpenTelemetry SDK tracer"},
        timings,
    )


if __name__ == "__main__":
    raise SystemExit(
        run_alone(
            __doc__,
            lambda out, spans: run(out, spans),
            options=lambda p: p.add_argument("--spans", type=int, default=5000),
        )
    )
