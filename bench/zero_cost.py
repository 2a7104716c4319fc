"""The router hop with a zero-cost engine: `router` vs the engine model, same server, one run.

trident's SGLang model serves the SGLang test double (support/fake_sglang.py), which
makes tokens at no cost, so what is measured is Triton + the Python stubs + the relay, plus
the router's BLS hop on the router path. Requests alternate between the two paths so that
noise hits both. A client is one asyncio process with one gRPC stream per concurrent
worker (tritonclient.grpc.aio), each worker sending its requests one after another.

The sequential round also times three bare BLS relays in front of the same engine model
(support/bls_floor.py): a blocking one (no hop, no routing: the least any Python BLS model
pays), a threaded one (one thread hop: the least a relay serving many streams at once
pays) and python_backend's own async BLS idiom, so the router's added TTFT reads as the
hop's floor plus the router's own share.

The concurrent rounds also read the server's CPU time (tritonserver and its stubs, from
/proc) before and after each round: CPU ms per request, router against direct. On 2 cores
the router's requests/s is bound by that CPU, and the CPU a request costs moves less with
the machine's other load than requests/s do, so a change to the hot path shows there first.

Goals (issue 16): TTFT p50 <= direct + 1 ms sequential and <= direct + 2 ms at 16 streams;
requests/s at 64 concurrent streams >= 0.9x direct (issue 36 asks 0.8x with 4-token
answers: these are 8, and 0.9x the stricter); per streamed token of one long stream <= 1.3x
direct. Issue 36: the router's share over the blocking relay <= 0.3 ms, and requests/s at
64 streams with 64-token answers >= 0.9x direct (0.8x in issue 22).
Usage: .venv/bin/python -m bench.zero_cost [OUT_DIR]  (the rows on stdout, everything in
OUT_DIR/zero_cost.json)
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import tritonclient.grpc.aio as aioclient

from bench.common import bench_result, cpu_seconds, ratio_row, relay_floor_rows, server_processes
from builder.pipeline import build_repository
from builder.serve.client import build_inputs, first_output
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support import bls_floor, sglang_double

ROOT = Path(__file__).resolve().parent.parent
DIRECT, ROUTER = sglang_double.MODEL, "router"
# the bare relays (sequential only)
BLOCKING, THREADED, ASYNC = bls_floor.BLOCKING, bls_floor.THREADED, bls_floor.ASYNC
SEQUENTIAL = 200  # single requests per path (rounds of one per path, shuffled)
SHORT_TOKENS = 8  # tokens per request in the latency and throughput rounds
CONCURRENCY = (16, 64)
LONG_ANSWER = (64, 64)  # issue 22's point: (streams, tokens per answer)
LONG_ANSWER_RATIO = 0.9  # of direct's requests/s there (issue 36; issue 22 asked 0.8)
ROUTER_SHARE_MS = 0.3  # the router's TTFT over the blocking relay's, at most (issue 36)
PER_WORKER = 12  # requests per worker per round
ROUNDS = 3  # concurrent rounds per path, alternating
LONG_TOKENS = 1000  # one stream, for the per-chunk cost
LONG_RUNS = 5


class Worker:
    """One gRPC stream; `one()` sends a request and reads its responses to the last one."""

    def __init__(self, url: str):
        self.client = aioclient.InferenceServerClient(url)
        self.outgoing: asyncio.Queue = asyncio.Queue()
        self.responses = self.client.stream_infer(self._requests())

    async def _requests(self):
        while (request := await self.outgoing.get()) is not None:
            yield request

    async def one(self, model: str, tokens: int) -> tuple[float, int]:
        """(seconds to the first text chunk, tokens) of one streamed request. Tokens,
        not chunks: under load the engine model sends the tokens that piled up as one
        response (trident_common/outbox.py), so a stream's chunk count varies."""
        await self.outgoing.put(
            {
                "model_name": model,
                "inputs": build_inputs(prompt="go", max_tokens=tokens),
                "request_id": uuid.uuid4().hex,
                "enable_empty_final_response": True,
            }
        )
        start, ttft = time.perf_counter(), None
        async for result, error in self.responses:
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            if first_output(result, "text_output"):
                ttft = ttft or time.perf_counter() - start
            # The aio client cannot ask for the empty final response (a reserved
            # parameter): the last chunk is the one that carries a finish reason.
            if first_output(result, "finish_reason"):  # num_output_tokens: the total
                return ttft or 0.0, int(first_output(result, "num_output_tokens") or 0)
        raise RuntimeError(f"{model}: stream ended without a finish reason")

    async def close(self) -> None:
        await self.outgoing.put(None)
        await self.client.close()


async def sequential(url: str) -> dict[str, list[float]]:
    """TTFT of SEQUENTIAL 1-token requests per path; each round sends one to every path,
    in an order shuffled per round (seeded), so that drift and one path's wake-up of the
    next hit every path alike."""
    paths = [ROUTER, DIRECT, BLOCKING, THREADED, ASYNC]
    worker, ttft, order = Worker(url), {model: [] for model in paths}, random.Random(0)
    try:
        for model in paths:  # the relays' first calls load their BLS code paths
            await worker.one(model, 1)
        for _ in range(SEQUENTIAL):
            order.shuffle(paths)
            for model in paths:
                ttft[model].append((await worker.one(model, 1))[0])
    finally:
        await worker.close()
    return ttft


async def concurrent_round(
    url: str,
    model: str,
    streams: int,
    tokens: int = SHORT_TOKENS,
    cpu_s: Callable[[], dict[str, float]] = dict,
) -> dict:
    workers = [Worker(url) for _ in range(streams)]

    async def run(worker):
        return [await worker.one(model, tokens) for _ in range(PER_WORKER)]

    try:
        start, cpu_before = time.perf_counter(), cpu_s()
        results = await asyncio.gather(*(run(w) for w in workers))
        wall, cpu_after = time.perf_counter() - start, cpu_s()
    finally:
        await asyncio.gather(*(w.close() for w in workers))
    done = [r for worker_results in results for r in worker_results]
    by_process = {k: (v - cpu_before.get(k, 0.0)) / len(done) for k, v in cpu_after.items()}
    return {
        "requests_per_s": len(done) / wall,
        "ttft_s": [t for t, _ in done],
        "cpu_s_per_request": sum(by_process.values()),
        "cpu_s_per_request_by_process": by_process,
    }


async def concurrent(
    url: str,
    streams: int,
    tokens: int = SHORT_TOKENS,
    cpu_s: Callable[[], dict[str, float]] = dict,
) -> dict:
    rounds = {ROUTER: [], DIRECT: []}
    for i in range(ROUNDS):
        for model in (ROUTER, DIRECT) if i % 2 == 0 else (DIRECT, ROUTER):
            rounds[model].append(await concurrent_round(url, model, streams, tokens, cpu_s))
    return {
        model: {
            "requests_per_s": statistics.median(r["requests_per_s"] for r in rs),
            "ttft_p50_s": statistics.median(t for r in rs for t in r["ttft_s"]),
            "cpu_s_per_request": statistics.median(r["cpu_s_per_request"] for r in rs),
            "cpu_s_per_request_by_process": {
                name: statistics.median(r["cpu_s_per_request_by_process"][name] for r in rs)
                for name in rs[0]["cpu_s_per_request_by_process"]
            },
        }
        for model, rs in rounds.items()
    }


async def per_chunk(url: str) -> dict[str, float]:
    """Seconds per streamed token of a LONG_TOKENS stream (median of LONG_RUNS)."""
    worker, seconds = Worker(url), {ROUTER: [], DIRECT: []}
    try:
        for i in range(LONG_RUNS):
            for model in (ROUTER, DIRECT) if i % 2 == 0 else (DIRECT, ROUTER):
                start = time.perf_counter()
                _, tokens = await worker.one(model, LONG_TOKENS)
                if tokens != LONG_TOKENS:
                    raise RuntimeError(f"{model}: {tokens} tokens, wanted {LONG_TOKENS}")
                seconds[model].append((time.perf_counter() - start) / tokens)
    finally:
        await worker.close()
    return {model: statistics.median(values) for model, values in seconds.items()}


async def measure(url: str, cpu_s: Callable[[], dict[str, float]] = dict) -> dict:
    """cpu_s: the server's CPU seconds so far, by process (common.cpu_seconds)."""
    await concurrent_round(url, ROUTER, 4)  # warm-up: both paths, every code path
    await concurrent_round(url, DIRECT, 4)
    single = await sequential(url)
    streams, tokens = LONG_ANSWER
    return {
        "sequential_ttft_s": single,
        "concurrent": {str(n): await concurrent(url, n, cpu_s=cpu_s) for n in CONCURRENCY},
        "long_answers": await concurrent(url, streams, tokens, cpu_s),
        "per_chunk_s": await per_chunk(url),
    }


def rows_from(m: dict) -> list[dict]:
    def ms(seconds):
        return seconds * 1000

    seq = {k: ms(statistics.median(v)) for k, v in m["sequential_ttft_s"].items()}
    c16, c64 = m["concurrent"]["16"], m["concurrent"]["64"]
    t16 = {k: ms(v["ttft_p50_s"]) for k, v in c16.items()}
    rps64 = {k: v["requests_per_s"] for k, v in c64.items()}
    chunk = {k: ms(v) for k, v in m["per_chunk_s"].items()}
    long = {k: v["requests_per_s"] for k, v in m["long_answers"].items()}

    def cpu_ms(runs: dict) -> dict:
        return {k: ms(v["cpu_s_per_request"]) for k, v in runs.items()}

    return [
        _row("TTFT p50 ms, sequential", seq, "<= direct + 1 ms", seq[ROUTER] - seq[DIRECT] <= 1),
        *relay_floor_rows("TTFT p50 ms, sequential", seq, DIRECT, ROUTER, ROUTER_SHARE_MS),
        _row("TTFT p50 ms, 16 streams", t16, "<= direct + 2 ms", t16[ROUTER] - t16[DIRECT] <= 2),
        _row(
            "TTFT p50 ms, 64 streams",
            {k: ms(v["ttft_p50_s"]) for k, v in c64.items()},
            "report",
            None,
        ),
        _row(
            "requests/s, 16 streams",
            {k: v["requests_per_s"] for k, v in c16.items()},
            "report",
            None,
        ),
        _row(
            "requests/s, 64 streams", rps64, ">= 0.9x direct", rps64[ROUTER] >= 0.9 * rps64[DIRECT]
        ),
        _row(
            f"requests/s, {LONG_ANSWER[0]} streams, {LONG_ANSWER[1]}-token answers",
            long,
            f">= {LONG_ANSWER_RATIO}x direct",
            long[ROUTER] >= LONG_ANSWER_RATIO * long[DIRECT],
        ),
        _row(
            "ms per streamed token", chunk, "<= 1.3x direct", chunk[ROUTER] <= 1.3 * chunk[DIRECT]
        ),
        _row("server CPU ms per request, 64 streams", cpu_ms(c64), "report", None),
        _row(
            f"server CPU ms per request, {LONG_ANSWER[0]} streams, {LONG_ANSWER[1]}-token answers",
            cpu_ms(m["long_answers"]),
            "report",
            None,
        ),
    ]


def _row(metric: str, values: dict, target: str, met) -> dict:
    """bench.common's row; `met` is given (some goals are differences, not ratios)."""
    return {**ratio_row(metric, values[ROUTER], values[DIRECT], target), "met": met}


def deployment() -> dict:
    """The SGLang check's deployment, with room for 64 streams: the router sheds requests
    beyond twice the engine's max_running_requests (16 there), and this bench measures
    the hop, not the shedding."""
    spec = sglang_double.deployment("/models/double", "cpu")
    spec["models"][0]["engine_args"]["max_running_requests"] = max(CONCURRENCY)
    return spec


def serve_and_measure(work: Path) -> dict:
    repo = work / "repo"
    build_repository(parse_spec(deployment(), "<bench>"), repo)
    (repo / DIRECT / "1" / "sglang.py").write_text(sglang_double.zero_cost_shim(LONG_TOKENS))
    bls_floor.install(repo, DIRECT)
    server = start_on_free_ports(repo, work / "tritonserver.log", timeout_s=120)
    try:
        pids = server_processes(server)  # tritonserver and each model's stubs
        return asyncio.run(measure(server.grpc_url, lambda: cpu_seconds(pids)))
    finally:
        server.stop()


def run(out_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="trident-bench-zero-cost-") as tmp:
        measured = serve_and_measure(Path(tmp))
    return bench_result(
        "zero_cost",
        rows_from(measured),
        {
            "engine": "SGLang test double (zero cost)",
            "sequential": SEQUENTIAL,
            "short_tokens": SHORT_TOKENS,
            "per_worker": PER_WORKER,
            "long_answer": {"streams": LONG_ANSWER[0], "tokens": LONG_ANSWER[1]},
            "rounds": ROUNDS,
            "long_tokens": LONG_TOKENS,
        },
        measured,
    )


if __name__ == "__main__":
    import json

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_results")
    out.mkdir(parents=True, exist_ok=True)
    result = run(out)
    (out / "zero_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))
