"""AIPerf and trident's in-house client at one shared load point, side by side.

AIPerf (PyPI `aiperf`, NVIDIA's successor to genai-perf; NVIDIA Dynamo and llm-d publish
their figures with it) drives trident's OpenAI frontend (/v1/completions, streamed) while
the paced AsyncLLM double answers behind trident's real vLLM model and `router`, set up as
bench/gpu_rate.py does. The in-house client (bench/rate_clients.HttpPath) drives the same
frontend at the same point, once before AIPerf and once after, so the two runs of the
in-house client show how much the machine alone moves a figure.

The point: STREAMS requests in flight at all times (a new one as soon as one ends, as
AIPerf's --concurrency does), REQUESTS_PER_STREAM requests each, TOKENS tokens per answer
(ignore_eos: the double makes exactly max_tokens), TOKENS_PER_S per stream.

AIPerf runs from its own virtual environment (`make aiperf`: .venv-aiperf; its pins clash
with requirements.lock), offline (HF_HUB_OFFLINE=1): its tokenizer is the local SmolLM2
folder that `trident assets` builds. It counts output tokens from the server's usage
(--use-server-token-count): the double's tokens are the words " w<i>", which SmolLM2's
tokenizer would split into 2-4 tokens each. Without AIPerf here the benchmark says why in
one line and reports no figures.
Usage: .venv/bin/python -m bench.aiperf_point [--out DIR]
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.aiperf_results import (
    EXPORT,
    AIPerfUnavailable,
    aiperf_command,
    aiperf_figures,
    compare_rows,
    failure_line,
    find_export,
    inhouse_figures,
)
from bench.common import bench_result, run_alone
from bench.gpu_rate import BATCH_TOKENS_PER_S, MODEL, ROUTER, TTFT_S, deployment
from bench.openai_frontend import start_frontend, stop_frontend
from bench.rate_clients import HttpPath, load_point
from bench.rate_stats import Request
from builder.engines.assets import SMOLLM2, models_dir
from builder.pipeline import build_repository
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec
from support.pacing import Rate
from support.vllm_double import make_environment, use_double, write_rate

ROOT = Path(__file__).resolve().parent.parent
AIPERF_ENV = "TRIDENT_AIPERF"  # the aiperf executable, if not .venv-aiperf's
STREAMS, TOKENS_PER_S, TOKENS, REQUESTS_PER_STREAM = 16, 50, 128, 3
INPUT_TOKENS = 32  # the double's TTFT does not depend on the prompt
AIPERF_TIMEOUT_S = 600
LOCAL_REPO_OWNER, LOCAL_REVISION = "trident-local", "0" * 40


def aiperf_executable() -> Path:
    path = Path(os.environ.get(AIPERF_ENV) or ROOT / ".venv-aiperf" / "bin" / "aiperf")
    if not os.access(path, os.X_OK):
        raise AIPerfUnavailable(
            f"no aiperf executable at {path} (run `make aiperf`, or set {AIPERF_ENV})"
        )
    return path


def tokenizer_folder() -> Path:
    folder = models_dir() / SMOLLM2
    if not (folder / "tokenizer.json").is_file():
        raise AIPerfUnavailable(f"no SmolLM2 tokenizer at {folder} (run `trident assets`)")
    return folder


def local_hub_cache(folder: Path, cache: Path) -> str:
    """A HuggingFace hub cache under `cache` holding `folder`'s tokenizer files (links),
    and the repository id that names it. AIPerf 0.13 in offline mode looks every
    tokenizer up with snapshot_download(local_files_only=True), which refuses a path
    ("Repo id must be in the form 'repo_name' or 'namespace/repo_name'"); a cache laid
    out as the hub lays it out answers that lookup with no network."""
    repo_id = f"{LOCAL_REPO_OWNER}/{folder.name}"
    entry = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / LOCAL_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(LOCAL_REVISION)
    for file in folder.iterdir():
        if file.is_file() and file.suffix in (".json", ".jinja", ".txt", ".model"):
            (snapshot / file.name).unlink(missing_ok=True)
            (snapshot / file.name).symlink_to(file.resolve())
    return repo_id


def offline_environment(cache: Path) -> dict:
    """AIPerf's environment: no HuggingFace download, whatever the machine's settings;
    the hub cache is the local one."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
    }


def run_aiperf(url: str, artifacts: Path, log_path: Path) -> dict:
    cache = artifacts.parent / "hf-hub"
    tokenizer = local_hub_cache(tokenizer_folder(), cache)
    command = aiperf_command(
        aiperf_executable(),
        url,
        ROUTER,
        tokenizer,
        artifacts,
        streams=STREAMS,
        requests=STREAMS * REQUESTS_PER_STREAM,
        tokens=TOKENS,
        input_tokens=INPUT_TOKENS,
    )
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "wb") as log:
        try:
            done = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=offline_environment(cache),
                timeout=AIPERF_TIMEOUT_S,
                cwd=artifacts.parent,
            )
        except subprocess.TimeoutExpired:
            raise AIPerfUnavailable(
                f"aiperf did not finish within {AIPERF_TIMEOUT_S} s (log: {log_path})"
            ) from None
    if done.returncode != 0:
        raise AIPerfUnavailable(
            f"aiperf exited with {done.returncode}: "
            f"{failure_line(log_path.read_text(errors='replace'))} "
            f"(log: {log_path})"
        )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # AIPerf's processes, all
    export = find_export(artifacts)
    kept = log_path.parent / f"aiperf_point.{EXPORT}"  # AIPerf's own summary, kept
    shutil.copyfile(export, kept)
    figures = aiperf_figures(json.loads(kept.read_text()))
    # its whole run (start-up, warm-up, the point, the report): what it took from the cores
    figures["client_cpu_s"] = (
        after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    )
    return figures


async def inhouse(url: str) -> dict:
    """STREAMS lanes, each sending REQUESTS_PER_STREAM requests one after the other."""
    path = HttpPath(url, ROUTER, STREAMS)
    requests: list[Request] = []
    failures: list[Exception] = []

    async def lane():
        for _ in range(REQUESTS_PER_STREAM):
            try:
                requests.append(await path.one(TOKENS))
            except Exception as e:  # counted and named below, as AIPerf counts errors
                failures.append(e)

    try:
        await load_point(path, 4, 8, 60)  # warm-up: connections, code paths
        cpu = time.process_time()
        await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(STREAMS))), AIPERF_TIMEOUT_S)
    finally:
        await path.close()
    if failures:
        print(
            f"aiperf_point: {len(failures)} in-house requests failed: "
            f"{type(failures[0]).__name__}: {failures[0]}",
            flush=True,
        )
    return {**inhouse_figures(requests, len(failures)), "client_cpu_s": time.process_time() - cpu}


def measure(http_url: str, out_dir: Path, work: Path) -> tuple[dict, dict | str, dict]:
    before = asyncio.run(inhouse(http_url))
    print(f"aiperf_point: in-house (before) {_line(before)}", flush=True)
    try:
        aiperf = run_aiperf(http_url, work / "aiperf", out_dir / "aiperf_point.aiperf.log")
        print(f"aiperf_point: AIPerf {_line(aiperf)}", flush=True)
    except AIPerfUnavailable as e:
        aiperf = str(e)
        print(f"aiperf_point: AIPerf left out: {aiperf}", file=sys.stderr, flush=True)
    after = asyncio.run(inhouse(http_url))
    print(f"aiperf_point: in-house (after) {_line(after)}", flush=True)
    return before, aiperf, after


def _line(f: dict) -> str:
    return (
        f"TTFT p50/p99 {f['ttft_p50_ms']:.1f}/{f['ttft_p99_ms']:.1f} ms, ITL p50/p99 "
        f"{f['itl_p50_ms']:.2f}/{f['itl_p99_ms']:.2f} ms, output "
        f"{f['output_tokens_per_s']:.0f} tokens/s, {f['requests']} requests, "
        f"{f['errors']} failed, client CPU {f['client_cpu_s']:.1f} s"
    )


def run(out_dir: Path) -> dict:
    out_dir = Path(out_dir)
    config = {
        "engine": "paced AsyncLLM double behind trident's vLLM model and router",
        "path": "trident openai, /v1/completions, streamed",
        "streams": STREAMS,
        "tokens_per_stream_s": TOKENS_PER_S,
        "tokens": TOKENS,
        "ttft_s": TTFT_S,
        "requests": STREAMS * REQUESTS_PER_STREAM,
        "input_tokens": INPUT_TOKENS,
    }
    try:
        config["aiperf"] = str(aiperf_executable())
        config["tokenizer"] = str(tokenizer_folder())
    except AIPerfUnavailable as e:
        print(f"aiperf_point: AIPerf cannot run here: {e}", file=sys.stderr)
        return bench_result(
            "aiperf_point",
            [{"metric": "AIPerf vs in-house client", "target": f"not run: {e}"[:120], "met": None}],
            config,
            {"aiperf": str(e)},
        )
    with tempfile.TemporaryDirectory(prefix="trident-bench-aiperf-") as tmp:
        work = Path(tmp)
        repo, control = work / "repo", work / "rate.json"
        build_repository(parse_spec(deployment(STREAMS), "<bench>"), repo)
        rate = Rate(TTFT_S, TOKENS_PER_S, BATCH_TOKENS_PER_S)
        use_double(repo, MODEL, make_environment(work / "env"), control, rate)
        write_rate(control, rate)
        server = start_on_free_ports(
            repo,
            out_dir / "aiperf_point.tritonserver.log",
            load_models=(MODEL, ROUTER),
            timeout_s=120,
        )
        frontend = None
        try:
            frontend, http_url = start_frontend(
                server.grpc_url, out_dir / "aiperf_point.frontend.log", server.admin_key
            )  # lists the models
            started = time.monotonic()
            before, aiperf, after = measure(http_url, out_dir, work)
            config["measured_s"] = round(time.monotonic() - started, 1)
        finally:
            stop_frontend(frontend)
            server.stop()
    raw = {"inhouse_before": before, "aiperf": aiperf, "inhouse_after": after}
    return bench_result("aiperf_point", compare_rows(before, aiperf, after), config, raw)


def main(argv=None) -> int:
    return run_alone(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
