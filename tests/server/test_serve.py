"""`trident serve` and the renderer against a real tritonserver (models that cannot run
on this machine are left out with explicit model control, never by editing the output)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.serve import client as infer
from builder.serve.server import (
    SHM_DIR,
    Ports,
    ServeError,
    TritonServer,
    free_port,
    shm_regions_of_group,
)
from tests.helpers.servers import (
    render,
)

server_test = pytest.mark.server

MIXED = {
    "models": [
        {
            "name": "tiny",
            "engine": "vllm",
            "model": "builtin:tiny-llama",
            "engine_args": {
                "max_model_len": 512,
                "block_size": 32,
                "max_num_seqs": 4,
                "dtype": "float32",
            },
        },
        {"name": "rag", "engine": "sglang", "model": "/models/not-on-this-machine"},
    ],
    "router": {"default": ["tiny"]},
}


@pytest.fixture(scope="module")
def mixed_repo(tmp_path_factory) -> Path:
    return render(MIXED, tmp_path_factory.mktemp("mixed") / "repo")


@server_test
@pytest.mark.vllm
@pytest.mark.destructive(stops=True)
def test_rendered_repository_loads_and_answers(fallback_server):
    """Last on the session's fallback server (it stops it): the rendered repository
    answers through the router, and vLLM's shared memory goes when the server stops."""
    server = fallback_server
    states = {m["name"]: m.get("state") for m in server.model_states()}
    assert states["primary"] == "READY" and states["router"] == "READY"
    result = infer.stream_generate(
        server.grpc_url, "router", "Hello", max_tokens=5, sampling={"temperature": 0}
    )
    assert result.served_by == "primary" and result.output_tokens == 5
    vllm_regions = {r for r in shm_regions_of_group(server.process.pid) if r.startswith("psm_")}
    assert vllm_regions  # vLLM's engine maps its own shared memory (~240 MiB each)
    server.stop()
    # vLLM leaves its psm_* regions behind when its process group is stopped: stop()
    # removes them, as it removes the Python backend's.
    assert [r for r in vllm_regions if (SHM_DIR / r).exists()] == []


@server_test
def test_port_in_use_is_reported_before_starting(mixed_repo, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = TritonServer(mixed_repo, Ports(port, free_port(), free_port()))
        with pytest.raises(ServeError, match=f"HTTP port {port} already in use"):
            server.start()
        assert server.process is None


@server_test
def test_failed_model_load_is_explained(tmp_path, pool):
    broken = render(
        {
            "models": [
                {
                    "name": "ghost",
                    "engine": "vllm",
                    "model": str(tmp_path / "no-such-model"),
                    "engine_args": {"block_size": 32},
                }
            ]
        },
        tmp_path / "repo",
    )
    with pytest.raises(ServeError) as failure, pool.serving("ghost", broken, timeout_s=180):
        pass
    message = str(failure.value)
    assert message.startswith("model 'ghost' failed to load: ")
    assert str(tmp_path / "no-such-model") in message  # the model's own reason
    assert "tritonserver.log" in message  # the server's log, where the rest is


def test_serve_missing_repository_exits_2(tmp_path, capsys):
    from builder.cli.main import main

    assert main(["serve", "--repo", str(tmp_path / "nope")]) == 2
    assert "no such model repository" in capsys.readouterr().err


# -- a load that does not finish is named, with its stage -----------------------------------

STUCK_CONFIG = """name: "stuck"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
STUCK_MODEL = """import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("stuck: waiting for an engine that never comes")
        time.sleep(3600)
"""


@server_test
def test_a_load_that_never_finishes_is_named_with_its_stage(tmp_path, pool):
    version = tmp_path / "repo" / "stuck" / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text(STUCK_CONFIG)
    (version / "model.py").write_text(STUCK_MODEL)
    # The pool's next swap kills the stub still stuck in initialize().
    with (
        pytest.raises(ServeError) as failure,
        pool.serving("stuck", tmp_path / "repo", timeout_s=15),
    ):
        pass
    message = str(failure.value)
    assert message.startswith("model 'stuck' did not load within the 15 s start-up timeout")
    stage = re.search(
        r"instance stuck_0_0 created, not yet loaded \(its stub process (\d+) running\); the "
        r"model's last log line: 'stuck: waiting for an engine that never comes'",
        message,
    )
    assert stage, message
    assert "HTTP port" not in message
