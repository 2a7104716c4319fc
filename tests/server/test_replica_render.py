"""A model rendered as replicas in a real tritonserver (issue 23, builder/render/
replicas.py): an SGLang model (trident's model on the SGLang double) with `instances: 2`
behind the router becomes `qwen__r0` and `qwen__r1`, one stub each, and `qwen`, the
router's code over them. `trident serve`'s loading puts the replicas first; each replica
answers a direct call as itself, `qwen` and the router answer through a replica, and a
replica whose stub died is reloaded alone (the keeper's reload), its sibling, `qwen` and
the router untouched."""

from __future__ import annotations

import os
import signal

import pytest

from builder.serve import client as infer
from builder.serve import keeper
from builder.serve.watch import stub_processes
from support.sglang_double import SHIM
from tests.helpers import wait_for
from tests.helpers.servers import render

pytestmark = pytest.mark.server

REPLICAS = ("qwen__r0", "qwen__r1")
SPEC = {
    "name": "replicas",
    "hardware": {"gpu": "cpu"},
    "models": [
        {
            "name": "qwen",
            "engine": "sglang",
            "model": "/models/test-double",
            "instances": 2,
            "engine_args": {"context_length": 4096, "max_running_requests": 8},
        }
    ],
    "router": {"default": ["qwen"]},
}
DOUBLE_REPLY = " w0 w1 w2 w3"  # the SGLang double's first four words (SHIM)


@pytest.fixture(scope="module")
def server(tmp_path_factory, pool):
    tmp = tmp_path_factory.mktemp("replicas")
    repo = render(SPEC, tmp / "repo")
    for replica in REPLICAS:
        (repo / replica / "1" / "sglang.py").write_text(SHIM)
    with pool.serving("replicas", repo, timeout_s=120) as started:
        yield started


def answer(server, model: str) -> tuple[str, str]:
    result = infer.stream_generate(
        server.grpc_url, model, "Hello", max_tokens=4, sampling={"temperature": 0}, timeout_s=60
    )
    return result.text, result.served_by


def stubs(server) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for pid, stub in stub_processes(server.process.pid).items():
        found.setdefault(stub.model, set()).add(pid)
    return found


def test_every_replica_and_the_model_itself_answer(server):
    assert server.ready_models() >= {*REPLICAS, "qwen", "router"}
    running = stubs(server)
    assert all(len(running[name]) == 1 for name in (*REPLICAS, "qwen", "router"))
    for replica in REPLICAS:  # one engine each, answering as itself
        assert answer(server, replica) == (DOUBLE_REPLY, replica)
    for caller in ("qwen", "router"):
        text, served_by = answer(server, caller)
        assert text == DOUBLE_REPLY and served_by in REPLICAS


def test_a_dead_replica_is_reloaded_alone(server):
    before = stubs(server)
    (dead,) = before["qwen__r1"]
    os.kill(dead, signal.SIGKILL)
    wait_for(lambda: dead not in stubs(server).get("qwen__r1", set()), timeout_s=30)
    keeper.reload(server.http_url, "qwen__r1", server.admin_headers, timeout_s=120)
    after = stubs(server)
    assert len(after["qwen__r1"]) == 1 and after["qwen__r1"] != before["qwen__r1"]
    for untouched in ("qwen__r0", "qwen", "router"):
        assert after[untouched] == before[untouched], untouched
    assert answer(server, "qwen__r1") == (DOUBLE_REPLY, "qwen__r1")
    text, served_by = answer(server, "qwen")
    assert text == DOUBLE_REPLY and served_by in REPLICAS
