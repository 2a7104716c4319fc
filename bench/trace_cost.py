"""What traces cost a request: TTFT p50 through the OpenAI frontend with traces off, on
but unsampled, and on and sampled, side by side in one run (issue 38).

Three servers of bench/zero_cost.py's deployment (the SGLang double behind `router`: a
first token in a few ms, so what is left is Triton, the router, the frontend and what
tracing adds to them), each with its own `trident openai`:
- off: no endpoint (no tracer, tritonserver without --trace-config);
- unsampled: an endpoint and OTEL_TRACES_SAMPLER=traceidratio, _ARG=0 (the frontend's
  ParentBased(TraceIdRatioBased(0)); tritonserver's --trace-config rate=0, the engine
  models' span only under a sampled traceparent);
- sampled: the same with _ARG=1 (every request: the frontend's span, Triton's spans of
  the router's request, the engine model's span);
- collector stopped: sampled, its endpoint a loopback port nobody listens on; after the
  run, the spans trident counted as lost (the frontend's /metrics, the router's and the
  engine model's counters on Triton's metrics port), read until they stop growing.
- then, on the unsampled config's server alone, its unsampled requests alternating with
  client-sampled ones, which carry a client's sampled `traceparent` (its sampler is
  ParentBased: they are traced through, as in sampled): what sampling costs with no
  difference of server between the two. Two servers of one configuration differ by up
  to 2% in TTFT p50 here (a scratch A/A run: 6.02 vs 5.90 ms), as much as the target.
Every config's spans go to one loopback OTLP collector (support/otlp_collector.py) in a
process of its own, which counts what came per service: none should come unsampled.

Single streamed requests over bench/openai_frontend.py's raw HTTP client (one keep-alive
connection per config), the configs in turn per round, their order rotating, after a
warm-up of each; then the client-sampled pairs, in ABBA order. Servers are sent equal
shares of the rotation, and a request follows one to the same server only in the pairs,
where both halves do alike (one that does is faster: its processes' caches are warm).
Targets (issue 38): unsampled TTFT p50 <= off + 1%, sampled, collector stopped and
client-sampled <= +3% (a dead collector costs no more than a live one).

`--engine smollm2`: the same on the default deployment (deploy/default.yaml: SmolLM2-135M
on vLLM behind `router`), a real engine's first token as the base the percentages are of.
Two configs only (off and unsampled, each a vLLM engine on the same 2 cores), and the
client-sampled pairs on the unsampled one's server; 4-token answers, so that a run takes
minutes. Written to OUT_DIR/trace_cost.smollm2.json.
Usage: .venv/bin/python -m bench.trace_cost [--engine zero-cost|smollm2] [OUT_DIR]
       (about 2.5 minutes; smollm2 about 4)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import bench_result, ratio_row
from bench.openai_frontend import MAX_TOKENS, RawHTTP, stop_frontend
from bench.zero_cost import deployment
from builder.pipeline import build_repository
from builder.serve import admin
from builder.serve.server import TritonServer, free_port, start_on_free_ports
from builder.serve.tracing import Tracing
from builder.spec import load_spec, parse_spec
from support import sglang_double

ROOT = Path(__file__).resolve().parent.parent
# No spaces: a config's name is in its repository's path, which the Python backend's
# stub cannot take with a space (it aborts parsing its arguments: `stol`).
OFF, UNSAMPLED, SAMPLED, STOPPED = "off", "unsampled", "sampled", "collector_stopped"
CONFIGS = (OFF, UNSAMPLED, SAMPLED, STOPPED)
# UNSAMPLED's server alone: requests with a client's sampled traceparent, and its own
# unsampled requests beside them.
CLIENT_SAMPLED, BESIDE = "client_sampled", "unsampled_beside_client_sampled"
RATIO = {UNSAMPLED: "0", SAMPLED: "1", STOPPED: "1"}
TARGET_PCT = {UNSAMPLED: 1.0, SAMPLED: 3.0, STOPPED: 3.0, CLIENT_SAMPLED: 3.0}
# The counters of spans trident lost, by the names' common ends (the frontend's
# builder/serve/tracing.py, the engine models' trident_common/triton_io.py, the router's
# bls/router_metrics.py), as prometheus_client reads them (without _total).
LOST = ("trace_spans_dropped", "trace_spans_export_failed")
# A failed batch is counted when its export gives up (EXPORT_TIMEOUT_S, 10 s, retrying
# meanwhile): the counters are settled once unchanged for longer than that.
LOST_QUIET_S, LOST_SETTLE_S = 12.0, 90.0
REQUESTS = 400  # per config, interleaved
WARM_UP = 20


class Engine(NamedTuple):
    """What serves `router` in a run, and how much of the run it can take."""

    zero_cost: bool  # the SGLang double (zero_cost's deployment), else deploy/default.yaml
    label: str
    configs: tuple[str, ...]
    requests: int  # per config, and client-sampled pairs
    max_tokens: int
    start_timeout_s: float


ENGINES = {
    "zero-cost": Engine(True, "SGLang test double (zero cost)", CONFIGS, REQUESTS, MAX_TOKENS, 120),
    # A request takes ~0.1 s on 2 cores here: 150 of each, off and unsampled alternated.
    "smollm2": Engine(
        False, "SmolLM2-135M on vLLM (CPU), deploy/default.yaml", (OFF, UNSAMPLED), 150, 4, 600
    ),
}

# The collector, alone in its process: its endpoint on the first line, then, once its
# stdin closes, the spans it got per service (JSON).
COLLECTOR = """
import collections, json, sys
from support.otlp_collector import Collector
with Collector() as c:
    print(c.endpoint, flush=True)
    sys.stdin.read()
    print(json.dumps(collections.Counter(s.service for s in c.spans)), flush=True)
"""


def start_config(
    name: str, endpoint: str, work: Path, out_dir: Path, engine: Engine = ENGINES["zero-cost"]
) -> tuple[TritonServer, subprocess.Popen, str]:
    """One server and its frontend, traced as `name` says."""
    repo = work / f"repo_{name}"
    if engine.zero_cost:
        build_repository(parse_spec(deployment(), "<bench>"), repo)
        (repo / sglang_double.MODEL / "1" / "sglang.py").write_text(
            sglang_double.zero_cost_shim(MAX_TOKENS * 2)
        )
    else:
        build_repository(load_spec(ROOT / "deploy" / "default.yaml"), repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    kwargs: dict = {}
    if name != OFF:
        env |= {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_SERVICE_NAME": f"bench-{name}",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": RATIO[name],
        }
        tracing = Tracing.from_env(env)
        assert tracing is not None
        kwargs = {"extra_args": tracing.triton_args(), "extra_env": tracing.stub_environment()}
    server = start_on_free_ports(
        repo,
        out_dir / f"trace_cost.{name}.tritonserver.log",
        timeout_s=engine.start_timeout_s,
        **kwargs,
    )
    port = free_port()
    log_path = out_dir / f"trace_cost.{name}.frontend.log"
    with open(log_path, "ab") as log:
        frontend = subprocess.Popen(
            [sys.executable, "-m", "builder.cli", "openai", "--triton", server.grpc_url]
            + ["--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env | {admin.KEY_ENV: server.admin_key},
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if frontend.poll() is not None:
            raise RuntimeError(f"{name}: trident openai exited (log: {log_path})")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return server, frontend, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name}: trident openai did not answer within 60 s (log: {log_path})")


def client_traceparent() -> bytes:
    """A header line with a new sampled traceparent, as a traced client sends it."""
    return b"traceparent: 00-%032x-%016x-01\r\n" % (
        random.getrandbits(128) or 1,
        random.getrandbits(64) or 1,
    )


async def measure(
    urls: dict[str, str], engine: Engine = ENGINES["zero-cost"]
) -> dict[str, list[float]]:
    """TTFT s of engine.requests single requests per config, the configs' order rotating;
    then as many client-sampled and unsampled requests to UNSAMPLED's server."""
    clients = {name: RawHTTP(url, max_tokens=engine.max_tokens) for name, url in urls.items()}
    ttft: dict[str, list[float]] = {name: [] for name in (*urls, CLIENT_SAMPLED, BESIDE)}
    configs = tuple(urls)
    try:
        for name in urls:
            for _ in range(WARM_UP):
                await clients[name].stream("go")
        for i in range(engine.requests):
            turn = i % len(configs)
            order = configs[turn:] + configs[:turn]
            for name in order:
                ttft[name].append((await clients[name].stream("go"))[0])
        alone = clients[UNSAMPLED]
        for i in range(engine.requests):
            pair = (BESIDE, CLIENT_SAMPLED) if i % 4 in (0, 3) else (CLIENT_SAMPLED, BESIDE)
            for name in pair:
                headers = client_traceparent() if name == CLIENT_SAMPLED else b""
                ttft[name].append((await alone.stream("go", headers))[0])
    finally:
        for client in clients.values():
            await client.close()
    return ttft


def lost_spans(frontend_url: str, server: TritonServer) -> dict[str, float]:
    """The lost-span counters of one config's frontend and Triton, read until they stop
    growing (or LOST_SETTLE_S): {counter: value}, the counters present only."""

    def read() -> dict[str, float]:
        found: dict[str, float] = {}
        for url in (frontend_url + "/metrics", f"http://127.0.0.1:{server.ports.metrics}/metrics"):
            text = httpx.get(url, timeout=5).text
            for family in text_string_to_metric_families(text):
                if family.name.endswith(LOST):
                    found[family.name] = sum(s.value for s in family.samples)
        return found

    last, changed, deadline = read(), time.monotonic(), time.monotonic() + LOST_SETTLE_S
    while time.monotonic() < deadline and time.monotonic() - changed < LOST_QUIET_S:
        time.sleep(2)
        now = read()
        if now != last:
            last, changed = now, time.monotonic()
    return last


def rows_from(
    ttft: dict[str, list[float]], spans: dict[str, int], lost: dict[str, float] | None = None
) -> list[dict]:
    off = statistics.median(ttft[OFF]) * 1000
    rows = [ratio_row("TTFT p50 ms, traces off", off, off, "baseline")]
    for name in CONFIGS[1:]:
        if name not in ttft:
            continue
        ms = statistics.median(ttft[name]) * 1000
        added = (ms / off - 1) * 100
        got = sum(n for s, n in spans.items() if s.startswith(f"bench-{name}"))
        what = f"{got} spans"
        if name == UNSAMPLED:  # its client-sampled requests' spans, none of its own
            what = (
                f"{spans.get(f'bench-{name}', 0)} frontend spans for "
                f"{len(ttft.get(CLIENT_SAMPLED, ()))} client-sampled requests"
            )
        if name == STOPPED:
            sampled = spans.get(f"bench-{SAMPLED}", 0)  # the frontend's: one per request
            what = (
                f"{got} spans arrived, {sum((lost or {}).values()):.0f} counted lost of "
                f"{3 * sampled} (frontend, router, engine model)"
            )
        rows.append(_added_row(f"traces on, {name} ({added:+.1f}%, {what})", ms, off, "off", name))
    if ttft.get(CLIENT_SAMPLED):
        base = statistics.median(ttft[BESIDE]) * 1000
        ms = statistics.median(ttft[CLIENT_SAMPLED]) * 1000
        metric = (
            "sampled by the client's traceparent, over the same server's unsampled "
            f"requests ({(ms / base - 1) * 100:+.1f}%)"
        )
        rows.append(_added_row(metric, ms, base, "unsampled", CLIENT_SAMPLED))
    return rows


def _added_row(what: str, ms: float, base: float, base_name: str, name: str) -> dict:
    """A TTFT p50 row judged by the percentage it adds to `base` (TARGET_PCT[name])."""
    pct = TARGET_PCT[name]
    return ratio_row(
        f"TTFT p50 ms, {what}",
        ms,
        base,
        f"<= {base_name} + {pct:g}%",
        higher_better=False,
        threshold=1 + pct / 100,
    )


def run(out_dir: Path, engine: Engine = ENGINES["zero-cost"]) -> dict:
    out_dir = Path(out_dir)
    load_before = os.getloadavg()
    collector = subprocess.Popen(
        [sys.executable, "-c", COLLECTOR],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert collector.stdin is not None and collector.stdout is not None
    endpoint = collector.stdout.readline().strip()
    started: list[tuple[TritonServer, subprocess.Popen]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="trident-bench-trace-") as tmp:
            urls = {}
            for name in engine.configs:
                where = endpoint if name != STOPPED else f"http://127.0.0.1:{free_port()}/v1/traces"
                server, frontend, urls[name] = start_config(name, where, Path(tmp), out_dir, engine)
                started.append((server, frontend))
            ttft = asyncio.run(measure(urls, engine))
            lost = None
            if STOPPED in urls:
                lost = lost_spans(urls[STOPPED], started[engine.configs.index(STOPPED)][0])
            for server, frontend in started:  # their last spans leave as they stop
                stop_frontend(frontend)
                server.stop()
            started = []
    finally:
        for server, frontend in started:
            stop_frontend(frontend)
            server.stop()
        time.sleep(2)  # the engine stubs' last batches (sent at their finalize)
        collector.stdin.close()
        spans = json.loads(collector.stdout.readline() or "{}")
        collector.wait(10)
    return bench_result(
        "trace_cost",
        rows_from(ttft, spans, lost),
        {
            "engine": engine.label,
            "requests": engine.requests,
            "max_tokens": engine.max_tokens,
            "client": "raw HTTP/1.1, one keep-alive connection per config",
        },
        {"ttft_s": ttft, "spans": spans, "lost": lost, "load_average_before": load_before},
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.trace_cost")
    parser.add_argument("out", nargs="?", default="bench_results", metavar="OUT_DIR")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="zero-cost")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(out, ENGINES[args.engine])
    name = "trace_cost.json" if args.engine == "zero-cost" else f"trace_cost.{args.engine}.json"
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["rows"], indent=2))
    print("load average before/after:", result["raw"]["load_average_before"], os.getloadavg())
