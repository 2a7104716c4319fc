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
After the grid, each path bisects its ceiling between its grid points at 64 streams
(bench/rate_refine.py: 3 probes per path) and reports "ceiling (refined)" rows.
Usage: .venv/bin/python -m bench.gpu_rate [--quick] [--out DIR] [--paths direct,router]
       [--points 64x50,...] (chosen points alone, no refine) [--no-refine]
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

from bench import anchor, common
from bench.common import bench_result, ratio_row, server_processes
from bench.openai_frontend import start_frontend, stop_frontend
from bench.rate_clients import AnchorPath, GrpcPath, HttpPath, load_point
from bench.rate_refine import REFINE_STREAMS, Bisection, bracket, refined_ceiling
from bench.rate_stats import ceiling, cpu_ms_per_1000_tokens, meets, summarize
from builder.pipeline import build_repository
from builder.serve import admin
from builder.serve.server import start_on_free_ports
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


def deployment(
    streams: int, router_instances: int | None = None, stream_interval: int | None = None
) -> dict:
    """deploy/default.yaml with room for every stream in the engine's batch (the router
    sheds what is beyond twice max_num_seqs, and this measures the relay, not shedding);
    `router_instances`: router.instances as the spec says it (None: the plan's own);
    `stream_interval`: the engine's (engine_args.stream_interval; None: vLLM's 1)."""
    spec = yaml.safe_load((ROOT / "deploy" / "default.yaml").read_text())
    spec["models"][0]["engine_args"]["max_num_seqs"] = streams
    if stream_interval is not None:
        spec["models"][0]["engine_args"]["stream_interval"] = stream_interval
    if router_instances is not None:
        spec["router"]["instances"] = router_instances
    return spec


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """The processes' CPU seconds so far (common.cpu_seconds) and this client's."""
    return {**common.cpu_seconds(pids), "client": time.process_time()}


def processes(server, frontend) -> dict[str, list[int]]:
    return {**server_processes(server), "frontend": [frontend.pid]}


def plan(sizes: dict) -> list[tuple[int, float]]:
    if sizes.get("points"):
        return list(sizes["points"])
    return [(streams, rate) for streams in sizes["streams"] for rate in sizes["tokens_per_s"]]


def most_streams(sizes: dict) -> int:
    """The engine's batch and the frontend's connections fit every point and probe."""
    return max(max(streams for streams, _ in plan(sizes)), REFINE_STREAMS)


async def sweep(paths: dict, pids: dict, control: Path, sizes: dict) -> list[dict]:
    tokens, points = sizes["tokens"], []
    for path in paths.values():  # warm-up: connections, every code path
        write_rate(control, Rate(TTFT_S, 1000, BATCH_TOKENS_PER_S))
        await load_point(path, 4, 8, 60)
    for i, (streams, rate) in enumerate(plan(sizes)):
        names = list(paths)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            points.append(await one_point(paths[name], name, pids, control, streams, rate, tokens))
    return points


async def one_point(
    path, name: str, pids: dict, control: Path, streams: int, rate: float, tokens: int
) -> dict:
    """Every stream one request of `tokens` at `rate` tokens/s per stream, on one path."""
    write_rate(control, Rate(TTFT_S, rate, BATCH_TOKENS_PER_S))
    timeout = 10 * (TTFT_S + tokens / rate) + 60
    before = cpu_seconds(pids)
    requests, failed = await load_point(path, streams, tokens, timeout)
    point = summarize(requests, streams * rate, failed)
    point.update(
        path=name,
        streams=streams,
        tokens_per_stream_s=rate,
        cpu_ms_per_1000_tokens=cpu_ms_per_1000_tokens(before, cpu_seconds(pids), point["tokens"]),
    )
    print(_line(point), flush=True)
    return point


async def refine(paths: dict, pids: dict, control: Path, sizes: dict, grid: list) -> list[dict]:
    """Each path bisects its ceiling between its grid points (bench/rate_refine.py);
    the probes, marked `refine`."""
    probes = []
    for name, path in paths.items():
        search = searches({name: [p for p in grid if p["path"] == name]}).get(name)
        while search is not None and (rate := search.next_rate()) is not None:
            point = await one_point(
                path, name, pids, control, search.streams, rate, sizes["tokens"]
            )
            point["refine"] = True
            search.record(rate, _met(point))
            probes.append(point)
    return probes


def searches(by_path: dict, probes: list | None = None) -> dict:
    """A Bisection per path with something to refine, replaying `probes` (the points a
    refine step measured) when given, so the rows read the same search the run made."""
    out = {}
    for name, points in by_path.items():
        bounds = bracket(points, _met)
        if bounds is None:
            continue
        search = Bisection(*bounds)
        for probe in probes or ():
            if probe["path"] == name:
                search.record(probe["tokens_per_stream_s"], _met(probe))
        out[name] = search
    return out


def _met(point: dict) -> bool:
    return meets(point, 1.0 / point["tokens_per_stream_s"])


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
    grpc_url: str,
    http_url: str,
    pids: dict,
    control: Path,
    sizes: dict,
    with_anchor: bool,
    chosen: tuple[str, ...] = PATHS,
    refining: bool = True,
) -> list[dict]:
    paths = {
        "direct": GrpcPath(grpc_url, MODEL),
        "router": GrpcPath(grpc_url, ROUTER),
        "openai": HttpPath(http_url, ROUTER, most_streams(sizes)),
    }
    if with_anchor:
        paths["anchor"] = AnchorPath(grpc_url, anchor.ANCHOR)
    paths = {name: path for name, path in paths.items() if name in chosen}
    try:
        points = await sweep(paths, pids, control, sizes)
        if refining:
            points += await refine(paths, pids, control, sizes, points)
        return points
    finally:
        for path in paths.values():
            await path.close()


# (ours, base, threshold): the ceilings the issue compares, ours >= threshold x base
CEILING_PAIRS = ((ROUTER, "direct", 0.9), ("openai", ROUTER, 0.9), ("direct", "anchor", 1.0))
PAIR_NAMES = {"anchor": "vllm_backend", "direct": "direct"}


def rows(points: list[dict]) -> list[dict]:
    """The ceiling rows (grid, refined when the run refined, literal 30 ms) of each pair
    whose paths ran, then delivered tokens/s point by point."""
    grid = [p for p in points if not p.get("refine")]
    by_path = {name: [p for p in grid if p["path"] == name] for name in PATHS}
    by_path = {name: ps for name, ps in by_path.items() if ps}
    top = {name: ceiling(ps) for name, ps in by_path.items()}
    literal = {name: ceiling(ps, literal=True) for name, ps in by_path.items()}
    probes = [p for p in points if p.get("refine")]
    search = searches(by_path, probes) if probes else {}
    refined = {name: refined_ceiling(top[name], search.get(name)) for name in by_path}
    out = []
    for ours, base, threshold in CEILING_PAIRS:
        if ours not in top or base not in top:
            continue  # a run of chosen paths (--paths), or no anchor here
        label = f"{_pair_name(ours)} vs {PAIR_NAMES.get(base, base)}"
        out.append(_ceiling_row(f"ceiling tokens/s, {label}", top, ours, base, threshold=threshold))
        if probes:
            out.append(
                _ceiling_row(
                    f"ceiling (refined: {REFINE_STREAMS} streams between grid points) "
                    f"tokens/s, {label}",
                    refined,
                    ours,
                    base,
                    threshold=threshold,
                )
            )
        if base != "anchor":
            out.append(
                _ceiling_row(
                    f"ceiling (gap p99 <= 30 ms literally), {label}",
                    literal,
                    ours,
                    base,
                    target="report",
                )
            )
    for point in by_path.get(ROUTER, ()):
        label = f"{point['streams']} x {point['tokens_per_stream_s']:g}/s"
        for ours, base, _ in CEILING_PAIRS:
            mine = point if ours == ROUTER else _at(by_path, ours, point)
            other = point if base == ROUTER else _at(by_path, base, point)
            if mine is None or other is None:
                continue
            out.append(
                ratio_row(
                    f"delivered tokens/s {label}, {ours} vs {PAIR_NAMES.get(base, base)}",
                    mine["delivered_tokens_per_s"],
                    other["delivered_tokens_per_s"],
                    "report",
                )
            )
    return out


def _pair_name(path: str) -> str:
    return "direct (trident's vLLM model)" if path == "direct" else path


def _at(by_path: dict, name: str, point: dict) -> dict | None:
    return next((p for p in by_path.get(name, ()) if _same(p, point)), None)


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


def run(
    out_dir: Path,
    quick: bool | None = None,
    points: list[tuple[int, float]] | None = None,
    chosen: tuple[str, ...] = PATHS,
    refining: bool = True,
    router_instances: int | None = None,
    stream_interval: int | None = None,
) -> dict:
    """The sweep (the full grid, --quick's, or the chosen `points` alone, unrefined)
    on the `chosen` paths, then each path's refine step."""
    quick = os.environ.get("TRIDENT_GPU_RATE_QUICK") == "1" if quick is None else quick
    sizes = dict(QUICK if quick else FULL)
    if points:
        sizes["points"], refining = points, False
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="trident-bench-gpu-rate-") as tmp:
        work = Path(tmp)
        repo, control = work / "repo", work / "rate.json"
        build_repository(
            parse_spec(
                deployment(most_streams(sizes), router_instances, stream_interval), "<bench>"
            ),
            repo,
        )
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
            measured = asyncio.run(
                measure(
                    server.grpc_url,
                    http_url,
                    pids,
                    control,
                    sizes,
                    with_anchor and "anchor" in chosen,
                    chosen,
                    refining,
                )
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
        "paths": list(chosen),
        "router_instances": router_instances or "the plan's default",
        "stream_interval": stream_interval or "vLLM's default (1)",
        "refine": (
            f"{REFINE_STREAMS} streams, bisecting offered tokens/s between grid points"
            if refining
            else "off"
        ),
    }
    return bench_result("gpu_rate", rows(measured), config, measured)


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


def parse_points(text: str) -> list[tuple[int, float]]:
    """ "64x50,16x100" -> [(64, 50.0), (16, 100.0)]; ValueError naming the bad one."""
    points = []
    for item in text.split(","):
        streams, sep, rate = item.strip().partition("x")
        try:
            point = (int(streams), float(rate))
        except ValueError:
            point = None
        if not sep or point is None or point[0] < 1 or point[1] <= 0:
            raise ValueError(f"--points: {item.strip()!r} is not STREAMSxTOKENS_PER_S (64x50)")
        points.append(point)
    return points


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter points")
    parser.add_argument("--out", default="bench_results")
    parser.add_argument(
        "--points",
        help="only these points, STREAMSxTOKENS_PER_S comma-separated (64x50,16x100); "
        "256-token answers unless --quick; no refine step",
    )
    parser.add_argument(
        "--paths", help=f"only these paths, comma-separated (of {', '.join(PATHS)})"
    )
    parser.add_argument(
        "--router-instances",
        type=int,
        help="router.instances for this run (a configuration to report; default: the plan's)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        help="the engine's engine_args.stream_interval (tokens per response after the first)",
    )
    parser.add_argument(
        "--no-refine", action="store_true", help="the grid only: no bisection between its points"
    )
    args = parser.parse_args(argv)
    try:
        points = parse_points(args.points) if args.points else None
        chosen = tuple(args.paths.split(",")) if args.paths else PATHS
        unknown = [name for name in chosen if name not in PATHS]
        if unknown:
            raise ValueError(f"--paths: {unknown[0]!r} is not one of {', '.join(PATHS)}")
    except ValueError as e:
        print(f"gpu_rate: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for flag, value in (
        ("--router-instances", args.router_instances),
        ("--stream-interval", args.stream_interval),
    ):
        if value is not None and value < 1:
            print(f"gpu_rate: {flag}: must be 1 or more", file=sys.stderr)
            return 2
    result = run(
        out,
        args.quick or None,
        points,
        chosen,
        not args.no_refine,
        args.router_instances,
        args.stream_interval,
    )
    (out / "gpu_rate.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
