"""Router overhead: the same requests through `router` and straight to `smollm2`, one run.

Renders deploy/default.yaml, starts one tritonserver, warms both paths up, then alternates
rounds (router, direct, router, direct, ...) so drift and noise hit both alike:
- TTFT at 1 stream: single short requests, alternating paths (the cleanest view of the
  latency the router adds);
- TTFT and tokens/s at 8 and 16 concurrent streams (greedy, fixed length via ignore_eos).
The 1-stream requests go to two bare BLS relays in front of `smollm2` too
(support/bls_floor.py): what any BLS hop costs beside what the router adds to it.
The router's own histogram (trident_router_added_latency_seconds: router time on the
first-token path) is reported too. Targets (issues 4 and 16): router keeps >= 0.98x
tokens/s at 8 and 16 streams; TTFT is reported against direct + 1 ms (1 stream) and
direct + 2 ms (16 streams), the zero-cost engine's goals (bench/zero_cost.py).
"""

from __future__ import annotations

import random
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench.common import (  # noqa: E402
    GREEDY_LONG,
    PROMPTS,
    bench_result,
    relay_floor_rows,
    stream_round,
)
from builder.pipeline import build_repository  # noqa: E402
from builder.serve.client import stream_generate  # noqa: E402
from builder.serve.server import TritonServer, start_on_free_ports  # noqa: E402
from builder.spec import load_spec  # noqa: E402
from support import bls_floor  # noqa: E402

BACKEND, ROUTER = "smollm2", "router"
STREAMS = (8, 16)
MAX_TOKENS = 48
ROUNDS = 4  # per path, alternating
SINGLE_REQUESTS = 30  # per path (rounds of one per path, shuffled)
SAMPLING = GREEDY_LONG


def one_round(url: str, model: str, streams: int) -> tuple[list[float], float]:
    """Concurrent streams; (TTFT of each, output tokens per second for the round)."""
    result = stream_round(url, model, streams, MAX_TOKENS)
    return result["ttft_s"], result["tokens_per_s"]


def single_ttfts(url: str) -> dict[str, list[float]]:
    paths = [ROUTER, BACKEND, bls_floor.BLOCKING, bls_floor.ASYNC]
    ttft, order = {model: [] for model in paths}, random.Random(0)
    for _ in range(SINGLE_REQUESTS):
        order.shuffle(paths)
        for model in paths:
            ttft[model].append(
                stream_generate(
                    url, model, PROMPTS[0], max_tokens=1, chat=False, sampling=SAMPLING
                ).ttft_s
            )
    return ttft


def router_added_latency(metrics_url: str) -> tuple[float, int]:
    """Mean router-added first-token latency from the router's histogram, and count."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    values = {}
    for suffix in ("sum", "count"):
        match = re.search(
            rf"^trident_router_added_latency_seconds_{suffix}\{{[^}}]*\}} (\S+)$", text, re.M
        )
        values[suffix] = float(match.group(1)) if match else 0.0
    count = int(values["count"])
    return (values["sum"] / count if count else 0.0), count


def measure(server: TritonServer) -> dict:
    url = server.grpc_url
    for model in (ROUTER, BACKEND):  # warm-up: compile paths, fill caches
        one_round(url, model, max(STREAMS))
    single = single_ttfts(url)
    ttfts = {n: {ROUTER: [], BACKEND: []} for n in STREAMS}
    rates = {n: {ROUTER: [], BACKEND: []} for n in STREAMS}
    for streams in STREAMS:
        for i in range(ROUNDS):
            for model in (ROUTER, BACKEND) if i % 2 == 0 else (BACKEND, ROUTER):
                round_ttft, rate = one_round(url, model, streams)
                ttfts[streams][model] += round_ttft
                rates[streams][model].append(rate)
    mean_added, samples = router_added_latency(server.metrics_url)
    return {
        "single": single,
        "ttft": ttfts,
        "rates": rates,
        "router_added_mean_s": mean_added,
        "router_added_samples": samples,
    }


def rows_from(m: dict) -> list[dict]:
    def median_ms(values):
        return statistics.median(values) * 1000

    single = {path: median_ms(values) for path, values in m["single"].items()}
    single_r, single_d = single[ROUTER], single[BACKEND]
    rows = [
        {
            "metric": "TTFT median ms, 1 stream",
            "ours": single_r,
            "direct": single_d,
            "ratio": single_r / single_d,
            "target": "router adds <= 1 ms",
            "met": single_r - single_d <= 1.0,
        },
        *relay_floor_rows("TTFT median ms, 1 stream", single, BACKEND, ROUTER),
    ]
    for streams in STREAMS:
        ttft_r, ttft_d = (median_ms(m["ttft"][streams][p]) for p in (ROUTER, BACKEND))
        rate_r, rate_d = (statistics.median(m["rates"][streams][p]) for p in (ROUTER, BACKEND))
        rows.append(
            {
                "metric": f"tokens/s, {streams} streams",
                "ours": rate_r,
                "direct": rate_d,
                "ratio": rate_r / rate_d,
                "target": ">= 0.98x",
                "met": rate_r / rate_d >= 0.98,
            }
        )
        rows.append(
            {
                "metric": f"TTFT median ms, {streams} streams",
                "ours": ttft_r,
                "direct": ttft_d,
                "ratio": ttft_r / ttft_d,
                "target": "router adds <= 2 ms",
                "met": ttft_r - ttft_d <= 2.0,
            }
        )
    rows.append(
        {
            "metric": "router time on first-token path, mean ms (router metric)",
            "ours": m["router_added_mean_s"] * 1000,
            "direct": None,
            "ratio": None,
            "target": "<= 1 ms",
            "met": m["router_added_mean_s"] * 1000 <= 1.0,
        }
    )
    return rows


def run(out_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="trident-bench-router-") as tmp:
        repo = Path(tmp) / "repo"
        build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
        bls_floor.install(repo, BACKEND)
        server = start_on_free_ports(repo, Path(out_dir) / "router_overhead.tritonserver.log")
        try:
            measured = measure(server)
        finally:
            server.stop()
    return bench_result(
        "router_overhead",
        rows_from(measured),
        {
            "streams": STREAMS,
            "max_tokens": MAX_TOKENS,
            "rounds": ROUNDS,
            "single_requests": SINGLE_REQUESTS,
            "sampling": SAMPLING,
        },
        measured,
    )


if __name__ == "__main__":
    import json

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_results")
    out.mkdir(parents=True, exist_ok=True)
    result = run(out)
    print(json.dumps(result["rows"], indent=2))
