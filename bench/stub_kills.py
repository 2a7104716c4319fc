"""Stub deaths under traffic: does one model's fault cost that model only?

`trident serve` (a real tritonserver, the SGLang double) serves `qwen` as two replicas
behind the router with `qb` as its fallback. Client threads stream short answers through
`router` and straight from `qb` without pause while this script SIGKILLs a stub, waits
until serve's keeper has reloaded that model, and goes again: the replicas' stubs and the
router's in turn, --kills times, optionally beside CPU burners (a loaded machine).

What it reports (JSON in --out, a summary line on stdout): the kills made, how many
times tritonserver itself died (serve then starts it again in place: its log says so),
the reloads' times, and the requests that failed per path, with samples of their errors.
A kill of a replica may fail the router requests streaming from it at that moment
(mid-stream, they cannot move) and a kill of the router every router request in flight;
`qb`'s requests should never fail unless tritonserver dies.

Usage: .venv/bin/python -m bench.stub_kills [--kills 30] [--burn 2] [--streams 6]
       [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from builder.pipeline import build_repository
from builder.serve import admin, loading
from builder.serve.server import Ports, free_port
from builder.serve.watch import stub_processes
from builder.spec import parse_spec
from support.serve_traffic import TRITON_ABORT, Traffic, serve_argv
from support.sglang_double import SHIM

REPLICAS = ("qwen__r0", "qwen__r1")
SPEC = {
    "name": "stub-kills",
    "hardware": {"gpu": "cpu"},
    "models": [
        {
            "name": "qwen",
            "engine": "sglang",
            "model": "/models/test-double",
            "instances": 2,
            "engine_args": {"context_length": 4096, "max_running_requests": 16},
        },
        {"name": "qb", "engine": "sglang", "model": "/models/test-double"},
    ],
    "router": {"default": ["qwen"], "fallback": {"qwen": ["qb"]}},
}
VICTIMS = (*REPLICAS, "router")  # in turn
RELOAD_WAIT_S = 120.0
TIMEOUT_S = 60.0  # per streamed answer
# An operator's key (builder/serve/admin.py): the keeper gives a model up after 5 deaths in
# a row within 2 minutes of each other, and this run kills faster than that, so it loads
# a given-up model again as an operator would (the keeper then watches it again).
ADMIN_KEY = "stub-kills-operator-key-" + "0" * 16


def serve(repo: Path, ports: Ports, log: Path) -> subprocess.Popen:
    # --restart-limit: every tritonserver death is counted, none ends the run
    argv = serve_argv(repo, ports, "--no-self-test", "--restart-limit", "100")
    with open(log, "w") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, admin.KEY_ENV: ADMIN_KEY}
        )


def tritonserver_pid(ports: Ports) -> int | None:
    found = subprocess.run(
        ["pgrep", "-f", "--", f"--http-port={ports.http}"], capture_output=True, text=True
    ).stdout.split()
    return int(found[0]) if len(found) == 1 else None


def wait(predicate, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


def kill_and_wait(ports: Ports, model: str, log: Path) -> float | str:
    """SIGKILL a stub of `model`; the seconds until serve said it (or tritonserver) is
    back, or what went wrong."""
    pid = tritonserver_pid(ports)

    def victims() -> list[int]:
        return [s.pid for s in stub_processes(pid).values() if s.model == model] if pid else []

    if not wait(lambda: bool(victims()), 60):
        return f"no stub of {model} to kill"
    said = log.read_text()
    marks = (f"model '{model}' is back", "tritonserver is back", f"giving up on model '{model}'")
    before = [said.count(mark) for mark in marks]
    os.kill(victims()[0], signal.SIGKILL)
    killed = time.monotonic()
    now: list[int] = []

    def back() -> bool:
        said = log.read_text()
        now[:] = [said.count(mark) for mark in marks]
        return any(n > b for n, b in zip(now, before, strict=True))

    if not wait(back, RELOAD_WAIT_S):
        return f"{model} not back within {RELOAD_WAIT_S:.0f} s"
    if now[2] > before[2]:  # given up: the operator loads it again
        time.sleep(2)  # the keeper's unload first
        url = f"http://127.0.0.1:{ports.http}"
        loading.request(url, model, "load", RELOAD_WAIT_S, admin.http_headers(ADMIN_KEY))
    return time.monotonic() - killed


def run(kills: int, burn: int, streams: int, out: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stub-kills-"))
    repo = work / "repo"
    build_repository(parse_spec(SPEC, "<stub_kills>"), repo)
    for model in (*REPLICAS, "qb"):
        (repo / model / "1" / "sglang.py").write_text(SHIM)
    ports = Ports(free_port(), free_port(), free_port())
    log = out / "serve.log"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burn)]
    proc = serve(repo, ports, log)
    traffic: list[Traffic] = []
    reloads: list[float] = []
    missed: list[str] = []
    try:
        if not wait(lambda: "ready:" in log.read_text() or proc.poll() is not None, 300):
            raise SystemExit("stub_kills: trident serve was not ready within 300 s")
        if proc.poll() is not None:
            raise SystemExit(f"stub_kills: trident serve exited: {log.read_text()[-2000:]}")
        url = f"127.0.0.1:{ports.grpc}"
        traffic = [Traffic(url, "router", TIMEOUT_S) for _ in range(streams)] + [
            Traffic(url, "qb", TIMEOUT_S)
        ]
        for thread in traffic:
            thread.start()
        wait(lambda: all(t.answers >= 2 for t in traffic), 60)
        for i in range(kills):
            model = VICTIMS[i % len(VICTIMS)]
            killed = kill_and_wait(ports, model, log)
            if isinstance(killed, str):
                missed.append(f"kill {i + 1}: {killed}")
            else:
                reloads.append(killed)
            time.sleep(1.0)  # traffic on the reloaded model before the next kill
    finally:
        for thread in traffic:
            thread.stopping.set()
        for thread in traffic:
            thread.join(70)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for burner in burners:
            burner.kill()
    said = log.read_text()
    paths: dict[str, dict] = {}
    for thread in traffic:
        path = paths.setdefault(thread.model, {"answers": 0, "failures": Counter()})
        path["answers"] += thread.answers
        path["failures"].update(thread.failures)
    result = {
        "name": "stub_kills",
        "kills": kills,
        "burners": burn,
        "router_streams": streams,
        "tritonserver_deaths": said.count("trident serve: tritonserver exited"),
        "lock_exceptions": said.count(TRITON_ABORT),
        "segfaults": said.count("Signal (11)") + said.count("Segmentation fault"),
        "models_given_up": said.count("giving up on model"),
        "reload_s": sorted(round(r, 1) for r in reloads),
        "missed": missed,
        "paths": {
            model: {
                "answers": p["answers"],
                "failed": sum(p["failures"].values()),
                "failures": dict(p["failures"].most_common(6)),
            }
            for model, p in paths.items()
        },
        "load_average_after": os.getloadavg(),
    }
    (out / "stub_kills.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--burn", type=int, default=0, help="CPU burner processes beside it")
    parser.add_argument("--streams", type=int, default=6, help="router client threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="stub-kills-out-"))
    out.mkdir(parents=True, exist_ok=True)
    result = run(args.kills, args.burn, args.streams, out)
    print(json.dumps(result, indent=2))
    reloads = result["reload_s"]
    failed = ", ".join(
        f"{model} {p['failed']}/{p['answers'] + p['failed']}"
        for model, p in result["paths"].items()
    )
    print(
        f"stub_kills: {result['kills']} kills, tritonserver died "
        f"{result['tritonserver_deaths']} times, reload p50 "
        f"{reloads[len(reloads) // 2] if reloads else '-'} s, failed requests: {failed} "
        f"(details in {out})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
