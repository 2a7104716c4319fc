"""The one `trident serve` subprocess the server tests share: the tests whose subject is
that process (what a client without keys can do to it: test_restricted_api.py; its
`--load-model` subset, loopback binds, per-start router secret, traces and drain:
test_drain.py) all probe this one, in that order, and the drain ends it, last
(tests/server/conftest.py's `served` fixture; its SIGTERM test is marked
`destructive(stops=True)`). Before, each module started a process of its own.

What it serves: trident's SGLang model three times on the SGLang double, `qwen` paced at
20 tokens/s (the drain's streams, the router's default), `qa` at full speed (model
control and the keeper's reload) and `idle` (present, not loaded), behind `router`, with
the OpenAI frontend on. It runs with a descriptor limit of FD_LIMIT (the flood test's
subject), no admin key and no router secret in its environment (serve makes both per
start), and traces exported to a loopback OTLP collector."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder.serve import admin
from builder.serve.server import Ports, free_port
from support.otlp_collector import Collector
from support.pacing import Rate
from support.serve_traffic import serve_argv
from support.sglang_double import SHIM, paced_shim
from support.vllm_double import write_rate
from tests.helpers import wait_for
from tests.helpers.servers import free_ports, record_spawn, render, served_pid
from trident_common import interface as INTERFACE

LONG_TOKENS = 1000  # the paced double's longest answer (50 s at 20 tokens/s)
DRAIN_TIMEOUT_S = 12
SERVICE = "trident-test"  # OTEL_SERVICE_NAME
LOADED = ("router", "qwen", "qa")
SPEC = {
    "name": "served",
    "hardware": {"gpu": "cpu"},
    "models": [
        {"name": name, "engine": "sglang", "model": "/models/test-double"}
        for name in ("qwen", "qa", "idle")
    ],
    "router": {"default": ["qwen"]},
}
# Its descriptor limit: the frontend keeps connections below it (guard.py's
# RESERVED_FDS), so a flood cannot starve the keeper or the gRPC channel.
FD_LIMIT = 1024
LOWER_FD_LIMIT = (
    "import os, resource, sys; "
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, resource.getrlimit("
    "resource.RLIMIT_NOFILE)[1])); os.execv(sys.argv[1], sys.argv[1:])"
)


@dataclass(frozen=True)
class Served:
    repo: Path
    ports: Ports  # tritonserver's
    openai_port: int
    proc: subprocess.Popen  # `trident serve`
    pid: int  # its tritonserver
    output: Path  # serve's stdout and stderr
    collector: Collector

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.openai_port}"


def serve(folder: Path) -> Iterator[Served]:
    """Start the process, yield it when the frontend is up; at the end leave no process
    behind (a drain test that ran has ended it already)."""
    repo = render(SPEC, folder / "repo")
    control = folder / "rate.json"
    write_rate(control, Rate(ttft_s=0.05, tokens_per_s=20.0))
    (repo / "qwen" / "1" / "sglang.py").write_text(paced_shim(control, LONG_TOKENS))
    for model in ("qa", "idle"):
        (repo / model / "1" / "sglang.py").write_text(SHIM)
    ports, openai_port, output = free_ports(), free_port(), folder / "serve.out"
    collector = Collector().__enter__()
    secrets = (admin.KEY_ENV, INTERFACE.ROUTER_SECRET_ENV)
    env = {k: v for k, v in os.environ.items() if k not in secrets}
    # Traces on, by the standard environment; the frontend's batches leave every 0.2 s.
    env |= {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    loads = [arg for model in LOADED for arg in ("--load-model", model)]
    argv = serve_argv(
        repo,
        ports,
        *loads,
        *("--openai-port", str(openai_port), "--drain-timeout", str(DRAIN_TIMEOUT_S)),
        "--no-self-test",
    )
    started = record_spawn(argv, output, "served: trident serve (restricted API, drain, traces)")
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", LOWER_FD_LIMIT, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    pid = None
    try:
        wait_for(lambda: "OpenAI API:" in output.read_text() or proc.poll() is not None, 180)
        assert proc.poll() is None, output.read_text()
        started.ready()
        pid = served_pid(ports)
        yield Served(repo, ports, openai_port, proc, pid, output, collector)
    finally:
        collector.__exit__(None, None, None)
        if proc.poll() is None:  # the drain test did not run, or failed
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(DRAIN_TIMEOUT_S + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if pid is not None:  # tritonserver's group: its stubs too
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
