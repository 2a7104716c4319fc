""".ci/types_gate.py, the types gate's verdict on mypy's output: an error outside the
pending list fails, a pending file's errors are only counted, a pending file that now
passes fails (the ratchet), and a blocked run never passes. On made-up mypy output: the
gate itself runs mypy in CI (.ci/lint types), not here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("types_gate", ROOT / ".ci" / "types_gate.py")
assert _spec and _spec.loader
gate = importlib.util.module_from_spec(_spec)
sys.modules["types_gate"] = gate  # dataclasses look their module up while it loads
_spec.loader.exec_module(gate)

RUN = "### mypy run: builder\n"
OUTPUT = RUN + (
    "bls/model.py:12: error: Function is missing a type annotation  [no-untyped-def]\n"
    "bls/model.py:40:5: error: Returning Any  [no-any-return]\n"
    "bls/model.py:40:5: note: a note about it\n"
    "Found 2 errors in 1 file (checked 3 source files)\n"
)


def _judge(output, pending, existing=("bls/model.py", "bls/policy.py")):
    return gate.judge(output, pending, exists=lambda path: path in existing)


def test_errors_of_pending_files_are_counted_not_enforced():
    verdict = _judge(OUTPUT, ["bls/model.py"])
    assert verdict.passed and verdict.pending == {"bls/model.py": 2}
    assert "pending: 2 error(s) in 1 file(s)" in gate.report(verdict)


def test_an_error_outside_the_list_fails_with_its_lines():
    output = (
        OUTPUT + "builder/x.py:3: error: Incompatible types  [assignment]\n"
        "builder/x.py:3: note: See the docs\n"
    )
    verdict = _judge(output, ["bls/model.py"])
    assert not verdict.passed and verdict.failures == 1
    text = gate.report(verdict)
    assert "builder/x.py:3: error: Incompatible types" in text
    assert "builder/x.py:3: note: See the docs" in text and "1 enforced error(s)" in text


def test_a_note_alone_does_not_fail():
    verdict = _judge(RUN + "builder/x.py:1: note: By default the bodies ...\n", [])
    assert verdict.passed and verdict.enforced


def test_a_pending_file_that_now_passes_fails_until_its_line_goes():
    verdict = _judge(OUTPUT, ["bls/model.py", "bls/policy.py"])
    assert not verdict.passed and verdict.now_clean == ["bls/policy.py"]
    assert "bls/policy.py now passes: delete its line" in gate.report(verdict)


def test_a_listed_file_that_is_gone_fails():
    verdict = _judge(OUTPUT, ["bls/model.py", "bls/gone.py"])
    assert not verdict.passed and verdict.missing == ["bls/gone.py"]


def test_a_blocked_run_never_passes():
    output = RUN + (
        "bls/model.py:1: error: invalid syntax  [syntax]\n"
        "Found 1 error in 1 file (errors prevented further checking)\n"
    )
    verdict = _judge(output, ["bls/model.py"])
    assert not verdict.passed and verdict.blocked


def test_a_file_checked_by_several_runs_counts_its_worst_run():
    again = OUTPUT.replace("builder", "bls:python_backends/tensorrt_llm/common")
    assert gate.error_counts(OUTPUT + again) == {"bls/model.py": 2}


def test_the_pending_list_reads_paths_and_skips_comments():
    text = "# header\n\nbls/model.py  # 90\n  bls/policy.py\n"
    assert gate.read_pending(text) == ["bls/model.py", "bls/policy.py"]


def test_the_real_list_names_only_files_that_exist():
    # Empty once every file is typed (the list only shrinks); each line left is a file.
    listed = gate.read_pending((ROOT / ".ci" / "types-pending").read_text())
    assert all((ROOT / path).is_file() for path in listed)
