"""`trident engines` / `trident cache` / `trident repo` with TRT-LLM models, end to end:
the real CLI in subprocesses, the stand-in compiler (tests/fakes) and a real S3 server
(SeaweedFS). Each compiler run is counted through $FAKE_TRTLLM_CALLS."""

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from builder.render.validate import parse_config, validate_repository
from builder.serve.server import free_port

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
TRIDENT = [sys.executable, "-m", "builder.cli.main"]
PROFILES = {
    "short-context": {
        "max_batch_size": 16,
        "max_input_len": 512,
        "max_seq_len": 1024,
        "max_num_tokens": 2048,
        "plugins": {"paged_context_fmha": True},
    },
    "long-context": {
        "max_batch_size": 2,
        "max_input_len": 4096,
        "max_seq_len": 8192,
        "max_num_tokens": 4096,
    },
}


def make_hf_model(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "model.safetensors").write_bytes(random.Random(seed).randbytes(4096))
    return folder


def write_spec(tmp: Path, profiles=None, build=None, cache=None, name="spec.yaml") -> Path:
    model = {
        "name": "tiny",
        "engine": "tensorrt_llm",
        "family": "llama",
        "checkpoint": {"hf_model": "hf", "family": "llama"},
        "build": build or {"dtype": "fp16", "tp_size": 2},
        "profiles": profiles or PROFILES,
        "engine_args": {"enable_kv_cache_reuse": True},
    }
    data = {
        "name": "t",
        "models": [model],
        "router": {"default": ["tiny"]},
        "engine_cache": cache or {"local_dir": "cache"},
    }
    make_hf_model(tmp / "hf")
    path = tmp / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def env(tmp_path):
    """The variables each trident run adds to the environment of the moment (which holds
    the S3 server's endpoint and credentials once the s3_bucket fixture set them)."""
    values = {}
    values.update(
        {
            "TRIDENT_TRTLLM_BUILD": f"{sys.executable} {FAKES / 'fake_trtllm_build.py'}",
            "TRIDENT_TRTLLM_CONVERT": f"{sys.executable} {FAKES / 'fake_convert_checkpoint.py'}",
            "TRIDENT_TRTLLM_QUANTIZE": f"{sys.executable} {FAKES / 'fake_convert_checkpoint.py'}",
            "TRIDENT_TRTLLM_VERSION": "0.16.0",
            "TRIDENT_TENSORRT_VERSION": "10.7.0",
            "TRIDENT_TARGET_SM": "90",
            "FAKE_TRTLLM_CALLS": str(tmp_path / "calls.jsonl"),
            "PYTHONPATH": str(ROOT),
        }
    )
    return values


def trident(env, *args, check=True, cwd=ROOT) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [*TRIDENT, *map(str, args)],
        env={**os.environ, **env},
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"trident {args} exited {result.returncode}:\n{result.stderr}")
    return result


def compiler_calls(env) -> list[str]:
    """Names of the tools that ran (convert / build), in order."""
    path = Path(env["FAKE_TRTLLM_CALLS"])
    if not path.exists():
        return []
    return [
        "build" if "--checkpoint_dir" in json.loads(line)["argv"] else "convert"
        for line in path.read_text().splitlines()
    ]


def test_build_twice_second_run_builds_nothing(tmp_path, env):
    spec = write_spec(tmp_path)
    first = trident(env, "engines", "build", "--spec", spec)
    assert compiler_calls(env) == ["convert", "build"] * 2
    assert first.stdout.count("built ") == 2
    assert "==> tiny/short-context [1/2] convert:" in first.stderr  # live progress
    assert "| [TRT-LLM] [I] Engine for rank 1 written" in first.stderr
    second = trident(env, "engines", "build", "--spec", spec)
    assert compiler_calls(env) == ["convert", "build"] * 2  # nothing more ran
    assert second.stdout.count("skipped ") == 2
    engines = sorted((tmp_path / "cache").rglob("rank*.engine"))
    assert len(engines) == 4  # 2 profiles × TP2


def test_one_profile_and_unknown_profile(tmp_path, env):
    spec = write_spec(tmp_path)
    trident(env, "engines", "build", "--spec", spec, "--profile", "long-context")
    assert compiler_calls(env) == ["convert", "build"]
    bad = trident(env, "engines", "build", "--spec", spec, "--profile", "huge", check=False)
    assert bad.returncode == 2
    assert (
        "no tensorrt_llm model has a profile 'huge' (profiles: long-context, "
        "short-context)" in bad.stderr
    )


def test_missing_version_is_a_clear_error(tmp_path, env):
    spec = write_spec(tmp_path)
    del env["TRIDENT_TRTLLM_VERSION"]
    result = trident(env, "engines", "build", "--spec", spec, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: cannot determine the TensorRT-LLM version: "
        "install tensorrt_llm or set TRIDENT_TRTLLM_VERSION "
        "(e.g. 0.16.0)"
    )
    assert compiler_calls(env) == []


def test_changed_build_argument_or_checkpoint_builds_a_new_key(tmp_path, env):
    spec = write_spec(tmp_path)
    plan = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context")
    key = plan.stdout.split("key=")[1].split()[0]
    trident(env, "engines", "build", "--spec", spec, "--profile", "short-context")
    changed = dict(
        PROFILES, **{"short-context": dict(PROFILES["short-context"], max_batch_size=32)}
    )
    spec = write_spec(tmp_path, profiles=changed)
    result = trident(env, "engines", "build", "--spec", spec, "--profile", "short-context")
    assert "built " in result.stdout and key[:16] not in result.stdout
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"other weights")
    plan = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context")
    assert plan.stdout.split("key=")[1].split()[0] != key
    assert compiler_calls(env) == ["convert", "build"] * 2


def test_plan_prints_exact_command_lines(tmp_path, env):
    spec = write_spec(tmp_path, build={"dtype": "bf16", "quantization": "fp8", "tp_size": 2})
    out = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context").stdout
    assert "quantize: " in out and "--qformat fp8" in out and "--dtype bfloat16" in out
    assert "--use_paged_context_fmha enable" in out and "--output_dir '$ENGINE_DIR'" in out
    assert compiler_calls(env) == []


@pytest.mark.s3
def test_new_machine_fetches_from_s3_instead_of_building(tmp_path, env, s3_bucket):
    spec = write_spec(tmp_path)
    trident(
        env,
        "engines",
        "build",
        "--spec",
        spec,
        "--cache",
        s3_bucket.uri,
        "--local-cache",
        tmp_path / "machine-a",
    )
    assert compiler_calls(env).count("build") == 2
    result = trident(
        env,
        "engines",
        "build",
        "--spec",
        spec,
        "--cache",
        s3_bucket.uri,
        "--local-cache",
        tmp_path / "machine-b",
    )
    assert compiler_calls(env).count("build") == 2
    assert result.stdout.count("fetched ") == 2
    a = sorted(p.read_bytes() for p in (tmp_path / "machine-a").rglob("rank*.engine"))
    b = sorted(p.read_bytes() for p in (tmp_path / "machine-b").rglob("rank*.engine"))
    assert a == b and len(a) == 4


@pytest.mark.s3
def test_eight_concurrent_builds_of_one_key_run_the_compiler_once(tmp_path, env, s3_bucket):
    spec = write_spec(tmp_path, profiles={"short-context": PROFILES["short-context"]})
    env["FAKE_TRTLLM_SLEEP"] = "2"

    def one_machine(i):
        return trident(
            env,
            "engines",
            "build",
            "--spec",
            spec,
            "--cache",
            s3_bucket.uri,
            "--local-cache",
            tmp_path / f"ci-job-{i}",
            check=False,
        )

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one_machine, range(8)))
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results]
    assert compiler_calls(env) == ["convert", "build"]
    statuses = sorted(r.stdout.splitlines()[-1].split()[0] for r in results)
    assert statuses == ["built"] + ["fetched"] * 7


def test_concurrent_builds_on_one_machine_share_the_local_lock(tmp_path, env):
    spec = write_spec(tmp_path, profiles={"short-context": PROFILES["short-context"]})
    env["FAKE_TRTLLM_SLEEP"] = "1"
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda _: trident(env, "engines", "build", "--spec", spec, check=False), range(4)
            )
        )
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
    assert compiler_calls(env) == ["convert", "build"]
    statuses = sorted(r.stdout.splitlines()[-1].split()[0] for r in results)
    assert statuses == ["built"] + ["skipped"] * 3


@pytest.mark.s3
def test_converted_checkpoint_from_s3(tmp_path, env, s3_bucket):
    client = s3_bucket.client()
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "mapping": {"tp_size": 1, "pp_size": 1},
    }
    client.put_object(Bucket=s3_bucket.name, Key="ckpt/config.json", Body=json.dumps(config))
    client.put_object(Bucket=s3_bucket.name, Key="ckpt/rank0.safetensors", Body=b"w" * 100)
    spec = write_spec(tmp_path, build={"dtype": "fp16"})
    data = yaml.safe_load(spec.read_text())
    data["models"][0]["checkpoint"] = {"path": f"s3://{s3_bucket.name}/ckpt"}
    data["models"][0]["tokenizer"] = {"path": "hf"}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    trident(env, "engines", "build", "--spec", spec, "--profile", "short-context")
    assert compiler_calls(env) == ["build"]
    key = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context")
    client.put_object(Bucket=s3_bucket.name, Key="ckpt/rank0.safetensors", Body=b"v" * 100)
    again = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context")
    assert key.stdout.splitlines()[0] != again.stdout.splitlines()[0]


def test_s3_unreachable_is_a_clear_error_unless_local_only(tmp_path, env):
    dead = f"http://127.0.0.1:{free_port()}"
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",
        }
    )
    cache = {"local_dir": "cache", "s3": "s3://engines/ci", "endpoint_url": dead}
    spec = write_spec(tmp_path, cache=cache)
    result = trident(env, "engines", "build", "--spec", spec, check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "unreachable" in result.stderr
    assert dead in result.stderr and "Traceback" not in result.stderr
    assert compiler_calls(env) == []
    spec = write_spec(tmp_path, cache=dict(cache, local_only=True))
    trident(env, "engines", "build", "--spec", spec)
    assert compiler_calls(env).count("build") == 2


def test_prebuild_summary_and_exit_status(tmp_path, env):
    spec = write_spec(tmp_path)
    failing = dict(env, FAKE_TRTLLM_FAIL="out of GPU memory")
    result = trident(failing, "engines", "prebuild", "--spec", spec, check=False)
    assert result.returncode == 1
    assert "summary: 0 built, 0 fetched, 0 skipped, 2 failed of 2 engine(s)" in result.stdout
    assert "build exited with status 1" in result.stdout
    assert not list((tmp_path / "cache").rglob("rank*.engine"))  # nothing half-made
    result = trident(env, "engines", "prebuild", "--spec", spec)
    assert "summary: 2 built, 0 fetched, 0 skipped, 0 failed" in result.stdout
    result = trident(env, "engines", "prebuild", "--spec", spec)
    assert "summary: 0 built, 0 fetched, 2 skipped, 0 failed" in result.stdout


def test_cache_commands(tmp_path, env):
    spec = write_spec(tmp_path)
    trident(env, "engines", "build", "--spec", spec)
    listing = trident(env, "cache", "ls", "--spec", spec)
    assert listing.stdout.count("tiny/") == 2 and "2 entries" in listing.stderr
    entries = [
        json.loads(line)
        for line in trident(env, "cache", "ls", "--spec", spec, "--json").stdout.splitlines()
    ]
    assert {e["metadata"]["profile"] for e in entries} == {"short-context", "long-context"}
    assert json.loads(trident(env, "cache", "stats", "--spec", spec).stdout)
    assert trident(env, "cache", "verify", "--spec", spec).stdout.strip() == "OK"
    engine = next((tmp_path / "cache").rglob("rank0.engine"))
    engine.write_bytes(b"flipped" + engine.read_bytes()[7:])
    broken = trident(env, "cache", "verify", "--spec", spec, check=False)
    assert broken.returncode == 1 and "problem" in broken.stderr
    bad = trident(env, "cache", "gc", "--spec", spec, "--older-than", "soon", check=False)
    assert bad.returncode == 2 and "--older-than: 'soon' is not a duration" in bad.stderr
    trident(env, "cache", "gc", "--spec", spec, "--keep-last", "0")
    assert trident(env, "cache", "ls", "--spec", spec).stdout == ""


def test_repo_uses_the_cached_engine_and_validates(tmp_path, env):
    spec = write_spec(tmp_path)
    missing = trident(env, "repo", "--spec", spec, "--out", tmp_path / "repo", check=False)
    assert missing.returncode == 1
    assert "model tiny: no engine for profile 'short-context' (key " in missing.stderr
    assert (
        f"build it with: trident engines build --spec {spec} --profile short-context"
        in missing.stderr
    )
    assert not (tmp_path / "repo").exists()
    trident(env, "engines", "build", "--spec", spec, "--profile", "short-context")
    trident(env, "repo", "--spec", spec, "--out", tmp_path / "repo")
    assert validate_repository(tmp_path / "repo") == []
    assert trident(env, "validate", tmp_path / "repo").stdout.strip().endswith("OK")
    config = parse_config(tmp_path / "repo" / "tiny_tensorrt_llm" / "config.pbtxt")
    engine_dir = Path(config.parameters["gpt_model_path"].string_value)
    key = engine_dir.parent.name  # the cache's entry: <key>/files
    assert (
        f"(cache key {key})"
        in (tmp_path / "repo" / "tiny_tensorrt_llm" / "config.pbtxt").read_text()
    )
    assert key in trident(env, "engines", "plan", "--spec", spec).stdout
    assert sorted(p.name for p in engine_dir.glob("rank*.engine")) == [
        "rank0.engine",
        "rank1.engine",
    ]
    assert config.parameters["enable_kv_cache_reuse"].string_value == "true"
    assert config.parameters["executor_worker_path"].string_value  # TP2: orchestrator


@pytest.mark.s3
def test_repo_on_a_new_machine_fetches_the_engine_from_s3(tmp_path, env, s3_bucket):
    cache = {"local_dir": "machine-a", "s3": s3_bucket.uri}
    trident(env, "engines", "build", "--spec", write_spec(tmp_path, cache=cache))
    spec = write_spec(tmp_path, cache=dict(cache, local_dir="machine-b"), name="b.yaml")
    trident(env, "repo", "--spec", spec, "--out", tmp_path / "repo")
    config = parse_config(tmp_path / "repo" / "tiny_tensorrt_llm" / "config.pbtxt")
    assert str(tmp_path / "machine-b") in config.parameters["gpt_model_path"].string_value
    assert compiler_calls(env).count("build") == 2
