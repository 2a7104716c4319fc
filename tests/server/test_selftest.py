"""The start-up self-test against real tritonservers: a model that corrupts strings
(chosen through the test-only TRIDENT_SELFTEST_MODEL) or kills its stub makes it fail;
`trident serve` then exits 1 with the reason and leaves no server behind. That it passes
with this machine's stub is the demo's to show (tests/server/test_demo.py): its `trident
serve` runs the self-test before it reports ready, and would exit 1 otherwise (the
refusal below), so a second server for the passing case is not spent here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from builder.serve import selftest
from builder.serve.server import _self_test_server
from support.serve_traffic import serve_argv
from tests.helpers.servers import free_ports, record_spawn

# What the bundled 3.12 stub does on the GPU box: every byte of the input becomes 0x02.
CORRUPTING = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            bad = np.array([b"\\x02" * len(t) for t in text.flat], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", bad)]))
        return out
"""
# ... and then its stub dies.
DYING = """
import os

class TritonPythonModel:
    def execute(self, requests):
        os._exit(1)
"""


def test_a_dying_stub_fails_the_self_test(tmp_path, monkeypatch):
    model = tmp_path / "model.py"
    model.write_text(DYING)
    monkeypatch.setenv(selftest.MODEL_ENV, str(model))
    problem = selftest.run(_self_test_server)
    assert problem and problem.startswith("the echo failed"), problem
    shutil.rmtree(Path(problem.rsplit("log: ", 1)[1]).parent)


def test_trident_serve_refuses_a_stub_that_corrupts_strings(tmp_path):
    model = tmp_path / "corrupting.py"
    model.write_text(CORRUPTING)
    # Any repository will do: the self-test runs before readiness is reported.
    repo = selftest.write_repository(tmp_path / "repo", selftest.MODEL_SOURCE)
    ports = free_ports()
    env = {**os.environ, selftest.MODEL_ENV: str(model)}
    argv = serve_argv(repo, ports)
    record_spawn(argv, None, "selftest: trident serve refusing a corrupting stub")
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ready:" not in proc.stdout and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    version = "{}.{}".format(*sys.version_info[:2])
    assert f"tritonserver's Python {version} stub corrupts string inputs" in line, line
    assert "start-up self-test: sent" in line and "got back '\\x02" in line, line
    # Neither the real server nor the self-test's is left running.
    kept = Path(line.rsplit("log: ", 1)[1].rstrip(")")).parent
    for pattern in (f"--http-port={ports.http}", str(kept)):
        assert subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True).stdout == b"", (
            pattern
        )
    shutil.rmtree(kept)  # kept for its log when the self-test fails
