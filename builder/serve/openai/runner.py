"""Run the OpenAI frontend: in the foreground (`trident openai`) or in a thread beside
the tritonserver that `trident serve --openai-port` runs (started once Triton is ready,
drained and stopped with it).

The drain (draining.py): in the foreground the first SIGTERM or SIGINT starts it and the
process exits 0 once it is over; a second one stops at once. Beside `trident serve`, the
server's own drain calls Frontend.drain(), watches in_flight and calls cut_off()."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from builder.errors import TridentError
from builder.serve.drain import CUTOFF_GRACE_S
from builder.serve.openai.app import create_app
from builder.serve.openai.draining import DrainGate
from builder.serve.openai.guard import guarded
from builder.serve.openai.limits import Limits
from builder.serve.openai.policy import DEFAULT_EXPOSE
from builder.serve.openai.repository import context_tokens
from builder.serve.openai.triton import Triton
from builder.serve.server import port_in_use
from builder.spec import ServerSpec

POLL_S = 0.1  # how often the drain looks at in_flight (a thread's sleep, not the loop's)


class FrontendError(TridentError):
    """The frontend could not start; the message says why."""


def _config(
    triton_url: str,
    host: str,
    port: int,
    api_keys: dict | None,
    expose: Iterable[str],
    limits: Limits,
    admin_key: str | None = None,
    triton: Triton | None = None,
    drain: DrainGate | None = None,
    metrics_url: str | None = None,
    spans: Any = None,
    engine_gauges: Path | None = None,
) -> uvicorn.Config:
    """uvicorn's configuration (`triton`: a stand-in, for tests; `drain`: the drain's
    state, held by whoever drives it; `engine_gauges`: the server's engine-gauge folder,
    trident_common/engine_gauges.py)."""
    app = create_app(
        triton_url,
        triton or Triton(triton_url, admin_key, metrics_url),
        api_keys=api_keys,
        expose=expose,
        limits=limits,
        drain=drain,
        spans=spans,
        engine_gauges=engine_gauges,
    )
    # The HTTP protocol: a connection's bounds (guard.py), and a streamed answer's headers
    # and first chunk in one write (coalesce.py says why).
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        http=guarded(limits),
    )


def with_repository(limits: Limits, repo: Path | None) -> Limits:
    """The limits with the context lengths of the repository's models (if given)."""
    if repo is None:
        return limits
    return replace(limits, context_tokens={**context_tokens(repo), **limits.context_tokens})


def check_port(host: str, port: int) -> None:
    if port_in_use(port, host):
        raise FrontendError(
            f"OpenAI port {port} on {host} is already in use; choose "
            "another with --port/--openai-port"
        )


def run(
    triton_url: str,
    host: str = "127.0.0.1",
    port: int = 9000,
    api_keys: dict | None = None,
    expose: Iterable[str] = DEFAULT_EXPOSE,
    limits: Limits = Limits(),
    repo: Path | None = None,
    drain_timeout_s: float = ServerSpec.drain_timeout_s,
    traces: Any = None,
) -> None:
    """Serve until SIGTERM or Ctrl-C, then drain (DrainingServer) and return. `repo`:
    the repository Triton serves, read for the models' context lengths; `traces`: the
    frontend's spans (builder/serve/tracing.py) when traces are on."""
    check_port(host, port)
    drain = DrainGate()
    config = _config(
        triton_url,
        host,
        port,
        api_keys,
        expose,
        with_repository(limits, repo),
        drain=drain,
        spans=traces,
    )
    server = DrainingServer(config, drain, drain_timeout_s)
    try:
        server.run()
    finally:
        if traces is not None:
            traces.shutdown()  # the spans still batched leave now
    if not server.started:
        raise FrontendError(f"the OpenAI frontend did not start on {host}:{port}")


def finish_drain(
    drain: DrainGate, timeout_s: float, grace_s: float = CUTOFF_GRACE_S, poll_s: float = POLL_S
) -> None:
    """The drain after its start: wait until no answer is in flight or timeout_s passed,
    cut off what is left (cut_off() also refuses a request still arriving), and give
    those answers up to grace_s to send their end."""
    deadline = time.monotonic() + timeout_s
    while drain.in_flight and time.monotonic() < deadline:
        time.sleep(poll_s)
    drain.cut_off()
    deadline = time.monotonic() + grace_s
    while drain.in_flight and time.monotonic() < deadline:
        time.sleep(poll_s)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the drain as its answer to SIGTERM and SIGINT. uvicorn's own
    (Server.handle_exit, installed by Server.run on the main thread) stops listening at
    once, waits 5 s for the connections, and raises the signal again; here the first
    signal starts the drain and the server keeps listening, refusing new work in words,
    until finish_drain() is over (in a thread: it sleeps); a second signal stops at
    once. No signal is raised again: the process exits 0, as `trident serve` does."""

    def __init__(self, config: uvicorn.Config, drain: DrainGate, timeout_s: float):
        super().__init__(config)
        self.drain, self.timeout_s = drain, timeout_s
        self.drainer: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drainer is not None:
            self.should_exit = self.force_exit = True
            return
        self.drain.start()
        self.drainer = threading.Thread(target=self._drain_and_exit, name="openai-drain")
        self.drainer.daemon = True
        self.drainer.start()

    def _drain_and_exit(self) -> None:
        finish_drain(self.drain, self.timeout_s)
        self.should_exit = True


class Frontend:
    """The frontend in a background thread with its own event loop."""

    def __init__(
        self,
        triton_url: str,
        host: str = "127.0.0.1",
        port: int = 9000,
        api_keys: dict | None = None,
        expose: Iterable[str] = DEFAULT_EXPOSE,
        limits: Limits = Limits(),
        repo: Path | None = None,
        admin_key: str | None = None,
        triton: Triton | None = None,
        metrics_url: str | None = None,
        spans: Any = None,
        engine_gauges: Path | None = None,
    ):
        self.triton_url, self.host, self.port = triton_url, host, port
        self.metrics_url = metrics_url  # Triton's, for the pod's load on /metrics
        self.engine_gauges = engine_gauges  # SGLang's, for the same (pod_metrics.py)
        self.spans = spans  # the frontend's, when traces are on (builder/serve/tracing.py)
        self._triton = triton  # a stand-in, for tests
        self.admin_key = admin_key  # the server's (builder/serve/admin.py)
        # none named: the default (`trident serve` passes --expose as given)
        self.expose = tuple(expose) or DEFAULT_EXPOSE
        self.api_keys, self.limits = api_keys, with_repository(limits, repo)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._drain = DrainGate()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def drain(self) -> None:
        """Enter the drain (idempotent, from any thread): /health and new /v1 requests
        are 503 from the next request on; the answers in flight go on."""
        self._drain.start()

    def pause(self) -> None:
        """While tritonserver restarts (from any thread): /health and new /v1 requests
        are 503, as in a drain, until resume()."""
        self._drain.pause()

    def resume(self) -> None:
        self._drain.resume()

    def abandon(self, model: str) -> None:
        """`model`'s stub died (from any thread): its answers in flight end now with a
        503 in words (DrainGate.abandon)."""
        self._drain.abandon(model)

    @property
    def in_flight(self) -> int:
        """The generation requests admitted and not yet fully answered."""
        return self._drain.in_flight

    def cut_off(self) -> None:
        """End every answer still running (from any thread): a stream with one
        `server_shutdown` error event, then [DONE]. Then give them a moment (watch
        in_flight) before stop()."""
        self._drain.cut_off()

    def start(self, timeout_s: float = 15.0) -> Frontend:
        check_port(self.host, self.port)
        self._server = uvicorn.Server(
            _config(
                self.triton_url,
                self.host,
                self.port,
                self.api_keys,
                self.expose,
                self.limits,
                self.admin_key,
                self._triton,
                self._drain,
                self.metrics_url,
                self.spans,
                self.engine_gauges,
            )
        )
        # uvicorn installs signal handlers only on the main thread: none here.
        self._thread = threading.Thread(
            target=self._server.run, name="openai-frontend", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise FrontendError(f"the OpenAI frontend did not start on {self.host}:{self.port}")
            time.sleep(0.05)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout_s)
        self._server = self._thread = None

    def __enter__(self) -> Frontend:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
