"""vLLM's AsyncLLM called directly in one process: the baseline of bench/vllm_backend.py.

Run as a script (vLLM needs a __main__ guard); prints one JSON line of results.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time


async def one_round(engine, sampling_cls, delta, prompts, max_tokens, round_id):
    async def one(i, prompt):
        params = sampling_cls(temperature=0, ignore_eos=True, max_tokens=max_tokens,
                              output_kind=delta)
        start = time.perf_counter()
        ttft, tokens = None, 0
        async for out in engine.generate(prompt, params, f"r{round_id}-{i}"):
            got = len(out.outputs[0].token_ids)
            if got and ttft is None:
                ttft = time.perf_counter() - start
            tokens += got
        return ttft, tokens

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - start
    tokens = sum(t for _, t in results)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_s": [t for t, _ in results]}


async def main_async(args):
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    with open(args.config) as f:
        config = json.load(f)
    config.setdefault("enforce_eager", True)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**config))
    prompts = json.loads(args.prompts)
    await one_round(engine, SamplingParams, RequestOutputKind.DELTA, prompts[:1],
                    args.max_tokens, "warmup")
    rounds = []
    for r in range(args.rounds):
        rounds.append(await one_round(engine, SamplingParams, RequestOutputKind.DELTA,
                                      prompts, args.max_tokens, r))
    engine.shutdown()
    ttfts = [t for r in rounds for t in r["ttft_s"]]
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
            "ttft_median_s": statistics.median(ttfts),
            "rounds": [{k: v for k, v in r.items() if k != "ttft_s"} for r in rounds]}


if __name__ == "__main__":
    import locale
    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The same settings the Triton model applies on a CPU instance.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="trident-vllm-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print("RESULT " + json.dumps(asyncio.run(main_async(args))), flush=True)
