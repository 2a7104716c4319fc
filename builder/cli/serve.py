"""`trident serve | infer`: run tritonserver on a repository, and talk to it."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from builder.cli.common import (
    api_keys_option,
    complete_dir,
    drain_timeout_option,
    expose_option,
    otlp_traces_option,
    sigterm_as_interrupt,
)
from builder.errors import EXIT_USAGE, TridentError
from builder.serve.watch import HANG_TIMEOUT_S, MIN_HANG_TIMEOUT_S
from builder.spec import ServerSpec

LOOPBACK = "127.0.0.1"  # as builder.serve.server's, not imported: `--help` stays fast
# Inside the server's run folder (the drain's): where SGLang writes its load gauges.
ENGINE_GAUGES_FOLDER = "engine-gauges"


@click.command()
@click.option(
    "--repo",
    default="model_repository",
    metavar="DIR",
    show_default=True,
    shell_complete=complete_dir,
    help="model repository to serve",
)
@click.option("--http-port", type=int, default=ServerSpec.http_port, show_default=True)
@click.option("--grpc-port", type=int, default=ServerSpec.grpc_port, show_default=True)
@click.option("--metrics-port", type=int, default=ServerSpec.metrics_port, show_default=True)
@click.option(
    "--triton-host",
    default=LOOPBACK,
    show_default=True,
    metavar="ADDR",
    help="address Triton's HTTP and gRPC ports bind to (they take no API keys: keep them private)",
)
@click.option(
    "--metrics-host",
    default=LOOPBACK,
    show_default=True,
    metavar="ADDR",
    help="address of the metrics port (0.0.0.0 for a Prometheus elsewhere)",
)
@click.option(
    "--allow-open-triton",
    is_flag=True,
    help="with --api-keys-file, let --triton-host be a non-loopback address "
    "(anyone reaching it bypasses the keys)",
)
@click.option(
    "--timeout",
    type=float,
    default=300.0,
    show_default=True,
    help="seconds to wait for the server and its models to be ready (the "
    "models load one after another; one that does not is named)",
)
@click.option(
    "--load-model",
    multiple=True,
    metavar="MODEL",
    help="load only these models (explicit model control); repeatable",
)
@click.option(
    "--openai-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="also serve the OpenAI API on this port (started once Triton is ready)",
)
@click.option(
    "--openai-host", default="127.0.0.1", show_default=True, help="address of the OpenAI API"
)
@api_keys_option(
    "the OpenAI API requires keys: one `KEY TENANT` per line (see `trident openai --help`)"
)
@expose_option()
@drain_timeout_option(
    "on SIGTERM, Ctrl-C or `trident drain`: how long the answers in flight may "
    "take to finish while new requests are refused (what still runs then is ended "
    "with an error); a second signal stops at once"
)
@otlp_traces_option(
    "export OpenTelemetry traces (OTLP over HTTP) of the frontend and tritonserver "
    "here; default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT "
    "(OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER are honoured); "
    "none: nothing is traced"
)
@click.option(
    "--restart-limit",
    type=click.IntRange(0, 100),
    default=3,
    show_default=True,
    help="when tritonserver itself dies, start it again in place this many times in a "
    "row (the OpenAI API answers 503 meanwhile), then exit 1; 0: exit at once",
)
@click.option(
    "--stub-hang-timeout",
    "stub_hang_timeout_s",
    type=click.FloatRange(0, 3600),
    default=HANG_TIMEOUT_S,
    show_default=True,
    callback=lambda _ctx, _param, value: _hang_timeout(value),
    help="seconds: a model's stub in which no Python ran this long (its heartbeat, one a "
    f"second) is killed, and the model reloaded like one whose stub died; at least "
    f"{MIN_HANG_TIMEOUT_S:g}, or 0: never",
)
@click.option(
    "--no-self-test",
    is_flag=True,
    help="skip the start-up check that the server's Python stub passes strings "
    "intact (one echo through a throwaway second server, ~0.5 s)",
)
def serve(**given: Any) -> int:
    """Run tritonserver on a model repository.

    Triton's ports bind to 127.0.0.1 unless --triton-host says otherwise. The models load
    one after another, engine models before the router. Serves until SIGTERM, Ctrl-C or
    `trident drain`, then drains: /health and new requests are refused (503, UNAVAILABLE
    "draining"), the answers in flight finish within --drain-timeout, then tritonserver
    stops (exit 0). After `trident drain` it waits for SIGTERM to exit; a second signal
    stops at once. A model whose stub process or engine dies is reloaded alone, with backoff
    (a line on stderr says so); so is one whose stub hangs, killed first
    (--stub-hang-timeout); after 5 restarts in a row it is unloaded and the other
    models keep serving. When tritonserver itself dies it is started again in place, with
    backoff, up to --restart-limit times in a row (the OpenAI API answers 503 meanwhile);
    then serve exits 1, so a supervisor can restart it. Uses tritonserver from PATH when
    there is one, else the bundled one.
    Before it reports ready, one string goes through an echo model on a short-lived
    second server with the same binary and stub; exits 1 if it comes back changed (the
    bundled Python 3.12 stub corrupts strings).
    """
    return _serve(ServeOptions(**given))


@dataclass(frozen=True)
class ServeOptions:
    """`trident serve`'s options as given, by their click names."""

    repo: str
    http_port: int
    grpc_port: int
    metrics_port: int
    triton_host: str
    metrics_host: str
    allow_open_triton: bool
    timeout: float
    load_model: tuple[str, ...]
    openai_port: int | None
    openai_host: str
    api_keys_file: str | None
    expose: tuple[str, ...]
    drain_timeout_s: float
    otlp_traces_endpoint: str | None
    restart_limit: int
    stub_hang_timeout_s: float
    no_self_test: bool


def _hang_timeout(value: float) -> float:
    if 0 < value < MIN_HANG_TIMEOUT_S:
        raise click.BadParameter(
            f"{value:g} s would kill stubs that only missed a beat or two (one a second): "
            f"at least {MIN_HANG_TIMEOUT_S:g}, or 0 for never"
        )
    return value


def _serve(o: ServeOptions) -> int:
    """Serve until stopped: start, then watch (reloads, restarts) until a signal drains
    it or tritonserver ends for good; stop whatever was started."""
    from builder.serve.drain import Drain, DrainRequested, drain_on_signal

    repo_dir = Path(o.repo)
    _check_repo_and_host(repo_dir, o.triton_host, o.api_keys_file, o.allow_open_triton)
    server = _server(o, repo_dir)
    tracing = _traced(server, o.otlp_traces_endpoint)
    traces = tracing.spans() if tracing is not None and o.openai_port is not None else None
    frontend = None
    api_keys = _openai_options(o.openai_host, o.openai_port, o.api_keys_file, o.expose)

    drain = Drain(o.drain_timeout_s)
    server.drain_folder = drain.folder  # the models watch it (trident_common/drain.py)
    # SGLang writes its load there, the frontend reads it (trident_common/engine_gauges.py);
    # removed with the drain's folder.
    server.gauges_folder = drain.folder / ENGINE_GAUGES_FOLDER
    report = lambda line: click.echo(line, err=True)  # noqa: E731
    drained = False
    try:
        drain.create()
        # Until it serves there is nothing to drain: any of these signals stops it.
        with sigterm_as_interrupt(signal.SIGUSR1):
            server.start()
            server.wait_ready(o.timeout)
            click.echo(
                f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  "
                f"metrics {server.metrics_url}"
            )
            if o.openai_port is not None:
                frontend = _start_frontend(
                    server, o.openai_host, o.openai_port, api_keys, o.expose, repo_dir, traces
                )
                drain.frontend = frontend
                click.echo(f"OpenAI API: {frontend.url}/v1")
            sys.stdout.flush()
        with drain_on_signal():  # from here a signal drains; a second one stops at once
            try:
                # Returns only by raising, when tritonserver exits for good; a model
                # that dies meanwhile is reloaded alone, a tritonserver that dies is
                # started again, and each event is one line on stderr.
                server.monitor(
                    report,
                    restart_limit=o.restart_limit,
                    hang_s=o.stub_hang_timeout_s,
                    ready_timeout_s=o.timeout,
                    **_frontend_hooks(frontend),
                )
            except DrainRequested as asked:
                drain.run(report)
                drained = True
                if asked.signum == signal.SIGUSR1:
                    # `trident drain` (a preStop hook) returns now; the kubelet's SIGTERM
                    # comes after it, and stops what is left at once.
                    _wait_for_exit(server, report)
    except KeyboardInterrupt:
        pass
    finally:
        _stop(server, frontend, traces, drain, drained)
    return 0


def _server(o: ServeOptions, repo_dir: Path):
    """The tritonserver to run (not started)."""
    from builder.serve.server import Ports, TritonServer

    return TritonServer(
        repo_dir,
        Ports(o.http_port, o.grpc_port, o.metrics_port),
        load_models=o.load_model or None,
        self_test=not o.no_self_test,
        host=o.triton_host,
        metrics_host=o.metrics_host,
    )


def _check_repo_and_host(
    repo_dir: Path, triton_host: str, api_keys_file: str | None, allow_open_triton: bool
) -> None:
    """Refuse a missing repository, and keys that Triton's open ports would bypass."""
    from builder.serve.server import is_loopback

    if not repo_dir.is_dir():
        raise TridentError(
            f"{repo_dir}: no such model repository (run `trident repo` first)", EXIT_USAGE
        )
    if api_keys_file is not None and not is_loopback(triton_host) and not allow_open_triton:
        raise TridentError(
            f"trident serve: --triton-host {triton_host} is not a loopback "
            "address: with --api-keys-file, clients reaching Triton's ports "
            "would bypass the keys (add --allow-open-triton to mean it)",
            EXIT_USAGE,
        )


def _traced(server, otlp_traces_endpoint: str | None):
    """The tracing the environment asks for (None: none), Triton and its stubs set to
    export to it."""
    from builder.serve.tracing import from_environment

    tracing = from_environment(otlp_traces_endpoint)  # TracingError: one line, exit 2
    if tracing is not None:
        server.extra_args = (*server.extra_args, *tracing.triton_args())
        server.extra_env = tracing.stub_environment()
    return tracing


def _openai_options(
    openai_host: str, openai_port: int | None, api_keys_file: str | None, expose: tuple
) -> dict | None:
    """The OpenAI frontend's options checked, and its API keys (None: no keys)."""
    if openai_port is not None:
        from builder.serve.openai.runner import check_port

        check_port(openai_host, openai_port)  # before minutes of model loading
    if api_keys_file is not None:
        if openai_port is None:
            raise TridentError("--api-keys-file needs --openai-port", EXIT_USAGE)
        from builder.serve.openai.keys import load_keys

        api_keys = load_keys(api_keys_file)  # before loading too: a bad file fails now
    else:
        api_keys = None
    if expose and openai_port is None:
        raise TridentError("--expose needs --openai-port", EXIT_USAGE)
    return api_keys


def _start_frontend(server, openai_host, openai_port, api_keys, expose, repo_dir, traces):
    """The OpenAI frontend, started, on the ready server."""
    from builder.serve.openai.runner import Frontend

    return Frontend(
        server.grpc_url,
        openai_host,
        openai_port,
        api_keys,
        expose,
        repo=repo_dir,
        admin_key=server.admin_key,
        metrics_url=server.metrics_url,
        spans=traces,
        engine_gauges=server.gauges_folder,
    ).start()


def _frontend_hooks(frontend) -> dict:
    """monitor's down, up and lost: the frontend's pause, resume and abandon."""
    if frontend is None:
        return {"down": lambda: None, "up": lambda: None, "lost": lambda _model: None}
    return {"down": frontend.pause, "up": frontend.resume, "lost": frontend.abandon}


def _wait_for_exit(server, report) -> None:
    """After `trident drain`: wait until tritonserver is gone (SIGTERM stops it)."""
    report("drained: waiting for SIGTERM")
    while server.process is not None and server.process.poll() is None:
        time.sleep(0.5)


def _stop(server, frontend, traces, drain, drained: bool) -> None:
    """Stop tritonserver, the frontend and the traces, and remove the drain's folder."""
    from builder.serve.drain import DRAINED_EXIT_GRACE_S, STOP_GRACE_S

    if server.process is not None and server.process.poll() is None:
        click.echo("stopping tritonserver", err=True)
        if drained:  # nothing in flight: Triton's exit runs while the frontend stops
            server.terminate()
    if frontend is not None:
        frontend.stop()
    if traces is not None:
        traces.shutdown()  # the spans still batched leave now
    server.stop(grace_s=DRAINED_EXIT_GRACE_S if drained else STOP_GRACE_S)
    drain.remove()


@click.command()
@click.option("--model", default="router", show_default=True, help="model to ask")
@click.option(
    "--url",
    default=f"127.0.0.1:{ServerSpec.grpc_port}",
    show_default=True,
    metavar="HOST:PORT",
    help="gRPC endpoint",
)
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy")
@click.option("--raw", is_flag=True, help="send text_input as is instead of a chat message")
@click.argument("prompt", nargs=-1, required=True)
def infer(
    model: str, url: str, max_tokens: int, temperature: float, raw: bool, prompt: tuple[str, ...]
) -> int:
    """Stream a generation for PROMPT from a served model over gRPC.

    Prints the text as it arrives, then who served it, why it finished, the time to the
    first token and the token count (on stderr).
    """
    # lazy: tritonclient and grpc take a while to import; `trident --help` need not wait
    from builder.serve import client

    result = client.stream_generate(
        url,
        model,
        " ".join(prompt),
        max_tokens,
        chat=not raw,
        on_text=_print_chunk,
        sampling={"temperature": temperature},
    )
    click.echo()
    click.echo(
        f"[served_by={result.served_by} finish_reason={result.finish_reason} "
        f"ttft={result.ttft_s * 1000:.0f} ms tokens={result.output_tokens}]",
        err=True,
    )
    return 0


def _print_chunk(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@click.command()
@click.option(
    "--pid",
    type=int,
    default=None,
    help="the `trident serve` to drain (default: the only one running here)",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0, 3600),
    default=None,
    metavar="SECONDS",
    help="how long to wait for the drain (default: the server's drain timeout, plus "
    "the cut-off after it)",
)
def drain(pid: int | None, timeout: float | None) -> int:
    """Drain a `trident serve` on this machine and wait until it is drained.

    The server refuses new requests from now on (/health and new OpenAI requests 503,
    Triton's ports UNAVAILABLE "draining"), its answers in flight finish within its
    --drain-timeout, and what still runs then is ended with an error. The server then
    waits for SIGTERM (it stops at once). Made for a Kubernetes preStop hook: the
    kubelet's SIGTERM comes after this returns. Only the server's own user may drain
    it (the request is a signal). Exit 1 when the wait timed out.
    """
    from builder.serve.drain import DrainError, ask_to_drain, find_server

    try:
        target = find_server(pid)
    except DrainError as e:
        raise TridentError(str(e), EXIT_USAGE) from None
    if not ask_to_drain(target, timeout):
        raise TridentError(f"trident serve {target} did not finish its drain in time")
    click.echo(f"drained: trident serve {target}")
    return 0


COMMANDS = [serve, infer, drain]
