"""Where the router's first-token time goes: py-spy samples the router's stub while one
client sends sequential requests through `router` to the zero-cost SGLang double (the
deployment of bench/zero_cost.py), and the samples are summed per thread and per
function of the router's files. Profile before optimising (issue 36): this says which
hop to take off the path before anyone times a change.

`--streams N` has N clients send at once instead (the throughput rows of zero_cost: where
the router's stub spends its time when 64 streams share two cores).

Not a benchmark (py-spy's sampling slows the stub it reads, so its TTFT is not the
router's): its output is where the time goes, in shares. py-spy is on PyPI, not in the
lock: `python3 -m pip install --target /tmp/pyspy py-spy`, then
Usage: .venv/bin/python -m bench.router_profile [--py-spy /tmp/pyspy/bin/py-spy]
       [--streams N] [OUT_DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import zero_cost
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.serve.watch import stub_processes
from builder.spec import parse_spec
from support import sglang_double

SECONDS = 25  # sampled; the client runs a second longer on each side
RATE_HZ = 500
# Leaf functions of a thread that waits: the event loop's select, an idle pool worker,
# the metric writer waiting on its queue.
IDLE = {"EpollSelector.select", "_worker", "Writer._run"}
ROUTER_FILES = tuple(
    f"bls/{name}.py" for name in ("model", "relay", "tenants", "read_request", "replicas")
)


async def _requests(url: str, seconds: float, streams: int = 1) -> tuple[int, float]:
    """`streams` clients, each sending its next request when its last one ended."""
    ttfts: list[float] = []
    end = time.monotonic() + seconds

    async def client() -> None:
        worker = zero_cost.Worker(url)
        while time.monotonic() < end:
            ttfts.append((await worker.one(zero_cost.ROUTER, zero_cost.SHORT_TOKENS))[0])
        await worker.close()

    await asyncio.gather(*(client() for _ in range(streams)))
    return len(ttfts), sorted(ttfts)[len(ttfts) // 2]


def _router_file(frame: str) -> bool:
    """py-spy's frame: 'Relay.run (1/bls/relay.py:155)'."""
    return frame.rpartition(" (")[2].rpartition(":")[0].endswith(ROUTER_FILES)


def summarize(raw: Path) -> dict:
    """Samples per thread (busy: not waiting in the event loop's select or an idle pool
    worker), and per router function (inclusive)."""
    threads: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) == 1 or frames[-1].split(" (")[0] in IDLE:
            continue  # no Python frame (the stub's C++ loop), or a thread waiting for work
        threads[frames[0].split(": ", 1)[-1]] += int(count)
        for name in dict.fromkeys(f.split(" (")[0] for f in frames if _router_file(f)):
            functions[name] += int(count)
    return {
        "busy_samples_by_thread": dict(threads.most_common()),
        "router_functions": dict(functions.most_common(25)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path("bench_results/router_profile"))
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--streams", type=int, default=1, help="clients sending at once")
    args = parser.parse_args()
    if args.streams < 1:
        print("router_profile: --streams: must be 1 or more", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trident-router-profile-") as tmp:
        repo = Path(tmp) / "repo"
        build_repository(parse_spec(zero_cost.deployment(), "<bench>"), repo)
        shim = sglang_double.zero_cost_shim(zero_cost.LONG_TOKENS)
        (repo / zero_cost.DIRECT / "1" / "sglang.py").write_text(shim)
        server = start_on_free_ports(repo, Path(tmp) / "tritonserver.log", timeout_s=120)
        try:
            assert server.process is not None
            (stub,) = [
                pid for pid, s in stub_processes(server.process.pid).items() if s.model == "router"
            ]
            raw = args.out / "router.collapsed"
            spy = subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "-p",
                    str(stub),
                    "-d",
                    str(SECONDS),
                    "-r",
                    str(RATE_HZ),
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                    "--threads",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            requests, ttft = asyncio.run(_requests(server.grpc_url, SECONDS + 2, args.streams))
            spy.wait()
        finally:
            server.stop()
    summary = {
        "streams": args.streams,
        "requests": requests,
        "ttft_p50_ms_under_sampling": round(ttft * 1000, 2),
        **summarize(raw),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
