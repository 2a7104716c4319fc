"""Tracing's settings (builder/serve/tracing.py) from the standard OpenTelemetry
environment: off unless an endpoint is set, Triton's --trace-config from them, and bad
values refused in one line; `trident openai`'s span of a request, exported to a loopback
collector. The traces through Triton: tests/server/test_drain.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from builder.cli.main import main
from builder.serve.server import free_port
from builder.serve.tracing import Tracing, TracingError
from support.otlp_collector import Collector
from tests.helpers import wait_for


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
