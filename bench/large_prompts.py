"""Large prompts through `router`, python_backend's shared-memory region at its default
size against one sized for them: is `shm-default-byte-size` worth setting?

Each Python model's stub moves requests and responses through a shared-memory region
that starts at `shm-default-byte-size` (1 MiB in Triton 2.51) and grows when a request
does not fit. A prompt larger than the region therefore makes that stub grow it once. This
bench measures what that costs: one tritonserver per configuration (the zero-cost SGLang
double behind `router`, as bench/zero_cost.py), then SENT sequential requests per prompt
size, the time from sending to the first answer (a token, or the double's refusal of a
prompt past its context: the request crossed both stubs either way). The first request of
a size is the one that grows the regions; compare it with the rest, and both
configurations with each other.

Not in `make bench`: `.venv/bin/python -m bench.large_prompts [--out DIR]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import tritonclient.grpc.aio as aioclient

from bench.common import bench_result, write_result
from bench.zero_cost import deployment
from builder.pipeline import build_repository
from builder.serve.client import build_inputs, first_output
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support import sglang_double

SIZES = (1_000, 15_000, 1_000_000, 3_000_000)  # prompt characters (1 byte each)
SENT = 8
SIZED = 16 * 2**20  # the region sized for the largest prompt here, with room to spare
CONFIGS = {"default": (), "sized": (f"--backend-config=python,shm-default-byte-size={SIZED}",)}
MESSAGE_BYTES = 64 * 2**20  # gRPC's own 4 MiB cap would refuse the largest prompt


async def first_answer_s(outgoing: asyncio.Queue, responses, prompt: str) -> float:
    await outgoing.put(
        {
            "model_name": "router",
            "inputs": build_inputs(prompt=prompt, max_tokens=1),
            "request_id": uuid.uuid4().hex,
        }
    )
    start = time.perf_counter()
    elapsed = None
    async for result, error in responses:
        if error is not None:
            return time.perf_counter() - start
        if elapsed is None and first_output(result, "text_output"):
            elapsed = time.perf_counter() - start
        if first_output(result, "finish_reason"):  # the stream's end: the next may go
            if elapsed is None:
                raise RuntimeError("the answer ended without text")
            return elapsed
    raise RuntimeError("the stream ended without an answer")


async def measure(url: str) -> dict[str, list[float]]:
    limits = [("grpc.max_send_message_length", MESSAGE_BYTES)]
    client = aioclient.InferenceServerClient(url, channel_args=limits)
    outgoing: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (request := await outgoing.get()) is not None:
            yield request

    responses = client.stream_infer(requests())
    times: dict[str, list[float]] = {}
    try:
        for size in SIZES:
            prompt = ("lorem ipsum " * (size // 12 + 1))[:size]
            times[str(size)] = [
                1000 * await first_answer_s(outgoing, responses, prompt) for _ in range(SENT)
            ]
    finally:
        await outgoing.put(None)
        await client.close()
    return times


def serve_and_measure(work: Path, extra_args: tuple[str, ...]) -> dict[str, list[float]]:
    repo = work / "repo"
    build_repository(parse_spec(deployment(), "<bench>"), repo)
    (repo / sglang_double.MODEL / "1" / "sglang.py").write_text(sglang_double.zero_cost_shim(8))
    server = start_on_free_ports(
        repo, work / "tritonserver.log", timeout_s=120, extra_args=extra_args
    )
    try:
        return asyncio.run(measure(server.grpc_url))
    finally:
        server.stop()


def rows_from(measured: dict[str, dict[str, list[float]]]) -> list[dict]:
    rows = []
    for size in map(str, SIZES):
        for which in ("first", "rest p50"):
            ours, default = (
                times[size][0] if which == "first" else statistics.median(times[size][1:])
                for times in (measured["sized"], measured["default"])
            )
            rows.append(
                {
                    "metric": f"ms to the first answer, {size}-character prompt, {which}",
                    "ours": ours,
                    "direct": default,
                    "ratio": ours / default,
                    "target": "report (sized region against the default)",
                    "met": None,
                    "higher_better": False,
                }
            )
    return rows


def run(out_dir: Path) -> dict:
    measured = {}
    for name, extra_args in CONFIGS.items():
        with tempfile.TemporaryDirectory(prefix="trident-bench-large-prompts-") as tmp:
            measured[name] = serve_and_measure(Path(tmp), extra_args)
    result = bench_result(
        "large_prompts",
        rows_from(measured),
        {"sizes": SIZES, "sent": SENT, "sized_bytes": SIZED},
        measured,
    )
    write_result(out_dir, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    result = run(parser.parse_args().out)
    for row in result["rows"]:
        print(f"{row['metric']}: sized {row['ours']:.2f}, default {row['direct']:.2f}")
    sys.exit(0)
