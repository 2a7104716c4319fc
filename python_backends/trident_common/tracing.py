"""The engine model's span of one request, when traces are on.

`trident serve` with traces on (builder/serve/tracing.py) names the OTLP endpoint and
Triton's service name in tritonserver's environment, which the stubs inherit, and the
router hands each backend request the traceparent of its own span in Triton's trace (the
request parameter interface.TRACEPARENT). A request that carries one gets a span here,
its child: from the request's arrival to its end, with the model, the router's request
id, the token counts, the finish reason and the time to the first token (OpenTelemetry's
GenAI names where there are some). A request without one (untraced, or a direct client)
gets none. opentelemetry is imported only when an endpoint is set, and spans leave in
batches from the SDK's own thread: a slow or absent collector costs a request nothing
(the SDK drops what its bounded queue cannot hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


class EngineTraces:
    def __init__(self, provider: Any, model: str):
        self.provider, self.model = provider, model
        self.tracer = provider.get_tracer("trident.engine")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], model: str) -> EngineTraces | None:
        """None unless the environment names an OTLP traces endpoint."""
        endpoint = environ.get(ENDPOINT_ENV)
        if not endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES itself.
        provider = TracerProvider(resource=Resource.create({"trident.model": model}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint)))
        return cls(provider, model)

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
