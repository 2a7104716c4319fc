"""`trident validate` catches each kind of defect in a hand-broken repository."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import validate_repository
from builder.render.write import write_repository
from builder.spec import parse_spec

SPEC = {
    "models": [{"name": "m", "engine": "vllm", "model": "/models/m"}],
    "router": {"default": ["m"]},
}


@pytest.fixture()
def repo(tmp_path) -> Path:
    out = tmp_path / "repo"
    spec = parse_spec(SPEC, "t.yaml")
    write_repository(
        render_files(RenderContext(spec, {}, {}, plan_for_spec(spec))), out, validate_repository
    )
    return out


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_rendered_repository_is_valid(repo, capsys):
    assert validate_repository(repo) == []
    assert main(["validate", str(repo)]) == 0
    assert "OK" in capsys.readouterr().out


DEFECTS = [
    (
        "not a ModelConfig",
        lambda r: edit(r / "m/config.pbtxt", "max_batch_size: 0", "max_batch_size: lots"),
        "not a valid ModelConfig",
    ),
    (
        "name mismatch",
        lambda r: edit(r / "m/config.pbtxt", 'name: "m"', 'name: "x"'),
        "does not match directory",
    ),
    (
        "dollar placeholder",
        lambda r: edit(
            r / "m/config.pbtxt",
            "max_batch_size: 0",
            "max_batch_size: 0\n# ${triton_max_batch_size}",
        ),
        "unfilled placeholder '${triton_max_batch_size}'",
    ),
    (
        "jinja leftover",
        lambda r: edit(r / "m/1/model.json", '"model"', '"{{ model }}"'),
        "unfilled placeholder '{{ model }}'",
    ),
    (
        "stream not decoupled",
        lambda r: edit(r / "m/config.pbtxt", "model_transaction_policy { decoupled: true }", ""),
        "has a 'stream' input but is not decoupled",
    ),
    ("missing model.py", lambda r: (r / "m/1/model.py").unlink(), "m/1: missing model.py"),
    ("missing version dir", lambda r: shutil.rmtree(r / "m/1"), "no version directory"),
    ("missing config", lambda r: (r / "m/config.pbtxt").unlink(), "missing config.pbtxt"),
    ("no outputs", lambda r: _drop_block(r / "m/config.pbtxt", "output ["), "declares no outputs"),
    # The router cannot load without its router.json (before: each of these said OK).
    (
        "router.json not JSON",
        lambda r: (r / "router/1/router.json").write_text("{not json"),
        "router/1/router.json: not JSON: line 1, column 2",
    ),
    (
        "router.json a list",
        lambda r: (r / "router/1/router.json").write_text("[]"),
        "router/1/router.json: expected a JSON object, got list",
    ),
    (
        "router.json missing",
        lambda r: (r / "router/1/router.json").unlink(),
        "router/1/router.json: missing (the router's model.py reads it",
    ),
    (
        "router.json key gone",
        lambda r: edit(r / "router/1/router.json", '"deadline_s"', '"deadline"'),
        "router/1/router.json: deadline_s: is missing",
    ),
    (
        "router.json unknown backend",
        lambda r: (r / "router/1/router.json").write_text(
            (r / "router/1/router.json").read_text().replace('"m"', '"gone"')
        ),
        "backend 'gone' is not a model of this repository",
    ),
    (
        "router.json names a backend it does not describe",
        lambda r: edit(
            r / "router/1/router.json", '"default": [\n    "m"', '"default": [\n    "x"'
        ),
        "router/1/router.json: default[0]: 'x' is not one of the backends (m)",
    ),
    (
        "router.json a pipe",
        lambda r: _pipe(r / "router/1/router.json"),
        "router/1/router.json: not a regular file",
    ),
]


def _pipe(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _drop_block(path: Path, start: str) -> None:
    text = path.read_text()
    begin = text.index(start)
    end = text.index("\n]\n", begin) + 3
    path.write_text(text[:begin] + text[end:])


@pytest.mark.parametrize("name,breaker,message", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_each_defect_is_reported(repo, name, breaker, message, capsys):
    breaker(repo)
    problems = validate_repository(repo)
    assert any(message in p for p in problems), problems
    assert main(["validate", str(repo)]) == 1
    assert message in capsys.readouterr().err


def test_missing_directory(tmp_path):
    assert validate_repository(tmp_path / "nope") == [f"{tmp_path / 'nope'}: not a directory"]
