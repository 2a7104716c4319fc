"""A/B of a change to the router's code, both sides in one server: the rendered `router`
(A) and a copy, `router_b` (B), whose version folder a patch script edits, in front of
bench.zero_cost's zero-cost engine model, with the engine model direct and the bare
blocking BLS relay (support/bls_floor.py) as references. Sequential requests of
SHORT_TOKENS tokens, one per path per round, the order shuffled per round (seeded), so
a slow spell of a shared machine hits every path; TTFT (first non-empty text_output) p50
and p90 per path, and B - A. An A/A run (`none`) shows the noise.

Usage: .venv/bin/python -m bench.router_ab PATCH.py|none [ROUNDS]
PATCH.py is run as `python PATCH.py DIR` with DIR the copy's version folder (model.py,
relay.py, ...): it edits them in place. A development tool, not a `make bench` target.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import zero_cost
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support import bls_floor, sglang_double

B = "router_b"
WARM_ROUNDS = 20


def serve(patch: str, work: Path):
    repo = work / "repo"
    build_repository(parse_spec(zero_cost.deployment(), "<bench>"), repo)
    (repo / zero_cost.DIRECT / "1" / "sglang.py").write_text(
        sglang_double.zero_cost_shim(zero_cost.LONG_TOKENS)
    )
    bls_floor.install(repo, zero_cost.DIRECT)
    shutil.copytree(repo / zero_cost.ROUTER, repo / B)
    config = repo / B / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "router"', f'name: "{B}"', 1))
    if patch != "none":
        subprocess.run([sys.executable, patch, str(repo / B / "1")], check=True)
    return start_on_free_ports(repo, work / "tritonserver.log", timeout_s=120)


async def measure(url: str, rounds: int) -> dict[str, list[float]]:
    paths = [zero_cost.ROUTER, B, zero_cost.DIRECT, zero_cost.BLOCKING]
    worker = zero_cost.Worker(url)
    for path in paths * WARM_ROUNDS:
        await worker.one(path, zero_cost.SHORT_TOKENS)
    ttft: dict[str, list[float]] = {path: [] for path in paths}
    order = random.Random(1)
    for _ in range(rounds):
        order.shuffle(paths)
        for path in paths:
            ttft[path].append((await worker.one(path, zero_cost.SHORT_TOKENS))[0])
    await worker.close()
    return ttft


def main(patch: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="trident-router-ab-") as tmp:
        server = serve(patch, Path(tmp))
        try:
            ttft = asyncio.run(measure(server.grpc_url, rounds))
        finally:
            server.stop()
    p50 = {}
    for path, values in ttft.items():
        values.sort()
        p50[path], p90 = 1e3 * values[len(values) // 2], 1e3 * values[len(values) * 9 // 10]
        print(f"{path:14s} TTFT p50 {p50[path]:.3f} ms  p90 {p90:.3f} ms")
    print(f"B - A p50: {p50[B] - p50[zero_cost.ROUTER]:+.3f} ms ({rounds} rounds)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
