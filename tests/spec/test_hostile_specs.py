"""Hostile specs and output paths through the real CLI entry (builder.cli.main).

Every refusal is exit 2 (1 for a failed write) with exactly one line on stderr naming
the field, no traceback, no secret, and nothing changed or left behind in the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.render import output_dir
from builder.render.validate import parse_config
from tests.helpers import hostile_specs as hs

ROOT = Path(__file__).resolve().parents[2]


def base_spec(model: Path, **router) -> dict:
    return {
        "name": "hostile",
        "hardware": {"gpu": "cpu"},
        "models": [
            {
                "name": "primary",
                "engine": "vllm",
                "model": str(model),
                "family": "llama",
                "engine_args": {"max_model_len": 1024},
            }
        ],
        "router": {"default": ["primary"], **router},
    }


@pytest.fixture
def folder(tmp_path) -> Path:
    """tmp_path with a model folder (config.json, 8192 positions) and a user's data folder."""
    hs.prepare(tmp_path, hs.Case("unused", b""))
    (tmp_path / "spec.yaml").unlink()
    return tmp_path


def write_spec(folder: Path, data, name="spec.yaml") -> Path:
    path = folder / name
    path.write_bytes(
        data if isinstance(data, bytes) else yaml.safe_dump(data, allow_unicode=True).encode()
    )
    return path


def refuse(folder: Path, argv: list[str], code: int, field: str, secret: str = "") -> str:
    """Run argv; assert the refusal's properties; return the error line."""
    before = hs.snapshot(folder)
    got, stderr = hs.call_cli(argv)
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert got == code, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert field in lines[0], lines[0]
    assert not secret or secret not in stderr
    assert hs.snapshot(folder) == before, "files changed"
    leftovers = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert leftovers == [], leftovers
    return lines[0]


# ---------------------------------------------------------------------------------------
# Spec text: (name, spec bytes or a function of the model folder, field in the error)


def _spec_text(model: Path, **changes) -> bytes:
    data = base_spec(model)
    for dotted, value in changes.items():
        target = data
        *parents, last = dotted.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        target[last] = value
    return yaml.safe_dump(data, allow_unicode=True).encode()


BOMB = b"".join(
    b"l%d: &l%d [" % (i, i) + b", ".join([b"*l%d" % (i - 1)] * 9) + b"]\n" for i in range(1, 12)
)
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"

SPEC_CASES = [
    ("latin-1", lambda m: "name: caf\xe9\n".encode("latin-1"), "UTF-8"),
    ("utf-16 bom", lambda m: _spec_text(m).decode().encode("utf-16"), "UTF-16"),
    ("random bytes", lambda m: bytes(range(128, 256)) * 3, "UTF-8"),
    ("non-string key", lambda m: _spec_text(m) + b"1: one\nzz: two\n", "key '1'"),
    ("50000 nested lists", lambda m: b"name: " + b"[" * 50000 + b"]" * 50000, "nested"),
    (
        "alias bomb",
        lambda m: (
            b"l0: &l0 [x]\n"
            + BOMB
            + _spec_text(m).replace(
                b"max_model_len", b"speculative_config: {method: *l11}\n    max_model_len", 1
            )
        ),
        "aliases",
    ),
    ("duplicate key", lambda m: _spec_text(m) + b"name: twice\n", "duplicate key 'name'"),
    ("name with newline", lambda m: _spec_text(m, models__0__name="primary\n"), "models[0].name"),
    (
        "max_model_len past positions",
        lambda m: _spec_text(m, models__0__engine_args={"max_model_len": 10**12}),
        "max_model_len",
    ),
    (
        "zero kv_cache_memory_bytes",
        lambda m: _spec_text(m, models__0__engine_args={"kv_cache_memory_bytes": 0}),
        "kv_cache_memory_bytes: must be >= 1",
    ),
    (
        "negative cpu_offload_gb",
        lambda m: _spec_text(m, models__0__engine_args={"cpu_offload_gb": -1}),
        "cpu_offload_gb",
    ),
    (
        "negative max_logprobs",
        lambda m: _spec_text(m, models__0__engine_args={"max_logprobs": -1}),
        "max_logprobs",
    ),
    ("nan deadline", lambda m: _spec_text(m, router__deadline_s=float("nan")), "deadline_s"),
    (
        "inf first token",
        lambda m: _spec_text(m, router__first_token_timeout_s=float("inf")),
        "first_token_timeout_s",
    ),
    (
        "nan breaker window",
        lambda m: _spec_text(m, router__breaker={"window_s": float("nan")}),
        "breaker.window_s",
    ),
    (
        "speculative foo",
        lambda m: _spec_text(m, models__0__engine_args={"speculative_config": {"foo": "bar"}}),
        "speculative_config.foo",
    ),
    (
        "rule never matches (turns)",
        lambda m: _spec_text(
            m,
            router__rules=[
                {"name": "r", "match": {"min_turns": 5, "max_turns": 1}, "backends": ["primary"]}
            ],
        ),
        "min_turns",
    ),
    (
        "rule never matches (tokens)",
        lambda m: _spec_text(
            m,
            router__rules=[
                {
                    "name": "r",
                    "match": {"min_prompt_tokens": 9, "max_prompt_tokens": 1},
                    "backends": ["primary"],
                }
            ],
        ),
        "min_prompt_tokens",
    ),
    (
        "secret in s3 uri",
        lambda m: _spec_text(m, engine_cache={"s3": f"s3://AKIA:{SECRET}@bucket/engines"}),
        "engine_cache.s3",
    ),
    (
        "secret in endpoint",
        lambda m: _spec_text(
            m, engine_cache={"endpoint_url": f"http://AKIA:{SECRET}@s3.local:8333"}
        ),
        "AWS_ACCESS_KEY_ID",
    ),
    # Issue 34: each of these rendered with exit 0.
    (
        "bogus dtype",
        lambda m: _spec_text(m, models__0__engine_args={"dtype": "float8_bogus"}),
        "models[0].engine_args.dtype: 'float8_bogus' is not one of",
    ),
    ("model /etc", lambda m: _spec_text(m, models__0__model="/etc"), "without config.json"),
    (
        "model file url",
        lambda m: _spec_text(m, models__0__model="file:///etc/passwd"),
        "models[0].model: file:// is not a place",
    ),
    ("model ~root", lambda m: _spec_text(m, models__0__model="~root"), "models[0].model"),
    (
        "unknown builtin",
        lambda m: _spec_text(m, models__0__model="builtin:nope"),
        "models[0].model: unknown builtin model 'nope'",
    ),
    (
        "gpu placement on cpu",
        lambda m: _spec_text(m, models__0__placement={"kind": "gpu"}),
        "models[0].placement.kind: is gpu, but hardware.gpu is cpu",
    ),
    (
        "a device the hardware lacks",
        lambda m: _spec_text(m, models__0__placement={"devices": [3]}),
        "models[0].placement.devices: GPU 3 does not exist",
    ),
    (
        "null router name",
        lambda m: _spec_text(m, router__name=None),
        "router.name: must not be null",
    ),
]


@pytest.mark.parametrize("name,make,field", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_hostile_spec_is_one_line_exit_2(folder, name, make, field):
    spec = write_spec(folder, make(folder / "model"))
    refuse(
        folder, ["repo", "--spec", str(spec), "--out", str(folder / "out")], 2, field, secret=SECRET
    )
    assert not (folder / "out").exists()


@pytest.mark.parametrize("key,value", [("num_attention_heads", 0), ("num_hidden_layers", "1e999")])
def test_broken_model_config_names_file_and_key(folder, key, value):
    config = dict(hs.MODEL_CONFIG)
    (folder / "model" / "config.json").write_text(
        json.dumps(config).replace("}", f', "{key}": {value}}}')
    )
    spec = write_spec(folder, base_spec(folder / "model"))
    line = refuse(folder, ["repo", "--spec", str(spec), "--out", str(folder / "out")], 2, key)
    assert "config.json" in line


def test_context_length_is_only_checked_when_the_model_says(folder):
    """No max_position_embeddings in config.json: trident cannot know the limit, so a long
    max_model_len is left to the engine (the planner's 4096 is a guess, not a limit)."""
    config = {k: v for k, v in hs.MODEL_CONFIG.items() if k != "max_position_embeddings"}
    (folder / "model" / "config.json").write_text(json.dumps(config))
    data = base_spec(folder / "model")
    data["models"][0]["engine_args"]["max_model_len"] = 32768
    spec = write_spec(folder, data)
    got, stderr = hs.call_cli(["plan", "--spec", str(spec)])
    assert got == 0, stderr


# ---------------------------------------------------------------------------------------
# Output paths


@pytest.mark.parametrize(
    "out,field",
    [
        ("data", "not written by trident"),
        ("spec.yaml", "is the spec"),
        (".", "holds the spec"),
        ("..", "holds the spec"),
        ("data/notes.txt", "not a directory"),
    ],
)
def test_out_never_replaces_what_trident_did_not_write(folder, out, field):
    spec = write_spec(folder, base_spec(folder / "model"))
    refuse(folder, ["repo", "--spec", str(spec), "--out", str(folder / out)], 2, field)


def test_out_under_a_file_is_one_line_and_leaves_nothing(folder):
    """A write that fails (here: a parent that is a file; as root, chmod would not stop
    it) is one line, exit 1, no temp folder left."""
    spec = write_spec(folder, base_spec(folder / "model"))
    refuse(
        folder,
        ["repo", "--spec", str(spec), "--out", str(folder / "data/notes.txt/x/r")],
        1,
        "cannot write",
    )


def test_marked_repository_is_replaced_and_validates(folder):
    spec = write_spec(folder, base_spec(folder / "model"))
    argv = ["repo", "--spec", str(spec), "--out", str(folder / "out")]
    assert hs.call_cli(argv)[0] == 0
    marker = (folder / "out" / output_dir.MARKER).read_text()
    assert "spec-sha256: " in marker
    (folder / "out" / "stale.txt").write_text("from the last render")
    assert hs.call_cli(argv)[0] == 0  # ours: replaced
    assert not (folder / "out" / "stale.txt").exists()
    assert hs.call_cli(["validate", str(folder / "out")]) == (0, "")


def test_stale_temp_folders_of_dead_processes_are_removed(folder):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    stale = [folder / f".out.rendering-{dead}-abc", folder / f".out.old-{dead}-swap"]
    live = folder / f".out.rendering-{os.getppid()}-xyz"  # a live process: kept
    for path in stale + [live]:
        (path / "m").mkdir(parents=True)
    spec = write_spec(folder, base_spec(folder / "model"))
    assert hs.call_cli(["repo", "--spec", str(spec), "--out", str(folder / "out")])[0] == 0
    assert not any(p.exists() for p in stale) and live.exists()


def test_sigterm_during_render_cleans_up_like_ctrl_c(folder, monkeypatch):
    from builder import pipeline as repository

    def terminated(_repo):  # SIGTERM arrives while the files are being checked
        os.kill(os.getpid(), signal.SIGTERM)
        return []

    monkeypatch.setattr(repository, "validate_repository", terminated)
    spec = write_spec(folder, base_spec(folder / "model"))
    code, _ = hs.call_cli(["repo", "--spec", str(spec), "--out", str(folder / "out/deep")])
    assert code == 130
    assert sorted(p.name for p in folder.iterdir()) == ["data", "model", "spec.yaml"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_mig_plan_never_writes_over_the_spec(folder):
    spec = write_spec(folder, base_spec(folder / "model"))
    refuse(folder, ["mig", "plan", "--spec", str(spec), "--out", str(spec)], 2, "is the spec")


# ---------------------------------------------------------------------------------------
# Injection: spec strings land as data in every format


def test_spec_path_with_pbtxt_injects_nothing(folder):
    name = (
        'x.yaml\nparameters { key: "EXECUTION_ENV_PATH" value: { string_value: "venv.tar.gz" } }\n#'
    )
    spec = write_spec(folder, base_spec(folder / "model"), name=name)
    assert hs.call_cli(["repo", "--spec", str(spec), "--out", str(folder / "out")])[0] == 0
    configs = sorted((folder / "out").glob("*/config.pbtxt"))
    assert len(configs) == 2
    for path in configs:
        config = parse_config(path)
        assert "EXECUTION_ENV_PATH" not in config.parameters, path


def _strings(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def test_strings_round_trip_as_data(folder):
    odd = 'q"uote \\ {{ x }} {% y %} ${z}\n} parameters { key: "K" }\u202e\U0001f600'
    data = base_spec(
        folder / "model",
        rules=[{"name": odd, "match": {"family": odd, "tenant": odd}, "backends": ["primary"]}],
    )
    data["models"][0]["family"] = odd
    data["models"][0]["engine_args"].update(
        {
            "tokenizer": odd,
            "served_model_name": odd,
            "speculative_config": {"method": "ngram", "model": odd, "prompt_lookup_max": 3},
        }
    )
    spec = write_spec(folder, data)
    assert hs.call_cli(["repo", "--spec", str(spec), "--out", str(folder / "out")])[0] == 0
    model_json = json.loads((folder / "out/primary/1/model.json").read_text())
    for key in ("tokenizer", "served_model_name", "speculative_config"):
        assert model_json[key] == data["models"][0]["engine_args"][key]
    router_json = (folder / "out/router/1/router.json").read_text()
    assert odd in set(_strings(json.loads(router_json)))
    assert "{{" not in router_json and "${" not in router_json
    for path in (folder / "out").glob("*/config.pbtxt"):
        assert not parse_config(path).parameters.get("K")
    assert hs.call_cli(["validate", str(folder / "out")]) == (0, "")


# ---------------------------------------------------------------------------------------
# A few through a real process, and the generated cases


@pytest.mark.parametrize("spec", ["/dev/zero", "/dev/null/x", "/"])
def test_cli_process_reads_specs_with_a_cap(folder, spec):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder.cli.main",
            "repo",
            "--spec",
            spec,
            "--out",
            str(folder / "out"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (folder / "out").exists()


def test_generated_hostile_specs(tmp_path):
    cases = hs.generate(seed=0)
    outcomes = [hs.run_case(tmp_path / f"case{i}", case) for i, case in enumerate(cases)]
    bad = [
        f"{o.kind}: {o.case.name!r}: {o.stderr.strip()[-200:]}"
        for o in outcomes
        if o.kind != "clean"
    ]
    assert len(cases) >= 60
    assert sum(c.valid for c in cases) >= 5
    assert bad == []
