"""The self-test's verdicts without a server: the one-line reason, and one run per
binary and Python in a process."""

from __future__ import annotations

import shutil
import sys

import pytest

from builder.errors import TridentError
from builder.serve import selftest


def test_the_reason_names_the_stub_and_the_way_out(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 12, 3, "final", 0))
    line = selftest.reason("sent 'go', got back '\x02\x02'\nmore", bundled=True)
    assert line.startswith(
        "the bundled tritonserver's Python 3.12 stub corrupts string "
        "inputs: use Python 3.11 (make install picks it)"
    )
    assert "\n" not in line and "\\x02" in line
    assert "make install picks it" not in selftest.reason("x", bundled=False)


def test_a_verdict_is_reached_once_per_process(monkeypatch, tmp_path):
    monkeypatch.setattr(selftest, "_verdicts", {})
    calls = []

    def start(repository, log_path):
        calls.append(log_path.parent)
        assert (repository / selftest.MODEL_NAME / "1" / "model.py").is_file()
        raise TridentError("port in use")

    for _ in range(2):
        with pytest.raises(selftest.SelfTestFailed, match="its server did not start: port"):
            selftest.ensure(tmp_path / "tritonserver", True, start)
    assert len(calls) == 1
    shutil.rmtree(calls[0])  # kept for its log when the self-test fails
