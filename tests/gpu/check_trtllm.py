"""GPU check of the TRT-LLM path (driven by check_trtllm.sh; see docs/trtllm.md).

On a machine with TensorRT-LLM, its tensorrtllm Triton backend and a GPU: build a tiny
engine through `trident engines build` (miss → build → publish to a real S3 server),
fetch it on a clean local cache (no build), render the repository with `trident repo`,
serve it with tritonserver and stream an answer through the router. Prints each phase's
time; exits non-zero on the first failure.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from builder.engines import assets  # noqa: E402
from builder.serve.client import stream_generate  # noqa: E402
from builder.serve.server import Ports, TritonServer, free_port  # noqa: E402
from support.s3_server import SeaweedS3  # noqa: E402


def phase(name, started):
    print(f"[check_trtllm] {name}: {time.monotonic() - started:.1f} s", flush=True)


def trident(*args, env):
    command = [sys.executable, "-m", "builder.cli.main", *map(str, args)]
    print("[check_trtllm] $ trident " + " ".join(map(str, args)), flush=True)
    result = subprocess.run(command, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE)
    print(result.stdout, end="", flush=True)
    if result.returncode != 0:
        sys.exit(f"[check_trtllm] FAILED: trident {args[0]} {args[1]} exited {result.returncode}")
    return result.stdout


def write_spec(work: Path, model_dir: Path, s3_uri: str, local: str) -> Path:
    spec = {
        # No GPU type: the target SM comes from nvidia-smi, and without a placement the
        # tensorrtllm backend runs its single rank on GPU 0.
        "name": "gpu-check",
        "hardware": {"gpu": "cpu"},
        "engine_cache": {"local_dir": local, "s3": s3_uri},
        "models": [
            {
                "name": "tiny",
                "engine": "tensorrt_llm",
                "family": "llama",
                "checkpoint": {"hf_model": str(model_dir), "family": "llama"},
                "build": {"dtype": "fp16"},
                "profiles": {
                    "check": {
                        "max_batch_size": 4,
                        "max_input_len": 128,
                        "max_seq_len": 256,
                        "max_num_tokens": 512,
                        "plugins": {"paged_context_fmha": True},
                    }
                },
                "engine_args": {
                    "kv_cache_free_gpu_mem_fraction": 0.2,
                    "enable_kv_cache_reuse": True,
                },
            }
        ],
        "router": {"default": ["tiny"]},
    }
    path = work / f"spec-{local}.json"  # JSON is YAML
    path.write_text(json.dumps(spec, indent=2))
    return path


def main() -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trident-gpu-check-"))
    model_dir = assets.ensure("tiny-llama")
    phase("tiny llama ready", started)
    with SeaweedS3(work / "s3") as s3:
        s3.client().create_bucket(Bucket="engines")
        env = {**os.environ, **s3.env}
        spec_a = write_spec(work, model_dir, "s3://engines/check", "machine-a")
        out = trident("engines", "build", "--spec", spec_a, env=env)
        if "built " not in out:
            sys.exit("[check_trtllm] FAILED: the first build did not build")
        phase("built and published", started)
        spec_b = write_spec(work, model_dir, "s3://engines/check", "machine-b")
        out = trident("engines", "build", "--spec", spec_b, env=env)
        if "fetched " not in out:
            sys.exit("[check_trtllm] FAILED: a clean cache did not fetch from S3")
        phase("fetched on a clean cache", started)
        spec_c = write_spec(work, model_dir, "s3://engines/check", "machine-c")
        trident("repo", "--spec", spec_c, "--out", work / "repo", env=env)
        trident("validate", work / "repo", env=env)
        phase("repository rendered", started)
    server = TritonServer(
        work / "repo",
        Ports(free_port(), free_port(), free_port()),
        log_path=work / "tritonserver.log",
    )
    server.start()
    try:
        server.wait_ready(300)
        phase("tritonserver ready", started)
        result = stream_generate(
            server.grpc_url, "router", "The capital of France is", max_tokens=16, chat=False
        )
        print(
            f"[check_trtllm] answer: {result.text!r} ({result.chunks} chunks, "
            f"served_by={result.served_by})",
            flush=True,
        )
        if not result.text or result.served_by != "tiny":
            sys.exit("[check_trtllm] FAILED: no streamed answer from the TRT-LLM model")
    finally:
        server.stop()
    phase("PASSED in total", started)


if __name__ == "__main__":
    main()
