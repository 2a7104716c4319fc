"""Hostile specs, generated: deterministic (seeded) mutations of the deploy/ specs.

Each Case is a spec file's bytes plus what trident must do with it: render (valid=True)
or refuse with one line naming `field`. `run_case` drives the real CLI entry
(builder.cli.main) and classifies the outcome; `python tests/helpers/hostile_specs.py` prints the
counts (tried, clean errors, tracebacks, silent accepts, data lost, messy errors), and
runs against whatever `builder` is first on PYTHONPATH, e.g. an older worktree.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import random
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASES = ("deploy/default.yaml", "deploy/examples/cpu-fallback.yaml")
MODEL_TOKEN = "@MODEL@"
CASE_TIMEOUT_S = 20
# A llama-shaped config.json: the specs point at this folder instead of builtins, so a
# render needs no model conversion.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
}
ODD_STRINGS = (
    'quote " and \\ backslash',
    "brace {{ x }} {% y %} ${z}",
    'new\nline } parameters { key: "EXECUTION_ENV_PATH" }',
    "rtl \u202e bidi \u200b zero-width",
    "emoji \U0001f600 and ümlaut",
    "tab\tand\rreturn",
)
BAD_NAMES = (
    "1starts-with-digit",
    "has space",
    "trailing-newline\n",
    "../escape",
    "a/b",
    "",
    "x" * 65,
    "ümlaut",
    "semi;colon",
    'quo"te',
)


@dataclass(frozen=True)
class Case:
    name: str
    text: bytes
    valid: bool = False
    field: str | None = None  # a word the one error line must contain
    out: str = "out"  # --out, relative to the case folder ("@SPEC@": the spec)


# ---------------------------------------------------------------------------------------
# Generation


def _base_data(path: str) -> dict:
    data = yaml.safe_load((ROOT / path).read_text())
    for model in data["models"]:
        model["model"] = MODEL_TOKEN
    return data


def _dump(data: Any) -> bytes:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode()


def _leaves(data: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every scalar and list in data (lists count as leaves too)."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _leaves(v, path + (k,))]
    if isinstance(data, list):
        return [path] + [p for i, v in enumerate(data) for p in _leaves(v, path + (i,))]
    return [path]


def _mappings(data: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [path] + [p for k, v in data.items() for p in _mappings(v, path + (k,))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _mappings(v, path + (i,))]
    return []


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _set(data: Any, path: tuple, value: Any) -> dict:
    data = copy.deepcopy(data)
    _get(data, path[:-1])[path[-1]] = value
    return data


def _key(path: tuple) -> str | None:
    """The last named key of a path: the word the error must mention."""
    names = [p for p in path if isinstance(p, str)]
    return names[-1] if names else None


def _label(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return 7
    if isinstance(value, (int, float)):
        return "seven"
    if isinstance(value, str):
        return [value]
    return "not-a-list"


def _typed_cases(base: str, data: dict, rng: random.Random) -> list[Case]:
    cases = []
    leaves = [p for p in _leaves(data) if _get(data, p) != MODEL_TOKEN and p]
    for path in rng.sample(leaves, min(8, len(leaves))):
        value = _get(data, path)
        cases.append(
            Case(
                f"{base}: wrong type at {_label(path)}",
                _dump(_set(data, path, _wrong_type(value))),
                field=_key(path),
            )
        )
    numbers = [
        p for p in leaves if isinstance(_get(data, p), int) and not isinstance(_get(data, p), bool)
    ]
    for path in rng.sample(numbers, min(5, len(numbers))):
        for label, value in (("huge", 10**30), ("negative", -5)):
            cases.append(
                Case(
                    f"{base}: {label} number at {_label(path)}",
                    _dump(_set(data, path, value)),
                    field=_key(path),
                )
            )
    return cases


def _float_cases(base: str, data: dict) -> list[Case]:
    cases = []
    targets = [
        ("router", "deadline_s"),
        ("router", "first_token_timeout_s"),
        ("router", "breaker", "window_s"),
        ("router", "breaker", "cooldown_s"),
        ("models", 0, "engine_args", "cpu_offload_gb"),
    ]
    for path, value in zip(
        targets,
        (float("nan"), float("inf"), float("nan"), float("-inf"), float("nan")),
        strict=True,
    ):
        mutated = copy.deepcopy(data)
        parent = mutated
        for part in path[:-1]:
            parent = parent.setdefault(part, {}) if isinstance(part, str) else parent[part]
        parent[path[-1]] = value
        cases.append(Case(f"{base}: {value} at {_label(path)}", _dump(mutated), field=path[-1]))
    return cases


def _name_cases(base: str, data: dict, rng: random.Random) -> list[Case]:
    cases = []
    for name in rng.sample(BAD_NAMES, 5):
        cases.append(
            Case(
                f"{base}: model name {name!r}",
                _dump(_set(data, ("models", 0, "name"), name)),
                field="name",
            )
        )
    cases.append(
        Case(
            f"{base}: router name {BAD_NAMES[2]!r}",
            _dump(_set(data, ("router", "name"), BAD_NAMES[2])),
            field="name",
        )
    )
    return cases


def _unknown_key_cases(base: str, data: dict, rng: random.Random) -> list[Case]:
    cases = []
    for path in rng.sample(_mappings(data), min(5, len(_mappings(data)))):
        mutated = copy.deepcopy(data)
        _get(mutated, path)["surprise_key"] = 1
        cases.append(
            Case(
                f"{base}: unknown key under {_label(path) or 'top'}",
                _dump(mutated),
                field="surprise_key",
            )
        )
    return cases


def _odd_unicode_cases(base: str, data: dict) -> list[Case]:
    """Free-form strings: valid, and they must come out as data."""
    cases = []
    for i, text in enumerate(ODD_STRINGS):
        mutated = _set(data, ("models", 0, "family"), text)
        mutated["models"][0]["engine_args"]["served_model_name"] = text
        if i % 2 and mutated.get("router"):
            mutated["router"]["rules"] = [
                {
                    "name": text,
                    "match": {"family": text},
                    "backends": [mutated["models"][0]["name"]],
                }
            ]
        cases.append(Case(f"{base}: odd string #{i}", _dump(mutated), valid=True))
    return cases


def _text_cases(base: str, data: dict) -> list[Case]:
    text = _dump(data)
    nest = b"[" * 50000 + b"]" * 50000
    bomb = b"".join(
        b"l%d: &l%d [" % (i, i) + b", ".join([b"*l%d" % (i - 1)] * 9) + b"]\n" for i in range(1, 12)
    )
    return [
        Case(f"{base}: duplicate key", text + b"name: again\n", field="name"),
        Case(
            f"{base}: latin-1 byte",
            text.replace(b"models:", b"# caf\xe9\nmodels:", 1),
            field="UTF-8",
        ),
        Case(f"{base}: UTF-16 with BOM", text.decode().encode("utf-16"), field="UTF-16"),
        Case(f"{base}: random bytes", random.Random(1).randbytes(300), field=None),
        Case(f"{base}: non-string key", text + b"1: one\nzz: two\n", field="key"),
        Case(
            f"{base}: 50000 nested lists", text.replace(b"seed: 0", b"seed: " + nest, 1), field=None
        ),
        Case(
            f"{base}: alias bomb in speculative_config",
            b"l0: &l0 [x]\n"
            + bomb
            + text.replace(
                b"  engine_args:\n", b"  engine_args:\n    speculative_config: {method: *l11}\n", 1
            ),
            field="alias",
        ),
    ]


def _valid_cases(base: str, data: dict) -> list[Case]:
    smaller = copy.deepcopy(data)
    smaller["models"][0]["engine_args"]["max_model_len"] = 512
    return [
        Case(f"{base}: as written", _dump(data), valid=True),
        Case(f"{base}: max_model_len 512", _dump(smaller), valid=True),
    ]


def _semantic_cases(base: str, data: dict) -> list[Case]:
    args = ("models", 0, "engine_args")
    cases = [
        Case(
            f"{base}: max_model_len 10**12",
            _dump(_set(data, args + ("max_model_len",), 10**12)),
            field="max_model_len",
        ),
        Case(
            f"{base}: speculative_config foo",
            _dump(_set(data, args + ("speculative_config",), {"foo": "bar"})),
            field="foo",
        ),
        Case(
            f"{base}: credentials in endpoint_url",
            _dump({**data, "engine_cache": {"endpoint_url": "http://AKIAKEY:s3cr3t@h:1"}}),
            field="endpoint_url",
        ),
    ]
    if data.get("router"):
        rule = {
            "name": "never",
            "match": {"min_turns": 5, "max_turns": 1},
            "backends": [data["models"][0]["name"]],
        }
        cases.append(
            Case(
                f"{base}: rule that never matches",
                _dump(_set(data, ("router", "rules"), [rule])),
                field="min_turns",
            )
        )
    return cases


def _out_cases(data: dict) -> list[Case]:
    text = _dump(data)
    return [
        Case("out is the spec", text, field="spec", out="@SPEC@"),
        Case("out holds the spec", text, field="spec", out="."),
        Case("out is a user folder", text, field="trident", out="data"),
        Case("out is a file", text, field="directory", out="data/notes.txt"),
    ]


def generate(seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    cases: list[Case] = []
    for base in BASES:
        data = _base_data(base)
        name = Path(base).stem
        for make in (_typed_cases, _name_cases, _unknown_key_cases):
            cases += make(name, data, rng)
        for make in (_float_cases, _odd_unicode_cases, _text_cases, _valid_cases, _semantic_cases):
            cases += make(name, data)
    return cases + _out_cases(_base_data(BASES[0]))


# ---------------------------------------------------------------------------------------
# Running


@dataclass
class Outcome:
    case: Case
    code: int | None
    stderr: str
    kind: str  # clean | traceback | silent-accept | data-lost | messy | rejected-valid


def prepare(folder: Path, case: Case) -> tuple[Path, Path]:
    """The case's folder: the spec, a model folder and a user's data folder."""
    model = folder / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    data = folder / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the user's own data\n")
    spec = folder / "spec.yaml"
    spec.write_bytes(case.text.replace(MODEL_TOKEN.encode(), str(model).encode()))
    out = spec if case.out == "@SPEC@" else folder / case.out
    return spec, out


def snapshot(folder: Path, skip: Path | None = None) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and (skip is None or skip not in p.parents)
    }


class _Timeout(BaseException):
    pass


def _on_alarm(_signum, _frame):
    raise _Timeout


def call_cli(argv: list[str]) -> tuple[int | None, str]:
    """builder.cli.main in this process: (exit code or None if it raised, stderr)."""
    from builder.cli import main as cli

    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except _Timeout:
        return None, err.getvalue() + f"Traceback: still running after {CASE_TIMEOUT_S} s"
    except BaseException:  # the point is to count them: any escape is a traceback
        return None, err.getvalue() + traceback.format_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


def run_case(folder: Path, case: Case) -> Outcome:
    spec, out = prepare(folder, case)
    fresh_out = case.out == "out"
    before = snapshot(folder)
    code, stderr = call_cli(["repo", "--spec", str(spec), "--out", str(out)])
    after = snapshot(folder, skip=out if fresh_out else None)
    left = {p.name for p in folder.iterdir()} - {"model", "data", "spec.yaml", "out"}
    return Outcome(case, code, stderr, _classify(case, code, stderr, before, after, left))


def _classify(case, code, stderr, before, after, leftovers) -> str:
    lines = stderr.strip().splitlines()
    if "Traceback" in stderr or code is None:
        return "traceback"
    if any(after.get(path) != digest for path, digest in before.items()) or leftovers:
        return "data-lost"
    if code == 0:
        return "clean" if case.valid else "silent-accept"
    if case.valid:
        return "rejected-valid"
    if len(lines) != 1 or (case.field and case.field not in lines[0]):
        return "messy"
    return "clean"


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    result = {"tried": len(outcomes)}
    for kind in ("clean", "traceback", "silent-accept", "data-lost", "messy", "rejected-valid"):
        result[kind] = sum(o.kind == kind for o in outcomes)
    return result


def main() -> int:
    import tempfile

    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(generate()):
            outcomes.append(run_case(Path(tmp) / f"case{i}", case))
    for o in outcomes:
        if o.kind != "clean":
            first = (o.stderr.strip().splitlines() or [""])[-1][:150]
            print(f"{o.kind:14} {o.case.name!r}: exit {o.code}: {first}", file=sys.stderr)
    print(json.dumps(counts(outcomes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
