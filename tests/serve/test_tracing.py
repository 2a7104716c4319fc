"""Tracing's settings (builder/serve/tracing.py) from the standard OpenTelemetry
environment: off unless an endpoint is set, Triton's --trace-config from them, and bad
values refused in one line. The traces themselves: tests/server/test_drain.py."""

from __future__ import annotations

import pytest

from builder.cli.main import main
from builder.serve.tracing import Tracing, TracingError


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
