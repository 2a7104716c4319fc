"""Run the OpenAI frontend: in the foreground (`trident openai`) or in a thread beside
the tritonserver that `trident serve --openai-port` runs (started once Triton is ready,
stopped with it)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import uvicorn

from builder.errors import TridentError
from builder.serve.openai.app import create_app
from builder.serve.openai.guard import guarded
from builder.serve.openai.limits import Limits
from builder.serve.openai.policy import DEFAULT_EXPOSE
from builder.serve.openai.repository import context_tokens
from builder.serve.openai.triton import Triton
from builder.serve.server import port_in_use


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
) -> uvicorn.Config:
    """uvicorn's configuration (`triton`: a stand-in, for tests)."""
    app = create_app(
        triton_url,
        triton or Triton(triton_url, admin_key),
        api_keys=api_keys,
        expose=expose,
        limits=limits,
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
) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn handles both). `repo`: the repository
    Triton serves, read for the models' context lengths."""
    check_port(host, port)
    server = uvicorn.Server(
        _config(triton_url, host, port, api_keys, expose, with_repository(limits, repo))
    )
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the
    # handler it found: make that one a no-op, so SIGTERM exits 0 (as `trident serve`).
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise FrontendError(f"the OpenAI frontend did not start on {host}:{port}")


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
    ):
        self.triton_url, self.host, self.port = triton_url, host, port
        self.admin_key = admin_key  # the server's (builder/serve/admin.py)
        # none named: the default (`trident serve` passes --expose as given)
        self.expose = tuple(expose) or DEFAULT_EXPOSE
        self.api_keys, self.limits = api_keys, with_repository(limits, repo)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
