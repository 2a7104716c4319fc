"""The deployment spec: every defect is one line naming file, field path and reason,
exit status 2, and no output directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.cli.main import main
from builder.spec import SpecError, load_spec, parse_spec

GOOD = {
    "models": [
        {"name": "a", "engine": "vllm", "model": "/models/a"},
        {"name": "b", "engine": "sglang", "model": "/models/b"},
        {"name": "c", "engine": "vllm", "model": "/models/c"},
    ],
    "router": {"default": ["a"]},
}


def with_change(path: str, value) -> dict:
    """GOOD with one field replaced (path like 'models.2.engine')."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return data


BAD_SPECS = [
    # (id, spec data or raw YAML text, field path in the message, reason fragment)
    (
        "unknown engine",
        with_change("models.2.engine", "vlm"),
        "models[2].engine",
        "'vlm' is not one of tensorrt_llm, vllm, sglang",
    ),
    (
        "wrong type",
        with_change("models.0.instances", "two"),
        "models[0].instances",
        "expected an integer, got a string",
    ),
    (
        "bool for int",
        with_change("models.0.instances", True),
        "models[0].instances",
        "got a boolean",
    ),
    (
        "duplicate names",
        with_change("models.1.name", "a"),
        "models[1].name",
        "already used by models[0]",
    ),
    (
        "slash in name",
        with_change("models.0.name", "a/b"),
        "models[0].name",
        "not a safe model name",
    ),
    ("dotdot name", with_change("models.0.name", ".."), "models[0].name", "not a safe model name"),
    (
        "space in name",
        with_change("models.0.name", "a b"),
        "models[0].name",
        "not a safe model name",
    ),
    ("unknown key", with_change("models.0.color", "red"), "models[0].color", "unknown key"),
    ("unknown top key", with_change("servers", {}), "servers", "unknown key"),
    (
        "unknown engine arg",
        with_change("models.0.engine_args", {"max_num_seq": 4}),
        "models[0].engine_args.max_num_seq",
        "unknown vllm engine argument",
    ),
    (
        "engine arg type",
        with_change("models.0.engine_args", {"block_size": "big"}),
        "models[0].engine_args.block_size",
        "expected int",
    ),
    (
        "stream interval",
        with_change("models.0.engine_args", {"stream_interval": 0}),
        "models[0].engine_args.stream_interval",
        "must be >= 1",
    ),
    (
        "fraction range",
        with_change("models.0.engine_args", {"gpu_memory_utilization": 1.5}),
        "models[0].engine_args.gpu_memory_utilization",
        "must be in (0, 1]",
    ),
    (
        "router to unknown model",
        with_change("router.default", ["zz"]),
        "router.default[0]",
        "'zz' is not a model",
    ),
    ("missing models", {"router": {}}, "models", "must list at least one model"),
    ("empty models", {"models": []}, "models", "must list at least one model"),
    ("missing engine", with_change("models.0", {"name": "a"}), "models[0].engine", "is required"),
    (
        "same ports",
        with_change("server", {"http_port": 9000, "grpc_port": 9000}),
        "server",
        "must differ",
    ),
    (
        "port range",
        with_change("server", {"http_port": 70000}),
        "server.http_port",
        "must be <= 65535",
    ),
    (
        "unknown gpu",
        with_change("hardware", {"gpu": "H900"}),
        "hardware.gpu",
        "'H900' is not one of cpu",
    ),
    (
        "bad s3 uri",
        with_change("engine_cache", {"s3": "http://bucket"}),
        "engine_cache.s3",
        "not an s3://bucket",
    ),
    (
        "tp on cpu",
        with_change(
            "models.0",
            {
                "name": "a",
                "engine": "vllm",
                "model": "/m",
                "placement": {"kind": "cpu"},
                "engine_args": {"tensor_parallel_size": 2},
            },
        ),
        "models[0].placement.kind",
        "cannot run on cpu",
    ),
    ("broken yaml", "models: [\n  - name: a\n   engine: vllm", "", "invalid YAML"),
    ("not a mapping", "- just\n- a list\n", "", "expected a mapping"),
]


def write_spec(tmp_path: Path, content) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.mark.parametrize("case", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_exits_2_naming_field(case, tmp_path, capsys):
    _, content, field, reason = case
    spec = write_spec(tmp_path, content)
    out = tmp_path / "repo"
    code = main(["repo", "--spec", str(spec), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"error: {spec}: {field}: " if field else f"error: {spec}: ")
    assert reason in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [spec]  # no temp directories left either


def test_missing_file_exits_2(tmp_path, capsys):
    code = main(["repo", "--spec", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "r")])
    assert code == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_cli_process_exit_status_and_no_traceback(tmp_path):
    spec = write_spec(tmp_path, with_change("models.2.engine", "vlm"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder.cli.main",
            "repo",
            "--spec",
            str(spec),
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: {spec}: models[2].engine: 'vlm' is not one of tensorrt_llm, vllm, sglang"
    )


def test_spec_objects_are_frozen():
    spec = parse_spec(with_change("models.0.engine_args", {"max_num_seqs": 4}))
    with pytest.raises(AttributeError):
        spec.models[0].name = "x"
    with pytest.raises(TypeError):
        spec.models[0].engine_args["max_num_seqs"] = 8


def test_defaults_and_router():
    spec = parse_spec(GOOD, "g.yaml")
    assert [m.name for m in spec.models] == ["a", "b", "c"]
    assert spec.server.http_port == 8000 and spec.hardware.gpu == "cpu"
    assert spec.router.name == "router" and spec.router.default == ("a",)
    assert spec.router.breaker.error_rate == 0.05 and spec.router.breaker.window_s == 30.0


def test_router_name_must_not_clash_with_a_model():
    with pytest.raises(SpecError, match="router.name: 'a' is also a model name"):
        parse_spec(with_change("router.name", "a"))


def test_shipped_specs_load(root):
    for path in sorted((root / "deploy").rglob("*.yaml")):
        load_spec(path)


# ---------------------------------------------------------------------------------------
# Speculative decoding, as each engine spells it (the router's short-prompt bypass)


def _trtllm(name: str, speculative_served: bool) -> dict:
    medusa = {"mode": "medusa", "max_draft_len": 4, "heads_model": "/m/heads", "num_heads": 4}
    profiles = {
        "plain": {
            "max_batch_size": 8,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_num_tokens": 4096,
            "serve": not speculative_served,
        },
        "medusa": {
            "max_batch_size": 8,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_num_tokens": 4096,
            "speculative": medusa,
            "serve": speculative_served,
        },
    }
    return {
        "name": name,
        "engine": "tensorrt_llm",
        "family": "llama",
        "checkpoint": {"hf_model": "/m/llama", "family": "llama"},
        "profiles": profiles,
    }


SPECULATIVE = {
    "models": [
        {"name": "plain", "engine": "vllm", "model": "/m/a", "family": "llama"},
        {
            "name": "vllm-spec",
            "engine": "vllm",
            "model": "/m/a",
            "family": "llama",
            "engine_args": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        },
        {
            "name": "sglang-spec",
            "engine": "sglang",
            "model": "/m/a",
            "family": "llama",
            "engine_args": {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3},
        },
        {"name": "sglang-plain", "engine": "sglang", "model": "/m/a", "family": "llama"},
        _trtllm("trtllm-spec", speculative_served=True),
        _trtllm("trtllm-plain", speculative_served=False),  # a medusa profile, not served
    ],
    "router": {"default": ["vllm-spec", "sglang-spec", "trtllm-spec", "plain"]},
}


def test_each_engine_marks_speculative_decoding_by_its_own_switch():
    spec = parse_spec(SPECULATIVE, "s.yaml")
    assert {m.name: m.speculative for m in spec.models} == {
        "plain": False,
        "vllm-spec": True,
        "sglang-spec": True,
        "sglang-plain": False,
        "trtllm-spec": True,
        "trtllm-plain": False,
    }


def test_short_prompts_skip_the_speculative_backends_of_every_engine():
    from bls.policy import Policy, RequestFeatures
    from builder.render.router_json import router_config

    policy = Policy(router_config(parse_spec(SPECULATIVE, "s.yaml")))
    assert policy.candidates(RequestFeatures(prompt_tokens=1))[1] == ["plain"]
    assert policy.candidates(RequestFeatures(prompt_tokens=10_000))[1] == [
        "vllm-spec",
        "sglang-spec",
        "trtllm-spec",
        "plain",
    ]
