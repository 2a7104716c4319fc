"""`trident serve` and the renderer against a real tritonserver (models that cannot run
on this machine are left out with explicit model control, never by editing the output),
and the stub-liveness rules of `trident serve` (pure, no server)."""
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
from builder.serve.watch import (Stub, StubWatch, parse_stub, runs_in_stub, stub_processes,
                                 unhealthy_engines)
from tests.conftest import free_ports, render, start_server
from tests.helpers import wait_for

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
    from tests.test_sglang_server import SHIM  # the SGLang engine double, as there

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


STUB_ARGS = [b"/opt/tritonserver/backends/python/triton_python_backend_stub",
             b"/srv/repo/primary/1/model.py",
             b"triton_python_backend_shm_region_d4656d5f", b"1048576", b"1048576", b"4331",
             b"/opt/tritonserver/backends/python", b"336", b"primary_0_0", b"DEFAULT"]
STAT = "4347 (triton_python_b) S 4331 4331 4331 0 -1 4194560 " + " ".join(["0"] * 12) \
    + " 987654 2000 300"


def test_parse_stub_reads_model_instance_and_start_time():
    assert parse_stub(4347, b"\0".join(STUB_ARGS) + b"\0", STAT) == Stub(
        4347, "primary", "primary_0_0", 987654)


@pytest.mark.parametrize("cmdline", [
    b"",                                           # a dead stub not yet reaped
    b"/usr/bin/python3\0-m\0vllm\0",               # another process of the group
    b"\0".join(STUB_ARGS[:5]),                     # not a stub command line
])
def test_parse_stub_ignores_other_processes(cmdline):
    assert parse_stub(1, cmdline, STAT) is None


def test_unhealthy_engines_reads_the_gauge():
    text = ("# TYPE trident_engine_healthy gauge\n"
            'trident_engine_healthy{model="primary"} 0\n'
            'trident_engine_healthy{model="backup"} 1\n'
            'trident_requests_total{model="other"} 0\n')
    assert unhealthy_engines(text) == {"primary"}
    assert unhealthy_engines("") == set()


def stub(pid, instance, started=None):
    return Stub(pid, instance.rsplit("_", 2)[0], instance, started or pid)


def stubs(*items):
    return {s.pid: s for s in items}


def checks(watch, *steps):
    """Run (alive, ready[, unhealthy]) snapshots through the watch; the last answer."""
    answer = None
    for step in steps:
        answer = watch.check(*step)
        if answer:
            return answer
    return answer


A0, A1 = stub(10, "qwen_0_0"), stub(11, "qwen_0_1")
B0, B1 = stub(20, "qwen_0_0"), stub(21, "qwen_0_1")
R = stub(12, "router_0_0")


def test_a_killed_stub_of_a_ready_model_is_dead_once_seen_twice():
    watch = StubWatch(stubs(A0, R))
    assert watch.check(stubs(R), {"qwen", "router"}) is None       # seen once
    assert watch.check(stubs(R), {"qwen", "router"}) == (
        "the stub of model 'qwen' (instance qwen_0_0) died")


def test_a_ready_model_without_any_stub_is_dead_once_seen_twice():
    watch = StubWatch(stubs(R))    # qwen's stub died before a check saw it
    assert checks(watch, (stubs(R), {"qwen", "router"}), (stubs(R), {"qwen", "router"})) == (
        "the stub of model 'qwen' died")


def test_runs_in_stub_reads_the_backend():
    assert runs_in_stub('name: "router"\nbackend: "python"\nmax_batch_size: 0\n')
    assert not runs_in_stub('name: "llama"\nbackend: "tensorrtllm"\n')
    assert not runs_in_stub('name: "ensemble"\nplatform: "ensemble"\n')


def test_one_dead_instance_of_two_is_noticed():
    watch = StubWatch(stubs(A0, A1))
    assert "instance qwen_0_1" in checks(watch, (stubs(A0), {"qwen"}), (stubs(A0), {"qwen"}))


@pytest.mark.parametrize("steps", [
    # unload: the model leaves READY, then its stub exits
    [(stubs(R), {"router"})] * 3,
    # unload seen half-way: the stub is gone while the index still said READY once
    [(stubs(R), {"qwen", "router"}), (stubs(R), {"router"}), (stubs(R), {"router"})],
    # load again: the new stub starts before the old one exits
    [(stubs(A0, B0, R), {"qwen", "router"}), (stubs(B0, R), {"qwen", "router"})] + [
        (stubs(B0, R), {"qwen", "router"})] * 2,
    # load again between two checks
    [(stubs(B0, R), {"qwen", "router"})] * 3,
])
def test_unloads_and_reloads_are_not_deaths(steps):
    assert checks(StubWatch(stubs(A0, R)), *steps) is None


def test_a_reload_with_fewer_instances_is_not_a_death():
    watch = StubWatch(stubs(A0, A1))
    assert checks(watch, (stubs(A0, A1, B0), {"qwen"}), (stubs(B0), {"qwen"}),
                  (stubs(B0), {"qwen"})) is None


def test_a_failed_reload_is_not_a_death():
    watch = StubWatch(stubs(A0))   # the new stub dies while loading; the old one serves on
    assert checks(watch, (stubs(A0, B0), {"qwen"}), (stubs(A0), {"qwen"}),
                  (stubs(A0), {"qwen"})) is None


def test_an_engine_reporting_itself_dead_counts_once_seen_twice():
    watch = StubWatch(stubs(A0, R))
    alive, ready = stubs(A0, R), {"qwen", "router"}
    assert watch.check(alive, ready, {"qwen"}) is None
    assert watch.check(alive, ready, {"qwen"}) == (
        "the engine of model 'qwen' died (trident_engine_healthy is 0)")


def test_a_zero_gauge_of_a_model_not_ready_is_ignored():
    watch = StubWatch(stubs(R))    # qwen was unloaded; its series keeps its last value
    assert checks(watch, *[(stubs(R), {"router"}, {"qwen"})] * 3) is None
