"""OpenTelemetry traces of `trident serve`: one trace per request, from the client's
`traceparent` through the OpenAI frontend, tritonserver (the router's request, its BLS
call to the engine model, the engine model's request) to the engine.

Configured by the standard OpenTelemetry environment, or `--otlp-traces-endpoint`:
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces),
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER (always_on, always_off,
traceidratio and their parentbased_ forms) with OTEL_TRACES_SAMPLER_ARG. With no endpoint
nothing is traced: no tracer is made and Triton runs without --trace-config, so nothing
is spent. OTLP over HTTP (protobuf), the one transport Triton's exporter speaks.

Tritonserver exports its own spans (its `--trace-config mode=opentelemetry`): it reads
`traceparent` from the gRPC metadata the frontend sends, so its spans of the router's
request are the frontend span's children. The frontend exports its spans through
opentelemetry-sdk, made only when traces are on. The engine model's request, which the
router makes over BLS, is not in Triton's trace: python_backend's way to carry a trace
into a BLS call (`InferenceRequest(..., trace=request.trace())`) crashed the bundled
tritonserver 2.51 in TRITONSERVER_ServerInferAsync when the trace came from a
traceparent (seen here). Instead the router hands the engine model its own span's
traceparent (`request.trace().get_context()`, a request parameter), and the engine model
exports its span itself (trident_common/tracing.py), with the settings
serve puts in tritonserver's environment (stub_environment). Not yet: vLLM's own spans.

A collector that is down, slow or refusing costs a request nothing: the frontend's spans
leave through the same bounded export as the engine models' (trident_common/tracing.py
export_processor: bounded queue, short export timeout, on the SDK's thread), and the
spans it loses are counted in LOSSES, served on the frontend's GET /metrics
(loss_exposition).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builder.errors import EXIT_USAGE, TridentError
from trident_common import tracing as _common
from trident_common.spans import Spans

TRACES_PATH = "/v1/traces"
FRONTEND_SERVICE = "trident-openai"
TRITON_SERVICE = "tritonserver"


# The frontend's spans lost on their way out, over the process (every spans() of it).
LOSSES = _common.SpanLosses()
SCOPE = "trident.openai"  # the frontend spans' instrumentation scope
SPANS_DROPPED = "trident:trace_spans_dropped_total"
SPANS_EXPORT_FAILED = "trident:trace_spans_export_failed_total"


def loss_exposition() -> bytes:
    """The Prometheus text of the frontend's two loss counters (no labels)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily

    class Losses:
        def collect(self) -> Any:
            yield CounterMetricFamily(
                SPANS_DROPPED.removesuffix("_total"),
                "Spans of the OpenAI frontend dropped: its trace export queue was full",
                value=LOSSES.dropped,
            )
            yield CounterMetricFamily(
                SPANS_EXPORT_FAILED.removesuffix("_total"),
                "Spans of the OpenAI frontend the collector refused or did not take in time",
                value=LOSSES.failed,
            )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Losses())
    return generate_latest(registry)


class TracingError(TridentError):
    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Tracing:
    endpoint: str  # OTLP/HTTP traces URL
    service: str  # the frontend's service.name (Triton's gets "-triton" after it)
    resource: Mapping[str, str]
    ratio: float  # the share of new traces sampled (a client's sampled flag is honoured)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], endpoint: str | None = None) -> Tracing | None:
        """The settings, or None when no traces endpoint is set (tracing off)."""
        url = endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if not url and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            url = environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise TracingError(f"--otlp-traces-endpoint: {url!r} is not an http(s) URL")
        resource = {}
        for item in filter(None, environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise TracingError(
                    f"OTEL_RESOURCE_ATTRIBUTES: {item!r} is not key=value (comma-separated)"
                )
            resource[key.strip()] = value.strip()
        service = environ.get("OTEL_SERVICE_NAME") or resource.pop("service.name", "") or "trident"
        return cls(url, service, resource, _ratio(environ))

    @property
    def triton_service(self) -> str:
        """The service.name of tritonserver's spans and of its engine models'."""
        return f"{self.service}-triton"

    def triton_args(self) -> tuple[str, ...]:
        """tritonserver's --trace-config for these settings."""
        rate = 0 if self.ratio <= 0 else max(1, round(1 / self.ratio))  # 1 in `rate`
        resources = [f"service.name={self.triton_service}"] + [
            f"{k}={v}" for k, v in self.resource.items()
        ]
        args = ["mode=opentelemetry", "level=TIMESTAMPS", f"rate={rate}", "count=-1"]
        args += [f"opentelemetry,url={self.endpoint}"]
        args += [f"opentelemetry,resource={r}" for r in resources]
        return tuple(arg for setting in args for arg in ("--trace-config", setting))

    def stub_environment(self) -> dict[str, str]:
        """What tritonserver's environment tells its engine models, whose stubs inherit
        it, for their own spans (trident_common/tracing.py): where to
        send them, under Triton's service name. Their sampling follows the router's
        traceparent (the parent's sampled flag)."""
        return {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
            "OTEL_SERVICE_NAME": self.triton_service,
            "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in self.resource.items()),
        }

    def spans(self) -> Any:
        """The frontend's spans (trident_common.spans.Spans, OTLP over HTTP, batched,
        sampled ParentBased over the ratio): its shutdown() sends what is left."""
        from opentelemetry.sdk.resources import Resource

        # Bounded and counted (trident_common/tracing.py): a dead collector never slows a
        # request, and LOSSES says how many spans it cost.
        return Spans(
            _common.export_processor(self.endpoint, LOSSES),
            Resource.create({**self.resource, "service.name": self.service}),
            SCOPE,
            self.ratio,
        )


def _ratio(environ: Mapping[str, str]) -> float:
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
    name = sampler.removeprefix("parentbased_")
    if name == "always_on":
        return 1.0
    if name == "always_off":
        return 0.0
    if name == "traceidratio":
        raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TracingError(f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a ratio in [0, 1]")
        return ratio
    raise TracingError(
        f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of always_on, always_off, "
        "traceidratio (or parentbased_ of them)"
    )


def from_environment(endpoint: str | None = None) -> Tracing | None:
    return Tracing.from_env(os.environ, endpoint)
