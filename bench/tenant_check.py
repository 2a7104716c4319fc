"""What the router's tenant check costs on time to first token, on the CPU.

Three tritonservers from one rendered repository (the SGLang model with its zero-cost
engine double, behind the router): the router without a `tenants:` section, with the
counters in the router process, and with the counters in a real redis-server on
loopback. Requests alternate between them (one at a time, so the three see the same
machine load) and the median TTFT of each is compared with the router without tenants.
Usage: .venv/bin/python -m bench.tenant_check [--requests N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import bench_result, ratio_row
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support import sglang_double
from support.grpc_stream import generate
from support.redis_server import RedisServer

REQUESTS = 200
TENANTS = {
    "default": {
        "requests_per_minute": 1_000_000,
        "tokens_per_minute": 1_000_000_000,
        "max_concurrent": 64,
    },
    "limits": {"bench": {"tier": "premium"}},
}


def _variant(repo: Path, work: Path, name: str, tenants) -> Path:
    copy = work / f"repo-{name}"
    shutil.copytree(repo, copy)
    config_path = copy / "router" / "1" / "router.json"
    config = json.loads(config_path.read_text())
    config["tenants"] = tenants
    config_path.write_text(json.dumps(config))
    return copy


def measure(urls: dict, requests: int) -> dict:
    ttfts = {name: [] for name in urls}
    for i in range(requests + 10):
        for name, url in urls.items():
            result = generate(url, "router", prompt="go", max_tokens=2, hints={"tenant": "bench"})
            if result.errors:
                raise RuntimeError(f"{name}: {result.errors}")
            if i >= 10:  # warm-up: connections, the Lua script's first load
                ttfts[name].append(result.ttft_s)
    return {name: statistics.median(values) for name, values in ttfts.items()}


def run(out_dir: Path, requests: int = REQUESTS) -> dict:
    redis = RedisServer().start()
    servers = []
    try:
        with tempfile.TemporaryDirectory(prefix="trident-bench-tenants-") as tmp:
            work = Path(tmp)
            spec = sglang_double.deployment("/models/double", "cpu")
            spec["tenants"] = {**TENANTS, "redis": redis.url}
            repo = work / "repo"
            build_repository(parse_spec(spec, "<bench>"), repo)
            (repo / sglang_double.MODEL / "1" / "sglang.py").write_text(sglang_double.SHIM)
            rendered = json.loads((repo / "router" / "1" / "router.json").read_text())
            repos = {
                "none": _variant(repo, work, "none", None),
                "local": _variant(repo, work, "local", {**rendered["tenants"], "redis": None}),
                "redis": repo,
            }
            urls = {}
            for name, path in repos.items():
                servers.append(
                    start_on_free_ports(
                        path, Path(out_dir) / f"tenant_check.{name}.tritonserver.log"
                    )
                )
                urls[name] = servers[-1].grpc_url
            ttft = measure(urls, requests)
    finally:
        for server in servers:
            server.stop()
        redis.stop()
    rows = [
        ratio_row(
            f"TTFT p50 ms, tenant check {name} vs none",
            ttft[name] * 1000,
            ttft["none"] * 1000,
            "cost of the check",
            higher_better=False,
        )
        for name in ("local", "redis")
    ]
    return bench_result(
        "tenant_check",
        rows,
        {"requests": requests},
        {name: value * 1000 for name, value in ttft.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, args.requests)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
