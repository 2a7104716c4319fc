"""Serving at GPU token rates: the ceiling of each serving path with a paced engine.

trident's real vLLM model (python_backends/vllm) serves the paced AsyncLLM double
(support/engine_doubles/vllm, support/pacing.py) inside a real tritonserver: each request
gets its first token TTFT_S after it arrives, then TOKENS_PER_S per stream, under an
engine-wide BATCH_TOKENS_PER_S (above every offered load here, so what falls short is
the serving path's, not the engine's). Three paths, side by side in one server:
  direct   the engine model over gRPC
  router   `router` over gRPC (the BLS hop)
  openai   `trident openai` over HTTP SSE (/v1/completions), which calls `router`
  anchor   Triton's vllm_backend `src/model.py` direct over gRPC, on the same double
           (read at run time and patched as bench/anchor.py does; left out, with a
           line saying why, when its source is not here)
For each offered load, streams (16, 64, 256) x tokens/s per stream (20, 50, 100), each
stream one request of 256 tokens, the paths taking turns (the order rotates point by
point, so a slow spell of the machine hits each). Figures: bench/rate_stats.py (delivered
tokens/s, TTFT and chunk gap p50/p99, genai-perf's inter-token latency, the ceiling) and
CPU ms per 1,000 tokens per process (tritonserver, each stub, the frontend, this client;
/proc/PID/stat utime + stime).

`--quick` (or TRIDENT_GPU_RATE_QUICK=1): 16 and 64 streams x 50 and 100 tokens/s, 64-token
answers: a smoke run of about a minute. A 2-core machine saturates well before the full
sweep's top: that is what the ceiling shows.
Usage: .venv/bin/python -m bench.gpu_rate [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
import yaml

from bench import anchor
from bench.common import bench_result, ratio_row
from bench.openai_frontend import process_cpu_s, start_frontend, stop_frontend
from bench.rate_clients import AnchorPath, GrpcPath, HttpPath, load_point
from bench.rate_stats import ceiling, cpu_ms_per_1000_tokens, summarize
from builder.pipeline import build_repository
from builder.serve import admin
from builder.serve.server import start_on_free_ports
from builder.serve.watch import stub_processes
from builder.spec import parse_spec
from support.pacing import Rate
from support.vllm_double import make_environment, use_double, write_rate

ROOT = Path(__file__).resolve().parent.parent
MODEL, ROUTER = "smollm2", "router"
PATHS = ("direct", "router", "openai", "anchor")
FULL = {"streams": (16, 64, 256), "tokens_per_s": (20, 50, 100), "tokens": 256}
QUICK = {"streams": (16, 64), "tokens_per_s": (50, 100), "tokens": 64}
TTFT_S = 0.05
BATCH_TOKENS_PER_S = 32_000  # above the sweep's top (256 x 100): the engine never limits
ANCHOR_LOAD_TIMEOUT_S = 60  # the double loads in about a second


def deployment(streams: int) -> dict:
    """deploy/default.yaml with room for every stream in the engine's batch (the router
    sheds what is beyond twice max_num_seqs, and this measures the relay, not shedding)."""
    spec = yaml.safe_load((ROOT / "deploy" / "default.yaml").read_text())
    spec["models"][0]["engine_args"]["max_num_seqs"] = streams
    return spec


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    seconds = {name: process_cpu_s(pid) for name, pid in pids.items()}
    seconds["client"] = time.process_time()
    return seconds


def processes(server, frontend) -> dict[str, int]:
    pids = {"tritonserver": server.process.pid, "frontend": frontend.pid}
    for stub in stub_processes(server.process.pid).values():  # its own process group
        pids[f"stub:{stub.model}"] = stub.pid
    return pids


def plan(sizes: dict) -> list[tuple[int, float]]:
    return [(streams, rate) for streams in sizes["streams"] for rate in sizes["tokens_per_s"]]


async def sweep(paths: dict, pids: dict, control: Path, sizes: dict) -> list[dict]:
    tokens, points = sizes["tokens"], []
    for path in paths.values():  # warm-up: connections, every code path
        write_rate(control, Rate(TTFT_S, 1000, BATCH_TOKENS_PER_S))
        await load_point(path, 4, 8, 60)
    for i, (streams, rate) in enumerate(plan(sizes)):
        write_rate(control, Rate(TTFT_S, rate, BATCH_TOKENS_PER_S))
        timeout = 10 * (TTFT_S + tokens / rate) + 60
        names = list(paths)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            before = cpu_seconds(pids)
            requests, failed = await load_point(paths[name], streams, tokens, timeout)
            point = summarize(requests, streams * rate, failed)
            point.update(
                path=name,
                streams=streams,
                tokens_per_stream_s=rate,
                cpu_ms_per_1000_tokens=cpu_ms_per_1000_tokens(
                    before, cpu_seconds(pids), point["tokens"]
                ),
            )
            points.append(point)
            print(_line(point), flush=True)
    return points


def _line(p: dict) -> str:
    def ms(value):
        return "-" if value is None else f"{value * 1000:.1f}"

    return (
        f"gpu_rate {p['path']:6} {p['streams']:3} x {p['tokens_per_stream_s']:g}/s: "
        f"offered {p['offered_tokens_per_s']:.0f} delivered "
        f"{p['delivered_tokens_per_s']:.0f} tok/s, TTFT p50/p99 {ms(p['ttft_p50_s'])}/"
        f"{ms(p['ttft_p99_s'])} ms, gap p50/p99 {ms(p['gap_p50_s'])}/"
        f"{ms(p['gap_p99_s'])} ms, ITL p99 {ms(p['itl_p99_s'])} ms, "
        f"{p['tokens_per_chunk']:.2f} tokens/chunk"
        + (f", {p['errors']} failed" if p["errors"] else "")
    )


async def measure(
    grpc_url: str, http_url: str, pids: dict, control: Path, sizes: dict, with_anchor: bool
) -> list[dict]:
    paths = {
        "direct": GrpcPath(grpc_url, MODEL),
        "router": GrpcPath(grpc_url, ROUTER),
        "openai": HttpPath(http_url, ROUTER, max(sizes["streams"])),
    }
    if with_anchor:
        paths["anchor"] = AnchorPath(grpc_url, anchor.ANCHOR)
    try:
        return await sweep(paths, pids, control, sizes)
    finally:
        for path in paths.values():
            await path.close()


def rows(points: list[dict]) -> list[dict]:
    by_path = {name: [p for p in points if p["path"] == name] for name in PATHS}
    if not by_path["anchor"]:
        del by_path["anchor"]
    top = {name: ceiling(ps) for name, ps in by_path.items()}
    literal = {name: ceiling(ps, literal=True) for name, ps in by_path.items()}
    out = [
        _ceiling_row("ceiling tokens/s, router vs direct", top, ROUTER, "direct"),
        _ceiling_row("ceiling tokens/s, openai vs router", top, "openai", ROUTER),
        _ceiling_row(
            "ceiling (gap p99 <= 30 ms literally), router vs direct",
            literal,
            ROUTER,
            "direct",
            target="report",
        ),
        _ceiling_row(
            "ceiling (gap p99 <= 30 ms literally), openai vs router",
            literal,
            "openai",
            ROUTER,
            target="report",
        ),
    ]
    if "anchor" in top:
        out.insert(
            2,
            _ceiling_row(
                "ceiling tokens/s, direct (trident's vLLM model) vs vllm_backend",
                top,
                "direct",
                "anchor",
                threshold=1.0,
            ),
        )
    for point in by_path[ROUTER]:
        direct = next(p for p in by_path["direct"] if _same(p, point))
        frontend = next(p for p in by_path["openai"] if _same(p, point))
        label = f"{point['streams']} x {point['tokens_per_stream_s']:g}/s"
        out.append(
            ratio_row(
                f"delivered tokens/s {label}, router vs direct",
                point["delivered_tokens_per_s"],
                direct["delivered_tokens_per_s"],
                "report",
            )
        )
        out.append(
            ratio_row(
                f"delivered tokens/s {label}, openai vs router",
                frontend["delivered_tokens_per_s"],
                point["delivered_tokens_per_s"],
                "report",
            )
        )
        if "anchor" in by_path:
            base = next(p for p in by_path["anchor"] if _same(p, point))
            out.append(
                ratio_row(
                    f"delivered tokens/s {label}, direct vs vllm_backend",
                    direct["delivered_tokens_per_s"],
                    base["delivered_tokens_per_s"],
                    "report",
                )
            )
    return out


def _same(a: dict, b: dict) -> bool:
    return a["streams"] == b["streams"] and a["tokens_per_stream_s"] == b["tokens_per_stream_s"]


def _ceiling_row(
    metric: str, top: dict, ours: str, base: str, target: str = "", threshold: float = 0.9
) -> dict:
    """A ceiling ratio row; None (no point met the limits) reads as 0 tokens/s."""
    threshold = threshold if not target else None
    row = ratio_row(
        metric,
        top[ours] or 0.0,
        top[base] or 0.0,
        target or f">= {threshold}x {base}",
        threshold=threshold,
    )
    if top[base] is None and threshold is not None:
        row["met"] = None  # nothing to compare with: the base met no point
    return row


def run(out_dir: Path, quick: bool | None = None) -> dict:
    quick = os.environ.get("TRIDENT_GPU_RATE_QUICK") == "1" if quick is None else quick
    sizes = QUICK if quick else FULL
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="trident-bench-gpu-rate-") as tmp:
        work = Path(tmp)
        repo, control = work / "repo", work / "rate.json"
        build_repository(parse_spec(deployment(max(sizes["streams"])), "<bench>"), repo)
        environment = make_environment(work / "env")
        use_double(repo, MODEL, environment, control, Rate(TTFT_S, 50, BATCH_TOKENS_PER_S))
        with_anchor = add_anchor(repo, environment, control)
        server = start_on_free_ports(
            repo, out_dir / "gpu_rate.tritonserver.log", load_models=(MODEL, ROUTER), timeout_s=120
        )
        frontend = None
        try:
            with_anchor = with_anchor and load_anchor(
                server.grpc_url, admin.grpc_headers(server.admin_key)
            )
            frontend, http_url = start_frontend(
                server.grpc_url, out_dir / "gpu_rate.frontend.log", server.admin_key
            )
            pids = processes(server, frontend)
            points = asyncio.run(
                measure(server.grpc_url, http_url, pids, control, sizes, with_anchor)
            )
        finally:
            stop_frontend(frontend)
            server.stop()
    config = {
        "engine": "paced AsyncLLM double (support/engine_doubles/vllm) behind trident's vLLM model",
        "quick": quick,
        "ttft_s": TTFT_S,
        "batch_tokens_per_s": BATCH_TOKENS_PER_S,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in sizes.items()},
        "cpu_processes": sorted(pids) + ["client"],
        "anchor": with_anchor or "left out (see the run's output)",
    }
    return bench_result("gpu_rate", rows(points), config, points)


def add_anchor(repo: Path, environment: Path, control: Path) -> bool:
    """vllm_backend's model beside trident's, on the same double and rate; False (and
    one line saying why) when its source is not here or no longer takes the patches."""
    try:
        files = anchor.apply_patches(
            anchor.read_source(anchor.source_location(), os.environ.get(anchor.REV_ENV, "HEAD"))
        )
    except anchor.AnchorUnavailable as e:
        print(f"gpu_rate: the vllm_backend anchor is left out: {e}", file=sys.stderr)
        return False
    anchor.add_anchor(repo, files)
    use_double(repo, anchor.ANCHOR, environment, control, Rate(TTFT_S, 50, BATCH_TOKENS_PER_S))
    return True


def load_anchor(url: str, headers: dict) -> bool:
    """Load the anchor once the server is up, so that a vllm_backend that does not run
    on the double costs its path only, with a line saying why."""
    client = grpcclient.InferenceServerClient(url)
    try:
        client.load_model(anchor.ANCHOR, headers=headers, client_timeout=ANCHOR_LOAD_TIMEOUT_S)
        return True
    except Exception as e:  # InferenceServerException or a timeout: the path is left out
        print(
            f"gpu_rate: the vllm_backend anchor did not load on the double, left out: {e}",
            file=sys.stderr,
        )
        return False
    finally:
        client.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter points")
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, quick=args.quick or None)
    (out / "gpu_rate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
