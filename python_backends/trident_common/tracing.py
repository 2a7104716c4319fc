"""The engine model's span of one request, when traces are on.

`trident serve` with traces on (builder/serve/tracing.py) names the OTLP endpoint and
Triton's service name in tritonserver's environment, which the stubs inherit, and the
router hands each backend request the traceparent of its own span in Triton's trace (the
request parameter interface.TRACEPARENT). A request that carries one gets a span here,
its child: from the request's arrival to its end, with the model, the router's request
id, the token counts, the finish reason and the time to the first token (OpenTelemetry's
GenAI names where there are some). A request without one (untraced, or a direct client)
gets none. opentelemetry is imported only when an endpoint is set.

Spans leave in batches from the SDK's own thread, through a bounded queue
(export_processor, used by the frontend's spans too: builder/serve/tracing.py loads this
module through builder/runtime_modules.py), so a collector that is down, slow or refusing
costs a request nothing: a span that finds the queue full is dropped, one whose export
failed is lost, and SpanLosses counts both (the engine model's Triton counters
trident_trace_spans_{dropped,export_failed}_total, the frontend's on its GET /metrics).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

# The export's bounds, explicit rather than the SDK's defaults (OTEL_BSP_*), for the
# frontend and the engine models alike. The queue holds at most MAX_QUEUED_SPANS ended
# spans (~1 KiB each): a collector that is down costs that much memory, never more.
# Batches of MAX_BATCH_SPANS leave every SCHEDULE_DELAY_MS, or as soon as a batch is
# full. An export waits at most EXPORT_TIMEOUT_S (the OTLP exporter retries within it):
# a dead or slow collector then holds only the SDK's export thread that long per batch,
# and what arrives meanwhile beyond the queue is dropped and counted, never waited for.
MAX_QUEUED_SPANS = 2048
MAX_BATCH_SPANS = 512
SCHEDULE_DELAY_MS = 1000
# 10 s, the OTLP exporter's own default: with 2 s a loaded 2-core CI run lost spans on
# loopback (the end-to-end trace test waited for them in vain).
EXPORT_TIMEOUT_S = 10.0


class SpanLosses:
    """The sampled spans that never reached the collector, counted from any thread:
    `dropped` found the export queue full (`capacity` spans waiting), `failed` were in
    a batch the collector refused or did not take in time."""

    def __init__(self, capacity: int = MAX_QUEUED_SPANS):
        self.capacity = capacity
        self.dropped = self.failed = 0
        self._queued = 0  # handed to the batch processor, not yet to the exporter
        self._taken = (0, 0)  # (dropped, failed) at the last take()
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Whether an ended span may join the queue (else it is counted as dropped)."""
        with self._lock:
            if self._queued >= self.capacity:
                self.dropped += 1
                return False
            self._queued += 1
            return True

    def exporting(self, count: int) -> None:
        with self._lock:
            self._queued -= count

    def failed_export(self, count: int) -> None:
        with self._lock:
            self.failed += count

    def take(self) -> tuple[int, int]:
        """(dropped, failed) since the last take(): for counters written elsewhere."""
        with self._lock:
            last, self._taken = self._taken, (self.dropped, self.failed)
        return self._taken[0] - last[0], self._taken[1] - last[1]


def export_processor(endpoint: str, losses: SpanLosses) -> Any:
    """A span processor sending the sampled spans to `endpoint` (OTLP/HTTP) in bounded
    batches, counting in `losses` what it drops or fails to send. The SDK's own batch
    processor drops the oldest span of a full queue and says so only in a log line:
    here the queue is bounded before it (its own bound is never reached) and counted."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class CountingExporter(SpanExporter):
        def __init__(self, exporter: Any):
            self.exporter = exporter

        def export(self, spans: Any) -> Any:
            losses.exporting(len(spans))
            try:
                result = self.exporter.export(spans)
            except Exception:
                losses.failed_export(len(spans))
                raise
            if result is not SpanExportResult.SUCCESS:
                losses.failed_export(len(spans))
            return result

        def shutdown(self) -> None:
            self.exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(self.exporter.force_flush(timeout_millis))

    class BoundedProcessor(SpanProcessor):
        def __init__(self, batches: Any):
            self.batches = batches

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.batches.on_start(span, parent_context=parent_context)

        def on_end(self, span: Any) -> None:
            if span.context.trace_flags.sampled and losses.admit():
                self.batches.on_end(span)

        def shutdown(self) -> None:
            self.batches.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(self.batches.force_flush(timeout_millis))

    batches = BatchSpanProcessor(
        CountingExporter(OTLPSpanExporter(endpoint, timeout=EXPORT_TIMEOUT_S)),
        max_queue_size=losses.capacity,  # never overflows: admit() bounds it first
        schedule_delay_millis=SCHEDULE_DELAY_MS,
        max_export_batch_size=min(MAX_BATCH_SPANS, losses.capacity),
        export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
    )
    return BoundedProcessor(batches)


class EngineTraces:
    def __init__(self, provider: Any, model: str, losses: SpanLosses):
        self.provider, self.model, self.losses = provider, model, losses
        self.tracer = provider.get_tracer("trident.engine")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], model: str) -> EngineTraces | None:
        """None unless the environment names an OTLP traces endpoint."""
        endpoint = environ.get(ENDPOINT_ENV)
        if not endpoint:
            return None
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
        provider = TracerProvider(resource=Resource.create({"trident.model": model}))
        losses = SpanLosses()
        provider.add_span_processor(export_processor(endpoint, losses))
        return cls(provider, model, losses)

    def start(self, traceparent: str, start_ns: int, request_id: str) -> Any:
        """The span of a request whose parent is `traceparent`, begun at start_ns."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        return self.tracer.start_span(
            f"generate {self.model}",
            context=parent,
            start_time=start_ns,
            attributes={
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": self.model,
                "trident.request_id": request_id,
            },
        )

    def close(self) -> None:
        self.provider.shutdown()  # what is still batched leaves now


def end(
    span: Any,
    input_tokens: int | None,
    output_tokens: int | None,
    finish_reason: str | None,
    ttft_s: float | None,
    error: str | None,
) -> None:
    """End a request's span with what became of it."""
    attributes: dict[str, Any] = {}
    if input_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = input_tokens
    if output_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = output_tokens
    if finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    if ttft_s is not None:
        attributes["trident.time_to_first_token_s"] = ttft_s
    span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
