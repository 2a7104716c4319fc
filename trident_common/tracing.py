"""The router's and the engine model's spans of one request, when traces are on.

`trident serve` with traces on (builder/serve/tracing.py) names the OTLP endpoint and
Triton's service name in tritonserver's environment, which the stubs inherit. The router
gives each request Triton traces a span of its own (RouteRecord: its decision), child of
Triton's span of it, and hands each backend request that span's traceparent (the
request parameter interface.TRACEPARENT). A request that carries one gets a span here,
its child: from the request's arrival to its end, with the model, the router's request
id, the token counts, the finish reason and the time to the first token (OpenTelemetry's
GenAI names where there are some). A request without one (untraced, or a direct client)
gets none. The spans are trident_common/spans.py's (a fraction of the SDK's cost on the
request's path). opentelemetry is imported only when an endpoint is set.

Spans leave in batches from the SDK's own thread, through a bounded queue
(export_processor, used by the frontend's spans too: builder/serve/tracing.py imports
this module), so a collector that is down, slow or refusing
costs a request nothing: a span that finds the queue full is dropped, one whose export
failed is lost, and SpanLosses counts both (the engine model's Triton counters
trident_trace_spans_{dropped,export_failed}_total, the frontend's on its GET /metrics).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from trident_common.spans import TRACEPARENT_HEADER, OpenSpan, Spans

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
# The engine model's span of the request its task serves, set in that task's context only
# (engine_model.py): an engine that exports spans of its own (vLLM) gets its traceparent
# as their parent (engine_trace_headers), so its spans join the request's trace.
ENGINE_SPAN: ContextVar[Any] = ContextVar("trident_engine_span", default=None)
TENANT_HASH = "trace-tenant"  # the purpose of the key tenants are hashed with (trust.derive)

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
    a batch the collector refused or did not take in time. `on_loss(dropped, failed)`,
    if given, is told of each loss as it is counted, on the thread that counts it (a
    span's end, or the export thread): the router and the engine models write their
    Triton counters so, queued off that thread; the frontend reads the totals."""

    def __init__(
        self,
        capacity: int = MAX_QUEUED_SPANS,
        on_loss: Callable[[int, int], None] | None = None,
    ):
        self.capacity, self.on_loss = capacity, on_loss
        self.dropped = self.failed = 0
        self._queued = 0  # handed to the batch processor, not yet to the exporter
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Whether an ended span may join the queue (else it is counted as dropped)."""
        with self._lock:
            admitted = self._queued < self.capacity
            if admitted:
                self._queued += 1
            else:
                self.dropped += 1
        if not admitted and self.on_loss is not None:
            self.on_loss(1, 0)
        return admitted

    def exporting(self, count: int) -> None:
        with self._lock:
            self._queued -= count

    def failed_export(self, count: int) -> None:
        with self._lock:
            self.failed += count
        if self.on_loss is not None:
            self.on_loss(0, count)


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


# vLLM's exporter speaks OTLP/gRPC unless told otherwise; trident's endpoint is OTLP/HTTP.
VLLM_PROTOCOL_ENV, OTLP_HTTP = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"


def vllm_tracing_defaults(config: dict[str, Any], environ: MutableMapping[str, str]) -> None:
    """Have vLLM export its own spans (its `llm_request` span: queue time, prefill, decode,
    per request) to trident's endpoint, unless traces are off or the spec's engine_args
    name another endpoint. The protocol is set for vLLM only when trident's endpoint is
    the one used: an operator's own endpoint keeps the operator's protocol. Not with
    disable_log_stats: vLLM 0.32 times its span from the stats it then never makes, and
    the output processor's assert would fail every request (output_processor.py,
    do_tracing)."""
    endpoint = environ.get(ENDPOINT_ENV)
    if (
        endpoint
        and config.get("otlp_traces_endpoint") is None
        and not config.get("disable_log_stats")
    ):
        config["otlp_traces_endpoint"] = endpoint
        environ[VLLM_PROTOCOL_ENV] = OTLP_HTTP


def engine_trace_headers() -> dict[str, str] | None:
    """The W3C headers naming the engine model's span of this task's request as the
    parent (vLLM's `trace_headers`); None when the request has no span."""
    span = ENGINE_SPAN.get()
    return None if span is None else {TRACEPARENT_HEADER: span.traceparent}


class EngineTraces:
    """The spans of one model's stub (the router, an engine model), made by spans.Spans:
    each follows its parent's sampled flag."""

    def __init__(self, spans: Spans, model: str, losses: SpanLosses):
        self.spans, self.model, self.losses = spans, model, losses

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        model: str,
        on_loss: Callable[[int, int], None] | None = None,
    ) -> EngineTraces | None:
        """None unless the environment names an OTLP traces endpoint. `on_loss`: see
        SpanLosses."""
        endpoint = environ.get(ENDPOINT_ENV)
        if not endpoint:
            return None
        from opentelemetry.sdk.resources import Resource

        losses = SpanLosses(on_loss=on_loss)
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
        resource = Resource.create({"trident.model": model})
        spans = Spans(export_processor(endpoint, losses), resource, "trident.engine")
        return cls(spans, model, losses)

    def start(self, traceparent: str, start_ns: int, request_id: str) -> OpenSpan:
        """The span of a request whose parent is `traceparent`, begun at start_ns (the
        traceparent is read when the span ends, off the path to the first token:
        Spans.start_under)."""
        return self.spans.start_under(
            traceparent,
            f"generate {self.model}",
            start_ns,
            {
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": self.model,
                "trident.request_id": request_id,
            },
        )

    def route(self, triton_context: str | None) -> RouteRecord | None:
        """The router's span of a request Triton traces (`triton_context`: what
        `request.trace().get_context()` gave, '{"traceparent": ...}', None untraced),
        child of Triton's span of it; None for an untraced request. Once the request is
        read, follow_caller checks that span against the caller's own."""
        if not triton_context:
            return None
        triton_span = json.loads(triton_context).get(TRACEPARENT_HEADER)
        if not triton_span:
            return None
        # Read at its end: Spans.start_under.
        return RouteRecord(
            self.spans.start_under(triton_span, f"route {self.model}", time.time_ns(), {})
        )

    def follow_caller(self, record: RouteRecord, sent: str | None) -> None:
        """`sent`: the traceparent the caller also sent as a request parameter (the OpenAI
        frontend does). When it is of another trace than Triton's span, tritonserver
        lost the one the caller's metadata carried and traced the request as a new root
        (tests/server/trace_parent_loss.py): the router's span then becomes the child of
        `sent`, keeping the caller's trace whole, linked to Triton's span and marked
        trident.triton_parent_lost. Before the backend is called (its traceparent is the
        router span's). The usual case, the same trace, is told from the text alone."""
        if not sent or sent[3:35] == record.traceparent[3:35]:
            return
        callers = self.spans.parent(sent)
        if callers is not None and callers.trace_id != record.span.context.trace_id:
            self.spans.reparent(record.span, callers)
            record.span.set_attribute("trident.triton_parent_lost", True)

    def close(self) -> None:
        self.spans.shutdown()  # what is still batched leaves now


@dataclass
class RouteRecord:
    """What the router decided for one traced request, set as it decides, written on its
    span at the end (attributes()): the route (the rule that matched, "default", or the
    backend a client pinned), the candidates in the order they were to be tried, each
    failed or unavailable candidate with why, the backend that answered and its breaker
    state when it was claimed, the tenant as a keyed hash (never its name or key), the
    tenant admission, and the outcome (the router's error reason, or "answered")."""

    span: OpenSpan
    route: str | None = None
    candidates: tuple[str, ...] = ()
    failures: list[str] = field(default_factory=list)
    backend: str | None = None
    breaker: str | None = None
    tenant: str | None = None
    admission: str | None = None  # "admitted" or "refused"; None: no tenants configured
    outcome: str = "answered"

    @property
    def traceparent(self) -> str:
        """This span's traceparent: the parent the router hands its backend request."""
        return self.span.traceparent

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {"trident.route.outcome": self.outcome}
        optional = {
            "trident.route": self.route,
            "trident.route.candidates": list(self.candidates) or None,
            "trident.route.failures": list(self.failures) or None,
            "trident.route.backend": self.backend,
            "trident.route.breaker_state": self.breaker,
            "trident.tenant.hash": self.tenant,
            "trident.tenant.admission": self.admission,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        return attributes

    def end(self) -> None:
        self.span.set_attributes(self.attributes())
        if self.outcome != "answered":
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, self.outcome))
        self.span.end()


def tenant_hash(key: bytes, tenant: str) -> str:
    """A tenant as the router's spans name it: keyed (the router's secret), so a reader
    of the traces can tell requests of one tenant apart from another's but not learn,
    or confirm a guess of, who it is. 16 hex digits."""
    return hmac.new(key, tenant.encode(), hashlib.sha256).hexdigest()[:16]


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
