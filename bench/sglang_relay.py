"""What trident's SGLang model costs per streamed chunk, on the CPU.

The SGLang model runs in a real tritonserver with the engine double
(tests/fakes/fake_sglang.py, written into a temporary repository as `sglang.py`), which
produces tokens at no cost. What is left is the model's relay (text deltas, metrics,
one decoupled response per chunk), Triton and gRPC, plus the router when the stream
goes through it. Usage: .venv/bin/python -m bench.sglang_relay [--tokens N] [--runs N]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from builder.pipeline import build_repository
from builder.serve.server import Ports, TritonServer, free_port
from builder.spec import parse_spec
from tests.gpu import check_sglang

ROOT = Path(__file__).resolve().parent.parent


def engine_double(tokens: int) -> str:
    return (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            "from tests.fakes import fake_sglang\n"
            f"fake_sglang.REPLY = ' '.join(f'w{{i}}' for i in range({tokens}))\n"
            "Engine = fake_sglang.Engine\n")


def chunks_per_second(server: TritonServer, target: str, tokens: int, runs: int) -> float:
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        result = check_sglang.generate(server.grpc_url, target, prompt="go", max_tokens=tokens)
        elapsed = time.perf_counter() - start
        if result.errors or result.chunks != tokens or result.finals != 1:
            raise RuntimeError(f"{target}: unexpected stream {result}")
        rates.append(result.chunks / elapsed)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trident-sglang-relay-"))
    repo = work / "repo"
    build_repository(parse_spec(check_sglang.deployment("/models/double", "cpu"), "<bench>"),
                     repo)
    (repo / check_sglang.MODEL / "1" / "sglang.py").write_text(engine_double(args.tokens))
    server = TritonServer(repo, Ports(free_port(), free_port(), free_port()),
                          log_path=work / "tritonserver.log")
    server.start()
    try:
        server.wait_ready(60)
        for target in (check_sglang.MODEL, "router"):
            rate = chunks_per_second(server, target, args.tokens, args.runs)
            print(f"{target:>6}: {rate:.0f} chunks/s = {1000 / rate:.2f} ms per chunk "
                  f"(median of {args.runs} streams of {args.tokens} one-token chunks)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
