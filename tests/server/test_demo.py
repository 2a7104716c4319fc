"""`make run`'s demo (builder/serve/demo.py), run as README's first command runs it: in
its own process, without any admin key in its environment, on a rendered repository (the
SGLang double behind the router here, so it takes seconds, not vLLM's start-up). Both
answers must come back: the streamed gRPC one and the OpenAI one. The suite's session key
(tests/conftest.py) hid that the demo's frontend did not get the server's key, so
`make run` failed with a 503 while every test passed."""

from __future__ import annotations

import os
import subprocess
import sys

from builder.serve import admin
from support.sglang_double import SHIM
from tests.helpers.servers import record_spawn, render

SPEC = {
    "name": "demo",
    "hardware": {"gpu": "cpu"},
    "models": [{"name": "qa", "engine": "sglang", "model": "/models/test-double"}],
    "router": {"default": ["qa"]},
}


def test_the_demo_answers_over_grpc_and_openai_without_a_key_in_its_environment(tmp_path):
    repo = render(SPEC, tmp_path / "repo")
    (repo / "qa" / "1" / "sglang.py").write_text(SHIM)
    env = {k: v for k, v in os.environ.items() if k != admin.KEY_ENV}
    argv = [sys.executable, "-m", "builder.serve.demo", "--repo", str(repo), "--max-tokens", "8"]
    started = record_spawn(argv, None, "demo: make run's demo")
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    started.ready()  # its whole run: the demo ends when it has answered
    assert "[served_by=qa finish_reason=" in done.stdout, done.stdout
    assert "OpenAI API: http://127.0.0.1:" in done.stdout
    assert "[model=router finish_reason=" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
