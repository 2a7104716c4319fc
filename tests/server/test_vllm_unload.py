"""Unloading trident's vLLM model (metrics on, as rendered) must not crash its stub.

Each unload used to end in a segfault of the stub (the unload itself succeeded): the
model's ResponseFactory kept two pb_utils.Tensor objects for the model's whole life, and
the stub tore down its shared memory before Python freed them (5 of 5 unloads crashed).
Two unload/load rounds in a row (each costs a vLLM start-up) on a real server in explicit
model-control mode; the server's log (the stubs' stderr goes there) must show no crash,
and the model answers the same after each load.
"""

from __future__ import annotations

import re
import urllib.request

import pytest

from builder.serve import client as infer
from builder.serve.watch import stub_processes
from tests.helpers import wait_for
from tests.helpers.servers import render, start_server

pytestmark = [pytest.mark.server, pytest.mark.vllm]

SPEC = {
    "name": "unload",
    "hardware": {"gpu": "cpu"},
    "models": [
        {
            "name": "tiny",
            "engine": "vllm",
            "model": "builtin:tiny-llama",
            "engine_args": {"max_model_len": 256, "max_num_seqs": 2, "dtype": "float32", "seed": 0},
        }
    ],
    "router": {"default": ["tiny"]},
}
# What a crash leaves in the log: the stub's own handler ("!!!!!!! Segfault encountered
# !!!!!!!" and a backtrace), the server's ("Signal (11) received."; 15 is our stop),
# Python's faulthandler, a shell's report, Triton's word for a dead stub.
CRASH = re.compile(
    r"Segfault encountered|Segmentation fault|Signal \((?!15\))\d+\) received|"
    r"Fatal Python error|core dumped|Stub process .* is not healthy"
)


def _control(server, action: str) -> None:
    request = urllib.request.Request(
        f"{server.http_url}/v2/repository/models/tiny/{action}",
        data=b"{}",
        method="POST",
        headers=server.admin_headers,
    )  # model control needs the server's admin key
    with urllib.request.urlopen(request, timeout=240) as response:
        assert response.status == 200


def _stubs(server) -> set[int]:
    return {pid for pid, stub in stub_processes(server.process.pid).items() if stub.model == "tiny"}


def _answer(server) -> str:
    result = infer.stream_generate(
        server.grpc_url, "tiny", "Hello", max_tokens=4, sampling={"temperature": 0}, timeout_s=120
    )
    assert result.served_by == "tiny"
    return result.text


def test_two_unloads_in_a_row_leave_no_crashed_stub(tmp_path):
    repo = render(SPEC, tmp_path / "repo")
    server = start_server(repo, tmp_path, load_models=["tiny"], timeout_s=240)
    try:
        first = _answer(server)
        for _ in range(2):
            old = _stubs(server)
            _control(server, "unload")
            # The old stub runs finalize() and exits: the crash came at that point.
            wait_for(lambda old=old: not _stubs(server) & old, timeout_s=120, interval_s=0.2)
            _control(server, "load")
            assert _answer(server) == first
            assert server.process.poll() is None, "tritonserver died"
    finally:
        server.stop()
    crashes = CRASH.findall(server.log_path.read_text(errors="replace"))
    assert not crashes, f"stub crashes in {server.log_path}: {crashes}"
