"""vLLM's AsyncLLM called directly in one process: the baseline of bench/vllm_backend.py.

Run as a script (vLLM needs a __main__ guard). It starts the engine, prints `READY`, then
answers each JSON line on stdin ({"prompts": [...], "max_tokens": n, "rounds": k}) with one
`RESULT <json>` line, until stdin closes: the engine stays up between measurements, so
the benchmark can alternate it with the Triton side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from itertools import count


async def one_round(engine, sampling_cls, delta, prompts, max_tokens, round_id):
    async def one(i, prompt):
        params = sampling_cls(
            temperature=0, ignore_eos=True, max_tokens=max_tokens, output_kind=delta
        )
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
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_s": [t for t, _ in results],
    }


async def serve(config_path: str) -> None:
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    with open(config_path) as f:
        config = json.load(f)
    config.setdefault("enforce_eager", True)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**config))
    delta, ids = RequestOutputKind.DELTA, count()
    await one_round(engine, SamplingParams, delta, ["Hello"], 8, "warmup")
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            ask = json.loads(line)
            rounds = [
                await one_round(
                    engine, SamplingParams, delta, ask["prompts"], ask["max_tokens"], next(ids)
                )
                for _ in range(ask["rounds"])
            ]
            print("RESULT " + json.dumps(rounds), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    import locale

    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, help="the model's model.json")
    args = parser.parse_args()
    # The same settings the Triton model applies on a CPU instance.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="trident-vllm-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(serve(args.config))
