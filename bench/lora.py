"""The cost of a LoRA adapter: tokens/s of adapter requests vs base requests on one model.

One tritonserver, SmolLM2 in vLLM with one random rank-8 adapter on q_proj/v_proj (as
tests/server/test_lora.py renders it). Rounds of 8 concurrent greedy streams of a fixed
length (ignore_eos) take turns: all adapter requests, then all base requests, the order
flipping every pair so a slow spell of the machine hits both sides. Every round holds one
kind only: vLLM's CPU path computes base requests wrongly when a batch mixes them with
adapter requests (docs/lora.md), and the base side here is "a LoRA-enabled model serving
a base request", which is what the router sends to it.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench.common import GREEDY_LONG, PROMPTS, bench_result, concurrently, ratio_row
from builder.pipeline import build_repository
from builder.serve import client as infer
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support.lora import write_adapter

STREAMS, MAX_TOKENS, PAIRS = 8, 64, 3
ADAPTER = "bench"


def spec(adapter: Path) -> dict:
    return {
        "name": "bench-lora",
        "models": [
            {
                "name": "smollm2",
                "engine": "vllm",
                "model": "builtin:smollm2-135m-instruct",
                "family": "llama",
                "engine_args": {"max_model_len": 1024},
                "adapters": {ADAPTER: str(adapter)},
                "lora": {"max_loras": 1, "max_lora_rank": 8},
            }
        ],
        "router": {"default": ["smollm2"]},
    }


def one_round(url: str, adapter: str | None) -> dict:
    sampling = dict(GREEDY_LONG, **({"lora_name": adapter} if adapter else {}))
    results, wall = concurrently(
        STREAMS,
        lambda i: infer.stream_generate(
            url, "smollm2", PROMPTS[i % len(PROMPTS)], MAX_TOKENS, chat=False, sampling=sampling
        ),
        adapter or "base",
    )
    tokens = sum(r.output_tokens for r in results)
    served = sorted({r.served_by for r in results})
    return {
        "side": "adapter" if adapter else "base",
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "served_by": served,
    }


def measure(url: str) -> list[dict]:
    rounds = []
    for pair in range(PAIRS):
        order = (ADAPTER, None) if pair % 2 == 0 else (None, ADAPTER)
        rounds += [one_round(url, adapter) for adapter in order]
    return rounds


def run(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    # Absolute: the spec's adapter path is read relative to the spec file's folder.
    work = Path(tempfile.mkdtemp(prefix="bench-lora-", dir=out_dir)).resolve()
    adapter = write_adapter(work / "adapters" / ADAPTER, seed=1, rank=8)
    repo = work / "repo"
    build_repository(parse_spec(spec(adapter), str(work / "spec.yaml")), repo)
    server = start_on_free_ports(repo, work / "tritonserver.log", load_models=("smollm2",))
    try:
        one_round(server.grpc_url, ADAPTER)  # warm-up, both paths
        one_round(server.grpc_url, None)
        rounds = measure(server.grpc_url)
    finally:
        server.stop()
    for r in rounds:  # a benchmark never hides a request that went to the wrong place
        expected = "smollm2:" + ADAPTER if r["side"] == "adapter" else "smollm2"
        if r["served_by"] != [expected]:
            raise RuntimeError(f"{r['side']} round served by {r['served_by']}")
    speed = {
        side: statistics.median(r["tokens_per_s"] for r in rounds if r["side"] == side)
        for side in ("adapter", "base")
    }
    row = ratio_row(
        f"adapter vs base tokens/s, {STREAMS} streams", speed["adapter"], speed["base"], "report"
    )
    config = {
        "model": "SmolLM2-135M-Instruct, vLLM (CPU), one random rank-8 adapter on q_proj/v_proj",
        "streams": STREAMS,
        "max_tokens": MAX_TOKENS,
        "rounds_per_side": PAIRS,
        "sampling": "greedy, ignore_eos",
        "order": "adapter/base alternating, one kind per round",
    }
    return bench_result("lora", [row], config, rounds)
