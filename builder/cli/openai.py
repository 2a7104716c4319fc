"""`trident openai`: the OpenAI-compatible HTTP frontend in front of a running Triton."""

from __future__ import annotations

from pathlib import Path

import click

from builder.cli.common import (
    api_keys_option,
    complete_dir,
    drain_timeout_option,
    expose_option,
    otlp_traces_option,
)
from builder.spec import ServerSpec


@click.command("openai")
@click.option(
    "--triton",
    "triton_url",
    default=f"127.0.0.1:{ServerSpec.grpc_port}",
    show_default=True,
    metavar="HOST:PORT",
    help="Triton's gRPC endpoint",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=9000,
    show_default=True,
    help="HTTP port of the OpenAI API",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address to listen on (0.0.0.0: every interface)",
)
@api_keys_option(
    "require API keys: one `KEY TENANT` per line; a key sets the request's "
    "tenant (401 for a missing or unknown key)"
)
@expose_option()
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024, 2**30),
    default=None,
    metavar="N",
    help="largest request body (413 above it) [default: 4 MiB]",
)
@click.option(
    "--repo",
    default=None,
    metavar="DIR",
    shell_complete=complete_dir,
    help="the repository Triton serves: max_tokens above a model's context "
    "length (its max_model_len) is then a 400",
)
@drain_timeout_option(
    "on SIGTERM or Ctrl-C: refuse new requests (503) and give the answers in flight "
    "this long to finish; what is left then ends with a `server_shutdown` error"
)
@otlp_traces_option(
    "export OpenTelemetry traces (OTLP over HTTP) of the frontend here: a span per "
    "request, child of the client's traceparent, whose own traceparent goes to Triton; "
    "default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT (the other "
    "OTEL_* settings as `trident serve` reads them); none: nothing is traced"
)
def openai_command(
    triton_url: str,
    port: int,
    host: str,
    api_keys_file: str | None,
    expose: tuple[str, ...],
    max_body_bytes: int | None,
    repo: str | None,
    drain_timeout_s: float,
    otlp_traces_endpoint: str | None,
) -> int:
    """Serve OpenAI's API (/v1/models, /v1/chat/completions, /v1/completions) for the
    exposed models of a running tritonserver (`router` unless --expose names others),
    over its gRPC port.

    Every request is one gRPC stream to the Triton model named by `model`; any model
    not exposed is a 404. Routing hints come from the body (`route`, `task`, `tenant`,
    `conversation_id` ...) or `X-Trident-*` headers; with API keys the key sets the
    tenant and `tier` is not taken from the client. Serves until Ctrl-C or SIGTERM,
    then drains (/health 503, new requests 503, the answers in flight finish, up to
    --drain-timeout) and exits 0; a second signal stops at once.
    """
    # lazy: fastapi, uvicorn and grpc take a while to import; `trident --help` need not wait
    from builder.serve.openai.keys import load_keys
    from builder.serve.openai.limits import Limits
    from builder.serve.openai.policy import DEFAULT_EXPOSE
    from builder.serve.openai.runner import run
    from builder.serve.tracing import from_environment

    tracing = from_environment(otlp_traces_endpoint)  # TracingError: one line, exit 2
    keys = None if api_keys_file is None else load_keys(api_keys_file)
    limits = Limits() if max_body_bytes is None else Limits(max_body_bytes=max_body_bytes)
    expose = expose or DEFAULT_EXPOSE
    click.echo(
        f"OpenAI API on http://{host}:{port}/v1 for Triton at {triton_url} "
        f"(models: {', '.join(expose)})",
        err=True,
    )
    run(
        triton_url,
        host,
        port,
        keys,
        expose,
        limits,
        None if repo is None else Path(repo),
        drain_timeout_s,
        tracing.spans() if tracing is not None else None,
    )
    return 0


COMMANDS = [openai_command]
