"""Small client-side helpers shared by the server tests."""

from __future__ import annotations

import json
import re
import time
import urllib.request


def metrics_text(metrics_url: str) -> str:
    """A Prometheus metrics page, as text."""
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        return r.read().decode()


def metric_value(metrics_url: str, name: str, **labels) -> float:
    """The value of one Prometheus sample (0.0 when absent)."""
    for line in metrics_text(metrics_url).splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    """Poll until predicate() is truthy; returns its value or raises AssertionError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def http_json(url: str, body: dict | None = None, timeout: float = 120.0):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST" if data else "GET",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return r.status, r.read().decode()


def engine_cores(server, model: str) -> list:
    """vLLM's engine-core processes of one model of a server (children of that model's
    stub; they rename themselves EngineCore): what a test kills to kill that engine
    alone, leaving the other models of a shared server theirs."""
    import psutil

    from builder.serve.watch import stub_processes

    cores = []
    for stub in stub_processes(server.process.pid).values():
        if stub.model != model:
            continue
        for child in psutil.Process(stub.pid).children(recursive=True):
            try:
                if "EngineCore" in child.name() + " " + " ".join(child.cmdline()):
                    cores.append(child)
            except psutil.Error:
                continue  # it exited while we looked
    return cores
