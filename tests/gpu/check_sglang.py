"""GPU check of trident's SGLang backend with the real SGLang (run by check_sglang.sh).

Renders a repository with one SGLang model behind trident's router, validates it, serves
it with tritonserver, and checks over gRPC:
  1. streaming: several text chunks, exactly one final response, token counts, served_by;
  2. client abort: cancelling a long stream aborts it in SGLang (aborted counter +1,
     nothing left in flight) and the model keeps serving;
  3. router abort: the same through the router (it tells the backend by request id);
  4. prefix cache: turn 2 of a conversation (sent through the router with a
     conversation_id) reuses turn 1's tokens: trident_prefix_cached_tokens_total grows;
  5. load gauges: while a long stream runs, SGLang's own sglang:num_running_reqs and
     sglang:token_usage, which its scheduler writes to files in the model instance's
     folder (trident_common/engine_gauges.py), read 1 or more and above 0 where the
     OpenAI frontend reads them; after it, 0 running and 0 queued.
Prints one line per check and exits 0 only when all pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from builder.pipeline import build_repository  # noqa: E402
from builder.plan.gpus import gpu_type_for  # noqa: E402
from builder.render.validate import validate_repository  # noqa: E402
from builder.serve.client import build_inputs  # noqa: E402
from builder.serve.openai.pod_metrics import sglang_gauges  # noqa: E402
from builder.serve.server import Ports, TritonServer, free_port  # noqa: E402
from builder.spec import parse_spec  # noqa: E402
from support.grpc_stream import Result, Stream, generate  # noqa: E402,F401
from support.sglang_double import MODEL, deployment  # noqa: E402
from tests.helpers import metric_value, wait_for  # noqa: E402

SYSTEM = (
    "You are a concise geography tutor. Answer in one short sentence, name the "
    "country and the city, and do not add any other commentary. "
) * 6


def check_streaming(server: TritonServer) -> str:
    r = generate(
        server.grpc_url,
        MODEL,
        messages=[{"role": "user", "content": "Write three sentences about the river Seine."}],
        max_tokens=64,
        sampling={"temperature": 0},
    )
    assert not r.errors, r.errors
    assert r.chunks >= 3, f"only {r.chunks} chunk(s)"
    assert r.finals == 1 and r.finish_reason in ("stop", "length"), r
    assert r.output_tokens > 0 and r.served_by == MODEL, r
    return f"{r.chunks} chunks, {r.output_tokens} tokens, TTFT {r.ttft_s * 1000:.0f} ms"


def check_abort(server: TritonServer, via: str) -> str:
    aborted = lambda: metric_value(  # noqa: E731
        server.metrics_url,
        "trident_requests_aborted_total",
        model=MODEL,
    )
    before = aborted()
    stream = Stream(server.grpc_url)
    stream.send(
        via,
        build_inputs(
            prompt="Count from one to ten thousand: one, two,",
            max_tokens=3000,
            sampling={"ignore_eos": True},
        ),
    )
    got = stream.read(until_chunks=3)
    stream.close(cancel=True)
    assert not got.errors and got.chunks >= 3, got
    wait_for(lambda: aborted() >= before + 1, timeout_s=20)
    wait_for(
        lambda: metric_value(server.metrics_url, "trident_requests_in_flight", model=MODEL) == 0,
        timeout_s=20,
    )
    after = generate(server.grpc_url, MODEL, prompt="Say OK.", max_tokens=4)
    assert not after.errors and after.finals == 1, after
    return f"aborted after {got.chunks} chunks; still serving"


def check_prefix_cache(server: TritonServer) -> str:
    cached = lambda: metric_value(  # noqa: E731
        server.metrics_url,
        "trident_prefix_cached_tokens_total",
        model=MODEL,
    )
    hints = {"conversation_id": f"check-{uuid.uuid4().hex[:8]}"}
    turn1 = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    first = generate(
        server.grpc_url,
        "router",
        messages=turn1,
        max_tokens=32,
        sampling={"temperature": 0},
        hints=hints,
    )
    assert not first.errors and first.text, first
    before = cached()
    turn2 = turn1 + [
        {"role": "assistant", "content": first.text.strip()},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = generate(
        server.grpc_url,
        "router",
        messages=turn2,
        max_tokens=32,
        sampling={"temperature": 0},
        hints=hints,
    )
    assert not second.errors and second.text, second
    gained = cached() - before
    assert gained > 0, "turn 2 reused no cached tokens"
    return (
        f"turn 2 reused {gained:.0f} cached tokens; TTFT turn 1 "
        f"{first.ttft_s * 1000:.0f} ms, turn 2 {second.ttft_s * 1000:.0f} ms"
    )


def check_load(server: TritonServer) -> str:
    def gauges() -> dict[str, float]:
        read = sglang_gauges(server.gauges_folder, [MODEL])
        return {sample.name.removeprefix("sglang:"): sample.value for sample in read}

    stream = Stream(server.grpc_url)
    stream.send(
        MODEL,
        build_inputs(
            prompt="Count from one to ten thousand: one, two,",
            max_tokens=2000,
            sampling={"ignore_eos": True},
        ),
    )
    stream.read(until_chunks=3)
    busy = wait_for(
        lambda: (
            g if (g := gauges()).get("num_running_reqs", 0) >= 1 and g["token_usage"] > 0 else None
        ),
        timeout_s=20,
        interval_s=0.05,
    )
    stream.close(cancel=True)
    wait_for(lambda: gauges().get("num_running_reqs") == 0, timeout_s=40)
    assert gauges()["num_queue_reqs"] == 0, gauges()
    running, usage = busy["num_running_reqs"], busy["token_usage"]
    return f"running {running:.0f}, token usage {usage:.2f} under one stream; 0 after"


def detect_gpu_type() -> str:
    """GPU 0's builder.plan.gpus type name; H100-80GB for a GPU trident's table lacks."""
    line = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    name, memory_mib = line.rsplit(",", 1)
    known = gpu_type_for(name.strip(), float(memory_mib))
    return known.name if known else "H100-80GB"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="Qwen/Qwen2.5-0.5B-Instruct",
        help="local folder or Hugging Face id of a small chat model",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        help="a builder.plan.gpus GPU type name (default: GPU 0's, from nvidia-smi)",
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    gpu = args.gpu or detect_gpu_type()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="trident-sglang-check-"))
    repo = work / "repo"
    t0 = time.monotonic()
    build_repository(parse_spec(deployment(args.model, gpu), "<check_sglang>"), repo)
    problems = validate_repository(repo)
    if problems:
        print("FAIL validate:", *problems, sep="\n  ")
        return 1
    print(f"ok   render + validate: {repo}")
    print(json.dumps(json.loads((repo / MODEL / "1" / "model.json").read_text())))
    server = TritonServer(
        repo,
        Ports(free_port(), free_port(), free_port()),
        log_path=work / "tritonserver.log",
        gauges_folder=work / "engine-gauges",  # as `trident serve` names one
    )
    checks = [
        ("streaming", lambda: check_streaming(server)),
        ("client abort", lambda: check_abort(server, MODEL)),
        ("router abort", lambda: check_abort(server, "router")),
        ("prefix cache", lambda: check_prefix_cache(server)),
        ("load gauges", lambda: check_load(server)),
    ]
    server.start()
    failed = 0
    try:
        server.wait_ready(args.ready_timeout)
        print(f"ok   ready in {time.monotonic() - t0:.0f} s (log: {work / 'tritonserver.log'})")
        for name, check in checks:
            try:
                print(f"ok   {name}: {check()}", flush=True)
            except Exception as e:  # report every check, then fail
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    finally:
        server.stop()
    print(
        f"{'PASS' if not failed else 'FAIL'}: {len(checks) - failed}/{len(checks)} checks in "
        f"{time.monotonic() - t0:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
