"""`trident serve` and the renderer against a real tritonserver (models that cannot run
on this machine are left out with explicit model control, never by editing the output)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from builder.serve import client as infer
from builder.serve.server import (SHM_DIR, Ports, ServeError, TritonServer, free_port,
                                  shm_regions_of_group)
from builder.serve.watch import stub_processes
from tests.helpers.servers import free_ports, render, start_server
from tests.helpers import wait_for
from support.sglang_double import SHIM

server_test = pytest.mark.server

MIXED = {
    "models": [
        {"name": "tiny", "engine": "vllm", "model": "builtin:tiny-llama",
         "engine_args": {"max_model_len": 512, "block_size": 32, "max_num_seqs": 4,
                         "dtype": "float32"}},
        {"name": "rag", "engine": "sglang", "model": "/models/not-on-this-machine"},
    ],
    "router": {"default": ["tiny"]},
}


@pytest.fixture(scope="module")
def mixed_repo(tmp_path_factory) -> Path:
    return render(MIXED, tmp_path_factory.mktemp("mixed") / "repo")


@server_test
@pytest.mark.vllm
def test_rendered_repository_loads_and_answers(mixed_repo, tmp_path):
    server = start_server(mixed_repo, tmp_path, load_models=["tiny", "router"])
    try:
        states = {m["name"]: m.get("state") for m in server.model_states()}
        assert states["tiny"] == "READY" and states["router"] == "READY"
        assert states["rag"] != "READY"       # present in the repository, not loaded
        result = infer.stream_generate(server.grpc_url, "router", "Hello", max_tokens=5,
                                       sampling={"temperature": 0})
        assert result.served_by == "tiny" and result.output_tokens == 5
    finally:
        server.stop()


@server_test
def test_router_alone_is_ready_fast(mixed_repo, tmp_path):
    started = time.monotonic()
    server = start_server(mixed_repo, tmp_path, load_models=["router"])
    server.stop()
    assert time.monotonic() - started < 30


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
def test_failed_model_load_is_explained(tmp_path):
    broken = render({"models": [{"name": "ghost", "engine": "vllm",
                                 "model": str(tmp_path / "no-such-model"),
                                 "engine_args": {"block_size": 32}}]}, tmp_path / "repo")
    server = TritonServer(broken, free_ports(), log_path=tmp_path / "server.log")
    server.start()
    try:
        with pytest.raises(ServeError) as failure:
            server.wait_ready(180)
    finally:
        server.stop()
    message = str(failure.value)
    assert "before it was ready" in message and "ghost" in message
    assert str(tmp_path / "server.log") in message


@server_test
def test_trident_serve_stops_on_sigterm_and_cleans_up(mixed_repo, tmp_path):
    ports = free_ports()
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder.cli.main", "serve", "--repo", str(mixed_repo),
         "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
         "--metrics-port", str(ports.metrics), "--load-model", "router"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("ready:"):
                assert f"127.0.0.1:{ports.grpc}" in line
                break
        else:
            pytest.fail("trident serve never printed ready")
        server_pid = int(subprocess.run(["pgrep", "-f", "--", f"--http-port={ports.http}"],
                                        capture_output=True, text=True).stdout.split()[0])
        regions = shm_regions_of_group(server_pid)
        assert regions   # the router's stub maps at least one region
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.monotonic() - stopping < 15
    finally:
        if proc.poll() is None:   # the test failed: leave no server behind
            proc.kill()
            subprocess.run(["pkill", "-KILL", "-f", "--", f"--http-port={ports.http}"])
    server_procs = subprocess.run(["pgrep", "-f", "--", f"--http-port={ports.http}"],
                                  capture_output=True, text=True).stdout.split()
    assert server_procs == []
    assert not any((SHM_DIR / name).exists() for name in regions)


def test_serve_missing_repository_exits_2(tmp_path, capsys):
    from builder.cli.main import main
    assert main(["serve", "--repo", str(tmp_path / "nope")]) == 2
    assert "no such model repository" in capsys.readouterr().err


# -- `trident serve` notices dead stubs ----------------------------------------------------

DOUBLE = {"name": "double", "hardware": {"gpu": "cpu"},
          "models": [{"name": "qwen", "engine": "sglang", "model": "/models/test-double"}]}


@server_test
def test_trident_serve_exits_when_a_stub_dies_but_not_on_unload(tmp_path):

    repo = render(DOUBLE, tmp_path / "repo")
    (repo / "qwen" / "1" / "sglang.py").write_text(SHIM)
    ports = free_ports()
    output = tmp_path / "serve.out"
    with open(output, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "builder.cli.main", "serve", "--repo", str(repo),
             "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
             "--metrics-port", str(ports.metrics), "--load-model", "qwen"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "ready:" in output.read_text() or proc.poll() is not None, 120)
        assert proc.poll() is None, output.read_text()
        server_pid = _server_pid(ports)

        def qwen_stubs():
            return [s for s in stub_processes(server_pid).values() if s.model == "qwen"]

        # An unload ends the stub on purpose: serve keeps running.
        _control(ports, "qwen", "unload")
        wait_for(lambda: not qwen_stubs(), 60)
        watched_until = time.monotonic() + 4   # four watch intervals
        while time.monotonic() < watched_until:
            assert proc.poll() is None, output.read_text()
            time.sleep(0.2)
        _control(ports, "qwen", "load")
        stub = wait_for(qwen_stubs, 60)[0]

        os.kill(stub.pid, signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=30)
        print(f"trident serve exited {time.monotonic() - killed:.1f} s after the kill")
    finally:
        if proc.poll() is None:   # the test failed: leave no server behind
            proc.kill()
            subprocess.run(["pkill", "-KILL", "-f", "--", f"--http-port={ports.http}"])
    said = output.read_text()
    assert code == 1, said
    # With the instance when a check saw the stub alive before the kill (not guaranteed:
    # it was killed right after the load).
    assert re.search(r"tritonserver: the stub of model 'qwen' (\(instance qwen_0_0\) )?died; "
                     r"exiting so a supervisor can restart the server", said), said
    assert "Traceback" not in said
    assert subprocess.run(["pgrep", "-f", "--", f"--http-port={ports.http}"],
                          capture_output=True).stdout == b""   # the server was stopped


def _server_pid(ports: Ports) -> int:
    found = subprocess.run(["pgrep", "-f", "--", f"--http-port={ports.http}"],
                           capture_output=True, text=True).stdout.split()
    return int(found[0])


def _control(ports: Ports, model: str, action: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{ports.http}/v2/repository/models/{model}/{action}", data=b"{}",
        method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
