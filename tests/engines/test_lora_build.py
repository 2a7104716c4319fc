"""LoRA on the TRT-LLM build side: trtllm-build's LoRA flags, the cache key, and the flags
reaching the (stand-in) compiler through `trident engines build`."""

import json
from pathlib import Path

import pytest
import yaml

from builder.engines.lora import LoraBuild, build_flags, key_args
from builder.engines.trtllm_build import Tools, build_step
from builder.spec.trtllm import BuildSettings, Profile
from support.lora import write_adapter, write_config
from tests.engines.test_jobs import compiler_calls, env, trident, write_spec  # noqa: F401

PROFILE = Profile("p", max_batch_size=8, max_input_len=256, max_seq_len=512, max_num_tokens=512)
LORA = LoraBuild("float16", ("/a/legal", "/a/support"), 16, ("attn_q", "attn_v"))


def test_build_command_ends_with_the_lora_flags():
    tools = Tools(build=("trtllm-build",), convert=None, quantize=None, examples=None)
    plain = build_step(PROFILE, BuildSettings(), tools, "/c", "/o").argv
    with_lora = build_step(PROFILE, BuildSettings(), tools, "/c", "/o", LORA).argv
    assert with_lora[: len(plain)] == plain
    assert with_lora[len(plain) :] == (
        "--lora_plugin",
        "float16",
        "--lora_dir",
        "/a/legal",
        "/a/support",
        "--lora_ckpt_source",
        "hf",
        "--max_lora_rank",
        "16",
        "--lora_target_modules",
        "attn_q",
        "attn_v",
    )
    assert build_flags(LORA) == list(with_lora[len(plain) :])


def test_key_args_hold_contents_not_paths():
    digests = {"/a/legal": "d1", "/a/support": "d2"}
    args = key_args(LORA, digests.__getitem__)
    assert args == {
        "plugin": "float16",
        "max_rank": 16,
        "target_modules": ["attn_q", "attn_v"],
        "adapters": ["d1", "d2"],
    }
    assert key_args(None, digests.__getitem__) is None


def lora_spec(tmp: Path, rank_limit=16, targets=("q_proj", "v_proj")) -> Path:
    path = write_spec(tmp, build={"dtype": "fp16", "tp_size": 1})
    data = yaml.safe_load(path.read_text())
    for name, seed in (("support", 1), ("legal", 2)):
        if not (tmp / "adapters" / name).exists():
            write_adapter(tmp / "adapters" / name, seed=seed, rank=8, targets=targets)
    data["models"][0].update(
        adapters={"support": "adapters/support", "legal": "adapters/legal"},
        lora={"max_lora_rank": rank_limit},
    )
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan_key(env, spec) -> str:  # noqa: F811 (env is the fixture)
    out = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context").stdout
    return out.split("key=")[1].split()[0]


def test_the_lora_flags_reach_the_build(tmp_path, env):  # noqa: F811
    spec = lora_spec(tmp_path, targets=("q_proj", "v_proj", "down_proj"))
    trident(env, "engines", "build", "--spec", spec, "--profile", "short-context")
    assert compiler_calls(env) == ["convert", "build"]
    argv = json.loads(Path(env["FAKE_TRTLLM_CALLS"]).read_text().splitlines()[-1])["argv"]
    config = json.loads(next((tmp_path / "cache").rglob("config.json")).read_text())
    built = config["build_config"]
    assert built["lora_plugin"] == "float16" and built["max_lora_rank"] == 16
    assert built["lora_target_modules"] == ["attn_q", "attn_v", "mlp_4h_to_h"]
    assert built["lora_dir"] == [str(tmp_path / "adapters" / n) for n in ("legal", "support")]
    assert argv.count("--lora_dir") == 1


def test_key_changes_with_an_adapter_or_the_rank_limit(tmp_path, env):  # noqa: F811
    spec = lora_spec(tmp_path)
    first = plan_key(env, spec)
    assert plan_key(env, spec) == first  # deterministic
    assert plan_key(env, lora_spec(tmp_path, rank_limit=32)) != first
    spec = lora_spec(tmp_path)
    assert plan_key(env, spec) == first
    write_adapter(tmp_path / "adapters" / "legal", seed=9, rank=8)  # new weights
    assert plan_key(env, spec) != first
    plain = write_spec(tmp_path / "plain", build={"dtype": "fp16", "tp_size": 1})
    assert plan_key(env, plain) != first  # no adapters: another engine


def test_an_adapter_above_the_rank_limit_fails_before_building(tmp_path, env):  # noqa: F811
    spec = lora_spec(tmp_path)
    write_config(tmp_path / "adapters" / "legal", rank=32)
    result = trident(env, "repo", "--spec", spec, "--out", tmp_path / "repo", check=False)
    assert result.returncode == 2
    assert (
        "models[0].adapters.legal: rank r=32 is larger than lora.max_lora_rank (16)"
        in result.stderr
    )


@pytest.mark.parametrize("targets, expected", [(("q_proj", "lm_head"), "lm_head")])
def test_a_module_trtllm_cannot_adapt_is_an_error(tmp_path, env, targets, expected):  # noqa: F811
    spec = lora_spec(tmp_path)
    write_config(tmp_path / "adapters" / "legal", targets=list(targets))
    result = trident(env, "engines", "plan", "--spec", spec, check=False)
    assert result.returncode == 2 and expected in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_prints_the_lora_flags(tmp_path, env):  # noqa: F811
    spec = lora_spec(tmp_path)
    out = trident(env, "engines", "plan", "--spec", spec, "--profile", "short-context").stdout
    assert "--lora_plugin float16" in out and "--max_lora_rank 16" in out
    assert compiler_calls(env) == []
