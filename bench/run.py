"""`make bench`: run the benchmarks, write JSON results, print one comparison table.

Each benchmark is a module `bench/<name>.py` with `run(out_dir: Path) -> dict` returning
{"name": ..., "rows": [{"metric", "ours", "direct", "ratio", "target", "met"}], ...}:
trident's path and the direct path measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bench.common import write_result

# Issue 16's table first (zero-cost engine, vLLM, the vllm_backend anchor), then the rest.
BENCHMARKS = [
    "zero_cost",
    "router_overhead",
    "vllm_backend",
    "anchor",
    "openai_frontend",
    "trace_cost",
    "lora",
    "tenant_check",
    "cache_restore",
    "gpu_rate",
    "prefix_decision",
    "prefix_routing",
    "aiperf_point",
]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def print_table(results: list[dict]) -> None:
    header = ("benchmark", "metric", "trident", "direct", "ratio", "target", "met")
    rows = [header]
    for result in results:
        for row in result.get("rows", []):
            rows.append(
                (
                    result["name"],
                    row["metric"],
                    _fmt(row.get("ours")),
                    _fmt(row.get("direct")),
                    _fmt(row.get("ratio")),
                    row.get("target", ""),
                    _fmt(row.get("met")),
                )
            )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})"
    )
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.names or BENCHMARKS:
        try:
            module = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"bench.{name}":
                raise
            print(f"{name}: not available", file=sys.stderr)
            continue
        started = time.time()
        try:
            result = module.run(out)
        except Exception as e:  # one broken benchmark must not lose the others' results
            print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            result = {
                "rows": [
                    {"metric": "failed", "target": f"{type(e).__name__}: {e}"[:80], "met": False}
                ],
                "error": f"{type(e).__name__}: {e}",
            }
        result.setdefault("name", name)
        result["wall_s"] = round(time.time() - started, 1)
        write_result(out, result)
        results.append(result)
    print_table(results)
    print(f"\nJSON results in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
