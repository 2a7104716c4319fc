"""A `trident serve` subprocess's command line, and client traffic against it: shared by
the tests whose subject is that process (tests/server) and bench/stub_kills.py, which
may not import tests."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from builder.serve import client
from builder.serve.server import Ports

FAILURE_CHARS = 200  # of each failure's words kept: enough to tell the kinds apart
# What tritonserver 2.51 prints, once, when it aborts as a stub dies (issue 34's
# intermittent defect in its Python backend): every model goes down with it.
TRITON_ABORT = "instance of 'boost::interprocess::lock_exception'"


def serve_argv(repo: Path, ports: Ports, *extra: str) -> list[str]:
    """`trident serve` on repo and ports, as a subprocess's argv (extra options after)."""
    return [
        sys.executable,
        "-m",
        "builder.cli.main",
        "serve",
        "--repo",
        str(repo),
        "--http-port",
        str(ports.http),
        "--grpc-port",
        str(ports.grpc),
        "--metrics-port",
        str(ports.metrics),
        *extra,
    ]


class Traffic(threading.Thread):
    """Streams short answers from one model over gRPC, back to back, until stopped:
    `answers` counts the whole ones, `failures` keeps every other outcome's words, of any
    kind (an empty answer included)."""

    def __init__(self, url: str, model: str, timeout_s: float = 30.0):
        super().__init__(daemon=True)
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.answers = 0
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                result = client.stream_generate(
                    self.url, self.model, "hi", max_tokens=8, timeout_s=self.timeout_s
                )
                if result.text and result.finish_reason:
                    self.answers += 1
                else:
                    self.failures.append(f"empty answer: {result}"[:FAILURE_CHARS])
            except Exception as e:  # every failure is counted, of any kind
                self.failures.append(str(e).splitlines()[0][:FAILURE_CHARS])
                time.sleep(0.05)  # a server that is down refuses at once: no busy loop
