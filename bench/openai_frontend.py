"""OpenAI frontend overhead: the same chat requests through /v1/chat/completions (the
frontend, `trident openai`, in its own process) and over gRPC straight to `router`, one
server, one run.

Renders deploy/default.yaml, starts one tritonserver and one frontend, warms both paths
up, then alternates rounds (frontend, gRPC, gRPC, frontend, ...) so drift and noise hit
both paths alike:
- 1 stream: single requests, TTFT p50 and tokens/s per request (median);
- 8 and 16 concurrent streams: TTFT p50 over every stream, tokens/s over each round
  (median of the rounds).

Both paths do the same work on the client: one asyncio loop, the same messages, greedy
sampling with a fixed length (ignore_eos), one connection shared by every stream on the
gRPC side (tritonclient.grpc.aio, as the frontend itself talks to Triton) and a pool of
keep-alive connections on the HTTP side (httpx, raw SSE split by hand: no openai
package, whose parsing would be counted against the frontend). TTFT is the first
response (the first chunk); the end of a request is the response carrying the finish
reason. tokens/s counts the engine's own completion tokens (usage; num_output_tokens).
The CPU time of the frontend process and of this client is recorded per path, the
steadiest sign of what the frontend costs on a busy machine.

Then the same 1-stream comparison on a zero-cost engine (the SGLang double of
bench/zero_cost.py behind `router`, a second server and frontend): vLLM on CPU takes
~70 ms to a first token, with a spread of several ms between requests, which hides a
1 ms difference in 16 requests; with an engine that costs nothing the first token comes
in a few ms, and what is left is Triton, the router and the frontend. That part has a
third path: the frontend through a raw HTTP/1.1 client (one asyncio connection, the
request in one write, chunked SSE read by hand). httpx alone spends about 2 ms of a
request's first-token time on this host building the request and reading the response
(docs/performance.md, "The OpenAI frontend's own cost"), a cost of the client that
gRPC's side does not pay; the raw client shows the frontend's own share. And a fourth:
the same raw client naming the engine model itself (exposed to this bench's frontend
only), 1 stream and 64 at once beside the raw client of `router`: no router at all, so
none of its decisions, tenant limits or trust. It is the ceiling of routing OpenAI clients
in the frontend's own process (issue 36), what such a route could save at most.

Run by `make bench` (bench/run.py); alone: `.venv/bin/python -m bench.openai_frontend
[OUT_DIR] [--zero-cost-only]` (the second skips the SmolLM2 part, for quick looks).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import tritonclient.grpc.aio as grpcaio

ROOT = Path(__file__).resolve().parent.parent

from bench.common import PROMPTS, bench_result, process_cpu_s  # noqa: E402
from bench.zero_cost import deployment  # noqa: E402
from builder.pipeline import build_repository  # noqa: E402
from builder.serve import admin  # noqa: E402
from builder.serve.client import build_inputs, first_output  # noqa: E402
from builder.serve.server import TritonServer, free_port, start_on_free_ports  # noqa: E402
from builder.spec import load_spec, parse_spec  # noqa: E402
from support import sglang_double  # noqa: E402

MODEL = "router"
MAX_TOKENS = 32
SINGLE_REQUESTS = 16  # per path, alternating
ROUNDS = 5  # concurrent rounds per path and stream count, alternating
STREAM_COUNTS = (8, 16)
SAMPLING = {"temperature": 0, "ignore_eos": True}
HTTP, GRPC, RAW = "openai_http", "grpc", "openai_raw_http"
# The raw client through the frontend straight to the engine model (no router): zero-cost
# part only.
RAW_ENGINE = "openai_raw_http_engine"
CEILING_STREAMS = 64  # the ceiling's concurrent point (bench/zero_cost.py's CONCURRENCY)
CEILING_ROUNDS = 10  # per path, alternating
TTFT_ADDED_MS = 1.0  # the target: the frontend adds at most this to TTFT p50
PATHS = (HTTP, GRPC)
ZERO_COST_REQUESTS = 150  # per path, alternating, on the zero-cost engine


def chat_body(prompt: str, model: str = MODEL, max_tokens: int = MAX_TOKENS) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        **SAMPLING,
    }


def sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete `data:` payloads in buffer, and the unfinished rest."""
    *events, rest = buffer.split(b"\n\n")
    return [e[len(b"data: ") :] for e in events if e.startswith(b"data: ")], rest


class StreamedAnswer:
    """One streamed completion read as its bytes arrive, whatever client read them: the
    TTFT, the completion tokens (from the usage chunk) and the time to the finish reason."""

    def __init__(self, start: float):
        self.start, self.buffer = start, b""
        self.ttft = self.end = 0.0
        self.tokens = 0

    def feed(self, data: bytes, now: float) -> None:
        events, self.buffer = sse_events(self.buffer + data)
        for event in events:
            if event == b"[DONE]":
                continue
            chunk = json.loads(event)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            choices = chunk["choices"]
            if choices and not self.ttft:
                self.ttft = now - self.start
            if choices and choices[0]["finish_reason"]:
                self.end = now - self.start
            if chunk.get("usage"):
                self.tokens = chunk["usage"]["completion_tokens"]

    def figures(self) -> tuple[float, int, float]:
        """(TTFT s, completion tokens, s to the finish reason)."""
        return self.ttft, self.tokens, self.end


async def http_stream(client: httpx.AsyncClient, url: str, prompt: str) -> tuple:
    """(TTFT s, completion tokens, s to the finish reason) of one streamed completion."""
    answer = StreamedAnswer(time.perf_counter())
    async with client.stream(
        "POST", url + "/v1/chat/completions", json=chat_body(prompt)
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for data in response.aiter_raw():
            answer.feed(data, time.perf_counter())
    return answer.figures()


class RawHTTP:
    """One keep-alive HTTP/1.1 connection to the frontend: a request in one write, the
    chunked SSE answer read by hand (no HTTP library between the socket and the clock)."""

    def __init__(self, url: str, model: str = MODEL, max_tokens: int = MAX_TOKENS):
        self.host, port = url.removeprefix("http://").split(":")
        self.port, self.model, self.max_tokens = int(port), model, max_tokens
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def stream(self, prompt: str, headers: bytes = b"") -> tuple:
        """The same as http_stream; `headers`: more header lines, each ending in CRLF."""
        if self.writer is None or self.reader is None or self.reader.at_eof():
            # (again, when the server closed an idle connection: uvicorn does after 5 s)
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        body = json.dumps(chat_body(prompt, self.model, self.max_tokens)).encode()
        start = time.perf_counter()
        self.writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s:%d\r\n%s"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (self.host.encode(), self.port, headers, len(body), body)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"HTTP: {head[:300]!r}")
        answer = StreamedAnswer(start)
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            data = (await self.reader.readexactly(size + 2))[:-2]
            answer.feed(data, time.perf_counter())
        await self.reader.readuntil(b"\r\n")  # the last chunk's (empty) trailer
        return answer.figures()


async def grpc_stream(client: grpcaio.InferenceServerClient, prompt: str) -> tuple:
    """The same as http_stream, over one gRPC stream straight to MODEL."""
    inputs = build_inputs(
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        stream=True,
        sampling=SAMPLING,
        exclude_input_in_output=True,
    )  # as the frontend sends it

    async def one_request():
        yield {"model_name": MODEL, "inputs": inputs, "request_id": uuid.uuid4().hex}

    start = time.perf_counter()
    ttft = end = 0.0
    tokens = 0
    async for result, error in client.stream_infer(one_request()):
        if error is not None:
            raise RuntimeError(f"{MODEL}: {error.message()}")
        now = time.perf_counter()
        if not ttft:
            ttft = now - start
        tokens = int(first_output(result, "num_output_tokens") or tokens)
        if first_output(result, "finish_reason"):
            end = now - start
    return ttft, tokens, end


class Paths:
    """Both paths' clients, and the CPU seconds each path cost (frontend, this client)."""

    def __init__(self, http_url: str, grpc_url: str, frontend_pid: int, engine: str | None = None):
        limits = httpx.Limits(
            max_connections=max(STREAM_COUNTS), max_keepalive_connections=max(STREAM_COUNTS)
        )
        self.http = httpx.AsyncClient(timeout=300, limits=limits)
        self.grpc = grpcaio.InferenceServerClient(grpc_url)
        # The raw paths' connections, one per concurrent stream, made as a round needs them.
        self.raw: dict[str, list[RawHTTP]] = {RAW: []}
        self.models = {RAW: MODEL}
        if engine is not None:
            self.raw[RAW_ENGINE], self.models[RAW_ENGINE] = [], engine
        self.http_url, self.frontend_pid = http_url, frontend_pid
        self.cpu = {
            p: {"frontend_s": 0.0, "client_s": 0.0, "tokens": 0} for p in (*PATHS, *self.raw)
        }

    async def close(self) -> None:
        await self.http.aclose()
        await self.grpc.close()
        for connections in self.raw.values():
            for connection in connections:
                await connection.close()

    def one(self, path: str, prompt: str, stream: int = 0):
        if path == HTTP:
            return http_stream(self.http, self.http_url, prompt)
        if path in self.raw:
            connections = self.raw[path]
            while len(connections) <= stream:
                connections.append(RawHTTP(self.http_url, self.models[path]))
            return connections[stream].stream(prompt)
        return grpc_stream(self.grpc, prompt)

    async def round(self, path: str, streams: int) -> tuple[list[tuple], float]:
        """`streams` requests at once; (each one's figures, wall s)."""
        frontend, client = process_cpu_s(self.frontend_pid), time.process_time()
        start = time.perf_counter()
        results = await asyncio.gather(
            *(self.one(path, PROMPTS[i % len(PROMPTS)], i) for i in range(streams))
        )
        wall = time.perf_counter() - start
        cpu = self.cpu[path]
        cpu["frontend_s"] += process_cpu_s(self.frontend_pid) - frontend
        cpu["client_s"] += time.process_time() - client
        cpu["tokens"] += sum(r[1] for r in results)
        return results, wall


def alternating(i: int, paths: tuple = PATHS) -> tuple:
    return paths if i % 2 == 0 else paths[::-1]


async def measure_async(http_url: str, grpc_url: str, frontend_pid: int) -> dict:
    paths = Paths(http_url, grpc_url, frontend_pid)
    try:
        for path in PATHS:  # warm-up: connections, the engine's first batches
            await paths.round(path, max(STREAM_COUNTS))
        paths.cpu = {p: {k: 0 for k in paths.cpu[p]} for p in PATHS}
        single = {p: [] for p in PATHS}
        for i in range(SINGLE_REQUESTS):
            for path in alternating(i):
                (result,), _ = await paths.round(path, 1)
                single[path].append(result)
        concurrent = {
            str(n): {p: {"ttft_s": [], "tokens_per_s": []} for p in PATHS} for n in STREAM_COUNTS
        }
        for i in range(ROUNDS):
            for streams in STREAM_COUNTS:
                for path in alternating(i):
                    results, wall = await paths.round(path, streams)
                    runs = concurrent[str(streams)][path]
                    runs["ttft_s"] += [r[0] for r in results]
                    runs["tokens_per_s"].append(sum(r[1] for r in results) / wall)
        return {"single": single, "concurrent": concurrent, "cpu": paths.cpu}
    finally:
        await paths.close()


def measure(server: TritonServer, http_url: str, frontend_pid: int) -> dict:
    return asyncio.run(measure_async(http_url, server.grpc_url, frontend_pid))


async def measure_zero_cost_async(
    http_url: str, grpc_url: str, frontend_pid: int, engine: str
) -> dict:
    """Single requests, every path alternating, after a warm-up of each; then the raw
    client's CEILING_STREAMS at once, through `router` and straight to `engine`."""
    paths = Paths(http_url, grpc_url, frontend_pid, engine)
    order = (HTTP, GRPC, RAW, RAW_ENGINE)
    ceiling = (RAW, RAW_ENGINE)
    try:
        for path in order:
            for _ in range(20):
                await paths.round(path, 1)
        for path in ceiling:
            await paths.round(path, CEILING_STREAMS)
        paths.cpu = {p: {k: 0 for k in paths.cpu[p]} for p in order}
        single: dict[str, list] = {p: [] for p in order}
        for i in range(ZERO_COST_REQUESTS):
            for path in alternating(i, order):
                (result,), _ = await paths.round(path, 1)
                single[path].append(result)
        requests_per_s: dict[str, list] = {p: [] for p in ceiling}
        for i in range(CEILING_ROUNDS):
            for path in alternating(i, ceiling):
                results, wall = await paths.round(path, CEILING_STREAMS)
                requests_per_s[path].append(len(results) / wall)
        return {
            "single": single,
            "cpu": paths.cpu,
            "concurrent": {str(CEILING_STREAMS): {"requests_per_s": requests_per_s}},
        }
    finally:
        await paths.close()


def zero_cost(out_dir: Path, work: Path) -> dict:
    """The 1-stream comparison on bench/zero_cost.py's engine and deployment."""
    repo = work / "zero_cost_repo"
    build_repository(parse_spec(deployment(), "<bench>"), repo)
    (repo / sglang_double.MODEL / "1" / "sglang.py").write_text(
        sglang_double.zero_cost_shim(MAX_TOKENS * 2)
    )
    server = start_on_free_ports(
        repo, out_dir / "openai_frontend.zero_cost.tritonserver.log", timeout_s=120
    )
    frontend = None
    try:
        frontend, http_url = start_frontend(
            server.grpc_url,
            out_dir / "openai_frontend.zero_cost.frontend.log",
            server.admin_key,
            expose=(MODEL, sglang_double.MODEL),  # the engine model too: the ceiling's path
        )
        return asyncio.run(
            measure_zero_cost_async(http_url, server.grpc_url, frontend.pid, sglang_double.MODEL)
        )
    finally:
        stop_frontend(frontend)
        server.stop()


def rows_from(m: dict) -> list[dict]:
    def row(metric, ours, direct, higher_better):
        return {
            "metric": metric,
            "ours": ours,
            "direct": direct,
            "ratio": ours / direct if direct else None,
            "target": "measured (frontend vs gRPC to router)",
            "met": None,
            "higher_better": higher_better,
        }

    def ttft_ms(values):
        return statistics.median(values) * 1000

    if "single" not in m:  # the zero-cost part alone (--zero-cost-only)
        return zero_cost_rows(m["zero_cost"], row, ttft_ms)
    single = m["single"]
    rows = [
        row(
            "TTFT p50 ms, 1 stream",
            ttft_ms([r[0] for r in single[HTTP]]),
            ttft_ms([r[0] for r in single[GRPC]]),
            False,
        ),
        row(
            "tokens/s, 1 stream",
            *(statistics.median(t / end for _, t, end in single[p]) for p in PATHS),
            True,
        ),
    ]
    added = ttft_ms([r[0] for r in single[HTTP]]) - ttft_ms([r[0] for r in single[GRPC]])
    rows.insert(
        1,
        {
            **row("TTFT p50 added by the frontend ms, 1 stream", added, None, False),
            "target": "<= +1.0 ms (issue 22)",
            "met": added <= TTFT_ADDED_MS,
        },
    )
    for streams, by_path in m["concurrent"].items():
        rows.append(
            row(
                f"TTFT p50 ms, {streams} streams",
                *(ttft_ms(by_path[p]["ttft_s"]) for p in PATHS),
                False,
            )
        )
        rows.append(
            row(
                f"tokens/s, {streams} streams",
                *(statistics.median(by_path[p]["tokens_per_s"]) for p in PATHS),
                True,
            )
        )
    cpu = m["cpu"]
    rows.append(
        row(
            "CPU ms per token (frontend + client)",
            *((cpu[p]["frontend_s"] + cpu[p]["client_s"]) * 1000 / cpu[p]["tokens"] for p in PATHS),
            False,
        )
    )
    # The frontend's own cost, apart from the clients' (httpx and SSE parsing cost more
    # than tritonclient: that part is the benchmark's, not the frontend's).
    rows.append(
        {
            **row(
                "frontend CPU ms per 1,000 tokens",
                cpu[HTTP]["frontend_s"] * 1e6 / cpu[HTTP]["tokens"],
                None,
                False,
            ),
            "ratio": None,
        }
    )
    if "zero_cost" in m:
        rows += zero_cost_rows(m["zero_cost"], row, ttft_ms)
    return rows


def zero_cost_rows(z: dict, row, ttft_ms) -> list[dict]:
    single, cpu = z["single"], z["cpu"]
    http, grpc = (ttft_ms([r[0] for r in single[p]]) for p in PATHS)
    added = http - grpc
    raw_rows = []
    if RAW in single:  # results written before the raw client was added have none
        raw = ttft_ms([r[0] for r in single[RAW]])
        raw_rows = [
            row("TTFT p50 ms, 1 stream, zero-cost engine, raw HTTP client", raw, grpc, False),
            {
                **row(
                    "TTFT p50 added by the frontend ms, 1 stream, zero-cost engine, "
                    "raw HTTP client",
                    raw - grpc,
                    None,
                    False,
                ),
                "target": "<= +1.0 ms (issue 22; without httpx's own cost)",
                "met": raw - grpc <= TTFT_ADDED_MS,
            },
        ]
    return (
        raw_rows
        + ceiling_rows(z, row, ttft_ms)
        + [
            row("TTFT p50 ms, 1 stream, zero-cost engine", http, grpc, False),
            {
                **row(
                    "TTFT p50 added by the frontend ms, 1 stream, zero-cost engine",
                    added,
                    None,
                    False,
                ),
                "target": "<= +1.0 ms (issue 22)",
                "met": added <= TTFT_ADDED_MS,
            },
            {
                **row(
                    "frontend CPU ms per 1,000 tokens, zero-cost engine",
                    cpu[HTTP]["frontend_s"] * 1e6 / cpu[HTTP]["tokens"],
                    None,
                    False,
                ),
                "ratio": None,
            },
        ]
    )


def ceiling_rows(z: dict, row, ttft_ms) -> list[dict]:
    """The raw client through `router` (ours) beside the same client straight to the
    engine model (direct): what routing in the frontend's own process could save at most."""
    single = z["single"]
    if RAW_ENGINE not in single:  # results written before the ceiling was measured have none
        return []
    target = "measured (the in-process route's ceiling, issue 36: no router at all)"
    by_rounds = z["concurrent"][str(CEILING_STREAMS)]["requests_per_s"]
    return [
        {
            **row(
                "TTFT p50 ms, 1 stream, zero-cost engine, raw HTTP client, "
                "router vs the engine model straight",
                *(ttft_ms([r[0] for r in single[p]]) for p in (RAW, RAW_ENGINE)),
                False,
            ),
            "target": target,
        },
        {
            **row(
                f"requests/s, {CEILING_STREAMS} streams, zero-cost engine, raw HTTP client, "
                "router vs the engine model straight",
                *(statistics.median(by_rounds[p]) for p in (RAW, RAW_ENGINE)),
                True,
            ),
            "target": target,
        },
    ]


def stop_frontend(frontend: subprocess.Popen | None) -> None:
    """SIGTERM the frontend process, SIGKILL it if it is not gone within 15 s."""
    if frontend is None:
        return
    frontend.terminate()
    try:
        frontend.wait(15)
    except subprocess.TimeoutExpired:
        frontend.kill()


def start_frontend(
    grpc_url: str, log_path: Path, admin_key: str | None = None, expose: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """`trident openai` for the server at grpc_url, serving `expose` (its default,
    `router`, if empty). It lists the models through Triton's restricted index: give the
    server's admin_key (else the environment's is used)."""
    port = free_port()
    log = open(log_path, "ab")
    env = dict(os.environ, **({admin.KEY_ENV: admin_key} if admin_key else {}))
    exposed = [arg for name in expose for arg in ("--expose", name)]
    process = subprocess.Popen(
        [sys.executable, "-m", "builder.cli", "openai", "--triton", grpc_url, "--port", str(port)]
        + exposed,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"trident openai exited with {process.returncode} (log: {log_path})")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"trident openai did not answer within 60 s (log: {log_path})")


def smollm2(out_dir: Path, work: Path) -> dict:
    """The SmolLM2 part: deploy/default.yaml's `router`, 1, 8 and 16 streams."""
    repo = work / "repo"
    build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
    server = start_on_free_ports(repo, out_dir / "openai_frontend.tritonserver.log")
    frontend = None
    try:
        frontend, http_url = start_frontend(
            server.grpc_url, out_dir / "openai_frontend.frontend.log", server.admin_key
        )
        return measure(server, http_url, frontend.pid)
    finally:
        stop_frontend(frontend)
        server.stop()


def run(out_dir: Path, zero_cost_only: bool = False) -> dict:
    out_dir = Path(out_dir)
    load_before = os.getloadavg()
    measured: dict = {}
    with tempfile.TemporaryDirectory(prefix="trident-bench-openai-") as tmp:
        if not zero_cost_only:
            measured = smollm2(out_dir, Path(tmp))
        measured["zero_cost"] = zero_cost(out_dir, Path(tmp))
    measured["load_average_before"] = load_before
    return bench_result(
        "openai_frontend",
        rows_from(measured),
        {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "stream_counts": STREAM_COUNTS,
            "rounds": ROUNDS,
            "single_requests": SINGLE_REQUESTS,
            "sampling": SAMPLING,
            "zero_cost_requests": ZERO_COST_REQUESTS,
        },
        measured,
    )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--zero-cost-only"]
    out = Path(args[0] if args else "bench_results")
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, zero_cost_only="--zero-cost-only" in sys.argv[1:])
    (out / "openai_frontend.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))
