"""Tracing's settings (builder/serve/tracing.py) from the standard OpenTelemetry
environment: off unless an endpoint is set, Triton's --trace-config from them, and bad
values refused in one line; `trident openai`'s span of a request, exported to a loopback
collector; a dead or hanging collector fails no request and the spans it cost are
counted. The traces through Triton: tests/server/test_drain.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from builder.cli.main import main
from builder.serve.openai.app import create_app
from builder.serve.openai.tensors import Piece
from builder.serve.server import free_port
from builder.serve.tracing import SPANS_DROPPED, SPANS_EXPORT_FAILED, Tracing, TracingError
from support.otlp_collector import Collector
from tests.helpers import wait_for
from tests.serve.test_pod_metrics import MeteredTriton


def test_without_an_endpoint_nothing_is_traced():
    assert Tracing.from_env({}) is None
    assert Tracing.from_env({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None


def test_the_endpoint_the_service_and_the_resource_come_from_the_environment():
    tracing = Tracing.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=edge,deployment.environment=prod",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    )
    assert tracing == Tracing(
        "http://collector:4318/v1/traces", "edge", {"deployment.environment": "prod"}, 0.25
    )
    args = tracing.triton_args()
    settings = [args[i + 1] for i in range(0, len(args), 2)]
    assert all(args[i] == "--trace-config" for i in range(0, len(args), 2))
    assert "mode=opentelemetry" in settings and "rate=4" in settings  # 1 in 4
    assert "opentelemetry,url=http://collector:4318/v1/traces" in settings
    assert "opentelemetry,resource=service.name=edge-triton" in settings
    assert "opentelemetry,resource=deployment.environment=prod" in settings
    # The flag wins over the environment; the traces endpoint over the general one.
    assert (
        Tracing.from_env(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/v1/traces",
            }
        ).endpoint
        == "http://b:4318/v1/traces"
    )
    assert Tracing.from_env({}, "http://c:4318/v1/traces").endpoint == "http://c:4318/v1/traces"


@pytest.mark.parametrize(
    "environ, words",
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER: 'sometimes'"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG: '2'",
        ),
        ({"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "OTEL_RESOURCE_ATTRIBUTES: 'novalue'"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(environ, words):
    with pytest.raises(TracingError, match=words):
        Tracing.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318", **environ})


def test_serve_refuses_a_bad_endpoint_before_starting_anything(tmp_path, capsys):
    (tmp_path / "repo").mkdir()
    code = main(["serve", "--repo", str(tmp_path / "repo"), "--otlp-traces-endpoint", "x:4318"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--otlp-traces-endpoint: 'x:4318'" in err


def test_openai_refuses_a_bad_endpoint_before_starting_anything(capsys):
    code = main(["openai", "--port", "1", "--otlp-traces-endpoint", "x:4318"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--otlp-traces-endpoint: 'x:4318'" in err


def test_trident_openai_exports_a_span_per_request_under_the_clients_traceparent():
    """`trident openai --otlp-traces-endpoint`, a process of its own in front of a Triton
    that is not there (the answer is an error; the span is what is checked), drained by
    SIGTERM: its batched spans leave before it exits."""
    trace, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    port, nobody = free_port(), free_port()
    with Collector() as collector:
        argv = [sys.executable, "-m", "builder.cli.main", "openai", "--port", str(port)]
        argv += ["--triton", f"127.0.0.1:{nobody}", "--otlp-traces-endpoint", collector.endpoint]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        proc = subprocess.Popen(argv, env={**env, "OTEL_SERVICE_NAME": "frontend-test"})
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _status(url + "/health") != 0, 60)  # it answers (503: no Triton)
            request = urllib.request.Request(
                url + "/v1/completions",
                data=json.dumps({"model": "router", "prompt": "Hi", "max_tokens": 4}).encode(),
                headers={
                    "traceparent": f"00-{trace}-{parent}-01",
                    "content-type": "application/json",
                },
            )
            try:
                urllib.request.urlopen(request, timeout=60).read()
            except urllib.error.HTTPError as refused:
                assert refused.code >= 500  # no Triton: an error in words
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        (span,) = [s for s in collector.spans if s.trace_id == trace]
    assert (span.service, span.name, span.parent_id) == (
        "frontend-test",
        "POST /v1/completions",
        parent,
    )


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def _losses(client) -> tuple[float, float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return samples[SPANS_DROPPED], samples[SPANS_EXPORT_FAILED]


def test_a_dead_collector_fails_no_request_and_the_lost_spans_are_counted():
    """200 requests through the frontend with every span sampled and the collector down
    (a port nobody listens on): all are answered, and once the provider has tried to
    send what it holds, /metrics counts every one of the 200 spans as lost."""
    spans = Tracing(f"http://127.0.0.1:{free_port()}/v1/traces", "t", {}, 1.0).spans()
    triton = MeteredTriton([Piece("Hello", "stop", 3, 1, "smollm2")])
    client = TestClient(create_app("unused", triton, spans=spans))
    before = _losses(client)
    body = {"model": "router", "prompt": "Hi", "max_tokens": 4}
    statuses = [client.post("/v1/completions", json=body).status_code for _ in range(200)]
    assert statuses == [200] * 200
    spans.shutdown()  # the spans still queued are sent now: refused, counted
    dropped, failed = (after - was for after, was in zip(_losses(client), before, strict=True))
    assert dropped + failed == 200


def test_a_hanging_collector_costs_an_ended_span_nothing_and_a_full_queue_drops_counted():
    """A collector that takes the connection and never answers holds the SDK's export
    thread for the export timeout; meanwhile spans end at once, what the bounded queue
    cannot hold is dropped, and every span is counted as sent, dropped or failed."""
    from opentelemetry.sdk.resources import Resource

    from trident_common import tracing as common
    from trident_common.spans import Spans

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections are taken by the kernel, never answered
        losses = common.SpanLosses(capacity=8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces"
        spans = Spans(common.export_processor(endpoint, losses), Resource.create({}), "test")
        started = time.monotonic()
        for i in range(200):
            spans.start(f"span {i}").end()
        assert time.monotonic() - started < 1.0  # never waited for the collector
        spans.shutdown()
    assert losses.dropped >= 200 - 2 * 8  # the queue, and one batch being sent
    assert losses.dropped + losses.failed == 200


def test_an_unsampled_request_hands_triton_no_traceparent():
    """tritonserver 2.51 traces any request carrying a traceparent, sampled or not
    (bench/trace_cost.py): the frontend passes one on only for a sampled span."""
    from builder.serve.openai.traces import TRACEPARENT, request_span

    scope = {"method": "POST", "path": "/v1/completions", "headers": []}
    for ratio, handed in ((0.0, False), (1.0, True)):
        spans = Tracing(f"http://127.0.0.1:{free_port()}/v1/traces", "t", {}, ratio).spans()
        with request_span(spans, scope):
            assert (TRACEPARENT.get() is not None) == handed
        unsampled = [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")]
        with request_span(spans, {**scope, "headers": unsampled}):
            assert TRACEPARENT.get() is None  # the client's unsampled parent is honoured
        spans.shutdown()


def test_a_traced_requests_call_to_triton_carries_its_traceparent_twice():
    # In the gRPC metadata (Triton's spans) and as the request parameter the router's
    # span falls back on when tritonserver 2.51 loses the metadata's (bls/model.py).
    from builder.serve.openai import triton as frontend_triton
    from builder.serve.openai.traces import TRACEPARENT

    calls = []
    client = frontend_triton.Triton("127.0.0.1:1")
    client._rpc = lambda name: lambda request, **kw: calls.append((request, kw))  # type: ignore[method-assign]
    ours = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    token = TRACEPARENT.set(ours)
    try:
        client.open_stream(frontend_triton.request_of("router", [], "r1"))
    finally:
        TRACEPARENT.reset(token)
    client.open_stream(frontend_triton.request_of("router", [], "r2"))  # untraced
    (traced, kw), (untraced, untraced_kw) = calls
    assert kw["metadata"] == (("traceparent", ours),)
    from trident_common import interface

    assert traced.parameters[interface.TRACEPARENT].string_param == ours
    assert interface.TRACEPARENT not in untraced.parameters and not untraced_kw
