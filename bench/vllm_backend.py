"""Our Triton vLLM model vs vLLM's AsyncLLM in one process: same model, same engine
arguments, same prompts, same machine, one run. Target: >= 0.97x direct tokens/s at 8 and
16 concurrent streams in each of 3 runs.

Both engines stay up for the whole benchmark (the Triton server and bench/direct_vllm.py
as a worker) and take turns: one run measures every stream count on both sides, the order
of the sides alternating from run to run, so a slow spell of the machine hits both. Only
one side generates at a time (two engines on a small machine would fight for its cores).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import PROMPTS, bench_result, ratio_row, stream_round
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
STREAM_COUNTS, MAX_TOKENS, ROUNDS, RUNS = (8, 16), 64, 2, 3
TARGET = 0.97


class DirectEngine:
    """bench/direct_vllm.py as a worker: one AsyncLLM, measured on request."""

    def __init__(self, config: Path, log: Path):
        self._log = log
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.direct_vllm", "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(log, "ab"),
            text=True,
            cwd=ROOT,
        )
        self._expect("READY")

    def _expect(self, prefix: str) -> str:
        for line in self._proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"direct vLLM run failed:\n{self._log.read_text()[-3000:]}")

    def rounds(self, streams: int) -> list[dict]:
        ask = {
            "prompts": [PROMPTS[i % len(PROMPTS)] for i in range(streams)],
            "max_tokens": MAX_TOKENS,
            "rounds": ROUNDS,
        }
        self._proc.stdin.write(json.dumps(ask) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._expect("RESULT "))

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def one_run(url: str, direct: DirectEngine, index: int) -> dict:
    """{side: {streams: summary}} for every stream count; sides in alternating order."""
    sides = {
        "triton": lambda n: [stream_round(url, "smollm2", n, MAX_TOKENS) for _ in range(ROUNDS)],
        "direct": direct.rounds,
    }
    order = list(sides) if index % 2 == 0 else list(sides)[::-1]
    return {
        side: {streams: _summary(sides[side](streams)) for streams in STREAM_COUNTS}
        for side in order
    }


def _summary(rounds: list[dict]) -> dict:
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
        "ttft_p50_s": statistics.median(t for r in rounds for t in r["ttft_s"]),
        "rounds": [{k: v for k, v in r.items() if k != "ttft_s"} for r in rounds],
    }


def rows(runs: list[dict]) -> list[dict]:
    """Per stream count: the worst run's tokens/s ratio (met only when every run met the
    target) and the median TTFT over the runs."""
    out = []
    for streams in STREAM_COUNTS:
        pairs = [(run["triton"][streams], run["direct"][streams]) for run in runs]
        ours, direct = min(pairs, key=lambda p: p[0]["tokens_per_s"] / p[1]["tokens_per_s"])
        out.append(
            ratio_row(
                f"tokens/s, {streams} streams (worst of {len(runs)} runs)",
                ours["tokens_per_s"],
                direct["tokens_per_s"],
                f">= {TARGET}x direct in every run",
                threshold=TARGET,
            )
        )
        out.append(
            ratio_row(
                f"TTFT p50 (s), {streams} streams (median of runs)",
                statistics.median(p[0]["ttft_p50_s"] for p in pairs),
                statistics.median(p[1]["ttft_p50_s"] for p in pairs),
                "report",
                higher_better=False,
            )
        )
    return out


def run(out_dir: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-", dir=out_dir))
    repo = work / "repo"
    build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
    server = start_on_free_ports(repo, work / "tritonserver.log", load_models=("smollm2",))
    try:
        stream_round(server.grpc_url, "smollm2", 1, 8)  # warm-up
        direct = DirectEngine(repo / "smollm2" / "1" / "model.json", work / "direct.log")
        try:
            runs = [one_run(server.grpc_url, direct, i) for i in range(RUNS)]
        finally:
            direct.close()
    finally:
        server.stop()
    ratios = [
        {
            streams: run["triton"][streams]["tokens_per_s"] / run["direct"][streams]["tokens_per_s"]
            for streams in STREAM_COUNTS
        }
        for run in runs
    ]
    config = {
        "model": "SmolLM2-135M-Instruct (deploy/default.yaml)",
        "streams": list(STREAM_COUNTS),
        "max_tokens": MAX_TOKENS,
        "rounds": ROUNDS,
        "runs": RUNS,
        "sampling": "greedy, ignore_eos",
    }
    return {**bench_result("vllm_backend", rows(runs), config, runs), "ratios_per_run": ratios}
