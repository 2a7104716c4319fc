"""OpenAI frontend overhead: the same chat requests through /v1/chat/completions (the
frontend, `trident openai`, in its own process) and over gRPC straight to `router`, one
server, one run.

Renders deploy/default.yaml, starts one tritonserver and one frontend, warms both paths
up, then alternates (frontend, gRPC, gRPC, frontend, ...) so drift and noise hit both:
- 1 stream: single requests, TTFT p50 and tokens/s per request;
- 8 concurrent streams: TTFT p50 over every stream and tokens/s over the round.
Greedy, fixed length (ignore_eos). The HTTP client is httpx reading raw SSE (not the
openai package, whose parsing would be counted against the frontend). tokens/s counts
the engine's own completion tokens (usage; num_output_tokens on gRPC).

Wire into bench/run.py by adding "openai_frontend" to BENCHMARKS; alone:
`.venv/bin/python -m bench.openai_frontend [OUT_DIR]`.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python_backends"))

from bench.common import PROMPTS, bench_result, concurrently  # noqa: E402
from builder.pipeline import build_repository  # noqa: E402
from builder.serve.client import stream_generate  # noqa: E402
from builder.serve.server import TritonServer, free_port, start_on_free_ports  # noqa: E402
from builder.spec import load_spec  # noqa: E402

MODEL = "router"
MAX_TOKENS = 32
SINGLE_REQUESTS = 10     # per path, alternating
ROUNDS = 3               # 8-stream rounds per path, alternating
STREAMS = 8
SAMPLING = {"temperature": 0, "ignore_eos": True}
HTTP, GRPC = "openai_http", "grpc"


def http_stream(client: httpx.Client, url: str, prompt: str) -> tuple[float, int, float]:
    """(TTFT s, completion tokens, total s) of one streamed chat completion."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "stream": True, "max_tokens": MAX_TOKENS, "stream_options":
                {"include_usage": True}, **SAMPLING}
    start = time.perf_counter()
    ttft, tokens = 0.0, 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if not ttft and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft, tokens, time.perf_counter() - start


def grpc_stream(url: str, prompt: str) -> tuple[float, int, float]:
    result = stream_generate(url, MODEL, prompt, MAX_TOKENS, chat=True, sampling=SAMPLING)
    return result.ttft_s, result.output_tokens, result.total_s


def one(path: str, server: TritonServer, http_url: str, client: httpx.Client,
        prompt: str) -> tuple[float, int, float]:
    if path == HTTP:
        return http_stream(client, http_url, prompt)
    return grpc_stream(server.grpc_url, prompt)


def concurrent_round(path, server, http_url, client) -> tuple[list[float], float]:
    """STREAMS concurrent streams; (TTFT of each, tokens/s over the round)."""
    results, wall = concurrently(STREAMS, lambda i: one(
        path, server, http_url, client, PROMPTS[i % len(PROMPTS)]), path)
    return [r[0] for r in results], sum(r[1] for r in results) / wall


def measure(server: TritonServer, http_url: str) -> dict:
    limits = httpx.Limits(max_connections=STREAMS * 2, max_keepalive_connections=STREAMS)
    with httpx.Client(timeout=300, limits=limits) as client:
        for path in (HTTP, GRPC):     # warm-up
            concurrent_round(path, server, http_url, client)
        single = {HTTP: [], GRPC: []}
        for i in range(SINGLE_REQUESTS):
            for path in (HTTP, GRPC) if i % 2 == 0 else (GRPC, HTTP):
                single[path].append(one(path, server, http_url, client, PROMPTS[i]))
        ttfts, rates = {HTTP: [], GRPC: []}, {HTTP: [], GRPC: []}
        for i in range(ROUNDS):
            for path in (HTTP, GRPC) if i % 2 == 0 else (GRPC, HTTP):
                round_ttfts, rate = concurrent_round(path, server, http_url, client)
                ttfts[path] += round_ttfts
                rates[path].append(rate)
    return {"single": single, "ttft": ttfts, "rates": rates}


def rows_from(m: dict) -> list[dict]:
    def p50_ms(values):
        return statistics.median(values) * 1000

    def row(metric, ours, direct, higher_better):
        return {"metric": metric, "ours": ours, "direct": direct,
                "ratio": ours / direct if direct else None,
                "target": "measured (frontend vs gRPC to router)", "met": None,
                "higher_better": higher_better}

    single_rate = {p: statistics.median(t / total for _, t, total in m["single"][p])
                   for p in (HTTP, GRPC)}
    return [
        row("TTFT p50 ms, 1 stream", p50_ms([r[0] for r in m["single"][HTTP]]),
            p50_ms([r[0] for r in m["single"][GRPC]]), False),
        row("tokens/s, 1 stream", single_rate[HTTP], single_rate[GRPC], True),
        row(f"TTFT p50 ms, {STREAMS} streams", p50_ms(m["ttft"][HTTP]),
            p50_ms(m["ttft"][GRPC]), False),
        row(f"tokens/s, {STREAMS} streams", statistics.median(m["rates"][HTTP]),
            statistics.median(m["rates"][GRPC]), True),
    ]


def start_frontend(grpc_url: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(log_path, "ab")
    process = subprocess.Popen([sys.executable, "-m", "builder.cli", "openai", "--triton",
                                grpc_url, "--port", str(port)], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trident openai exited with {process.returncode} "
                               f"(log: {log_path})")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"trident openai did not answer within 60 s (log: {log_path})")


def run(out_dir: Path) -> dict:
    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="trident-bench-openai-") as tmp:
        repo = Path(tmp) / "repo"
        build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
        server = start_on_free_ports(repo, out_dir / "openai_frontend.tritonserver.log")
        frontend = None
        try:
            frontend, http_url = start_frontend(server.grpc_url,
                                                out_dir / "openai_frontend.frontend.log")
            measured = measure(server, http_url)
        finally:
            if frontend is not None:
                frontend.terminate()
                try:
                    frontend.wait(15)
                except subprocess.TimeoutExpired:
                    frontend.kill()
            server.stop()
    return bench_result("openai_frontend", rows_from(measured),
                        {"model": MODEL, "max_tokens": MAX_TOKENS, "streams": STREAMS,
                         "rounds": ROUNDS, "single_requests": SINGLE_REQUESTS,
                         "sampling": SAMPLING}, measured)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_results")
    out.mkdir(parents=True, exist_ok=True)
    result = run(out)
    print(json.dumps(result["rows"], indent=2))
