"""Our Triton vLLM model vs vLLM's AsyncLLM in one process: same model, same engine
arguments, same prompts, same machine, one run. Target: >= 0.97x direct tokens/s at 8
concurrent streams."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import PROMPTS, ratio_row, stream_round, summarize
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
STREAMS, MAX_TOKENS, ROUNDS = 8, 64, 3


def triton_side(repo: Path, log: Path) -> dict:
    server = start_on_free_ports(repo, log, load_models=("smollm2",))
    try:
        stream_round(server.grpc_url, "smollm2", 1, 8)                  # warm-up
        return summarize([stream_round(server.grpc_url, "smollm2", STREAMS, MAX_TOKENS)
                          for _ in range(ROUNDS)])
    finally:
        server.stop()


def direct_side(repo: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.direct_vllm", "--config",
         str(repo / "smollm2" / "1" / "model.json"), "--prompts",
         json.dumps(PROMPTS[:STREAMS]), "--max-tokens", str(MAX_TOKENS),
         "--rounds", str(ROUNDS)], capture_output=True, text=True, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"direct vLLM run failed:\n{proc.stderr[-3000:]}")


def run(out_dir: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-", dir=out_dir))
    repo = work / "repo"
    build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
    ours = triton_side(repo, work / "tritonserver.log")
    direct = direct_side(repo)
    return {
        "name": "vllm_backend",
        "setup": {"model": "SmolLM2-135M-Instruct (deploy/default.yaml)", "streams": STREAMS,
                  "max_tokens": MAX_TOKENS, "rounds": ROUNDS, "sampling": "greedy, ignore_eos"},
        "triton": ours, "direct": direct,
        "rows": [
            ratio_row(f"tokens/s, {STREAMS} streams", ours["tokens_per_s"],
                      direct["tokens_per_s"], ">= 0.97x direct", threshold=0.97),
            ratio_row("TTFT median (s)", ours["ttft_median_s"], direct["ttft_median_s"],
                      "report", higher_better=False),
        ],
    }
