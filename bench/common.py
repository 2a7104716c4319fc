"""Shared pieces of the serving benchmarks: prompts, concurrent gRPC streams, summaries."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

from builder.serve import client as infer
from builder.serve.watch import stub_processes
from support.bls_floor import ASYNC, BLOCKING, THREADED

PROMPTS = [
    f"Write a short story about a {thing}."
    for thing in (
        "dragon",
        "lighthouse",
        "robot",
        "garden",
        "violin",
        "glacier",
        "market",
        "comet",
        "library",
        "river",
        "clockmaker",
        "desert",
        "harbor",
        "forest",
        "train",
        "kite",
    )
]
GREEDY_LONG = {"temperature": 0, "ignore_eos": True}  # every stream makes max_tokens


def concurrently(count: int, call, label: str) -> tuple[list, float]:
    """call(i) for i in range(count), each in its own thread at once; (results, wall s).
    Any failure fails the round: a benchmark never hides one."""
    results: list = [None] * count
    errors: list = []

    def one(i: int) -> None:
        try:
            results[i] = call(i)
        except Exception as e:  # reported below, all together
            errors.append(f"{label}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError("; ".join(errors))
    return results, wall


def stream_round(url: str, model: str, streams: int, max_tokens: int) -> dict:
    """`streams` concurrent gRPC streams; tokens/s over the round, TTFT per stream."""
    results, wall = concurrently(
        streams,
        lambda i: infer.stream_generate(
            url, model, PROMPTS[i % len(PROMPTS)], max_tokens, chat=False, sampling=GREEDY_LONG
        ),
        model,
    )
    tokens = sum(r.output_tokens for r in results)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_s": [r.ttft_s for r in results],
    }


def summarize(rounds: list[dict]) -> dict:
    ttfts = [t for r in rounds for t in r["ttft_s"]]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
        "ttft_median_s": statistics.median(ttfts),
        "rounds": [{k: v for k, v in r.items() if k != "ttft_s"} for r in rounds],
    }


def ratio_row(
    metric: str,
    ours: float,
    direct: float,
    target: str,
    higher_better=True,
    threshold: float | None = None,
) -> dict:
    ratio = ours / direct if direct else None
    met = None
    if threshold is not None and ratio is not None:
        met = ratio >= threshold if higher_better else ratio <= threshold
    return {
        "metric": metric,
        "ours": ours,
        "direct": direct,
        "ratio": ratio,
        "target": target,
        "met": met,
    }


def relay_floor_rows(
    metric: str,
    ttft_ms: dict[str, float],
    direct: str,
    router: str,
    share_target_ms: float | None = None,
) -> list[dict]:
    """The bare BLS relays' TTFT (support/bls_floor.py) against the engine model called
    directly, and the router's against the blocking relay: what any BLS hop in front of
    the engine costs on this machine, and what the router adds to it, judged against
    `share_target_ms` when given; the router over the threaded relay too where it ran.
    No rows without the relays (a run measured before they existed)."""
    if BLOCKING not in ttft_ms:
        return []
    floor = ttft_ms[BLOCKING]
    share = ratio_row(f"{metric}, router over the blocking relay", ttft_ms[router], floor, "report")
    if share_target_ms is not None:
        share["target"] = f"<= blocking relay + {share_target_ms} ms"
        share["met"] = ttft_ms[router] - floor <= share_target_ms
    relays = [("blocking: the floor", floor)]
    if THREADED in ttft_ms:  # (zero_cost's runs since 2026-12-06)
        relays.append(("one thread hop: the least a concurrent relay pays", ttft_ms[THREADED]))
    relays.append(("python_backend's async idiom", ttft_ms[ASYNC]))
    rows = [
        ratio_row(f"{metric}, bare BLS relay ({what})", ms, ttft_ms[direct], "report")
        for what, ms in relays
    ]
    if THREADED in ttft_ms:
        over = f"{metric}, router over the threaded relay"
        rows.append(ratio_row(over, ttft_ms[router], ttft_ms[THREADED], "report"))
    return rows + [share]


def bench_result(name: str, rows: list[dict], config: dict, raw) -> dict:
    """One benchmark's result, as bench/run.py records it."""
    return {
        "name": name,
        "rows": rows,
        "config": config,
        # other work on the machine skews both paths; read the ratios with this
        "load_average_after": os.getloadavg(),
        "raw": raw,
    }


def write_result(out: Path, result: dict) -> None:
    """A benchmark's JSON in `out`, named after it (bench/run.py and each one run alone)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result['name']}.json").write_text(json.dumps(result, indent=2) + "\n")


def run_alone(description: str, run, argv=None, options=None) -> int:
    """`python -m bench.NAME --out DIR [options]`: one benchmark without bench/run.py's
    table. `options(parser)` adds a benchmark's own options; each reaches `run` as the
    keyword argument of its dest."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--out", default="bench_results")
    if options is not None:
        options(parser)
    chosen = vars(parser.parse_args(argv))
    out = Path(chosen.pop("out"))
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, **chosen)
    write_result(out, result)
    print(json.dumps(result["rows"], indent=2))
    return 0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_processes(server) -> dict[str, list[int]]:
    """A started server's processes by name: "tritonserver", and "stub:<model>" (one stub
    per instance). Read once: the stubs stay while the models do."""
    pids = {"tritonserver": [server.process.pid]}
    for stub in stub_processes(server.process.pid).values():  # its own process group
        pids.setdefault(f"stub:{stub.model}", []).append(stub.pid)
    return pids


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far per process name; a model's instances (one stub each) summed."""
    return {name: sum(process_cpu_s(pid) for pid in group) for name, group in pids.items()}
