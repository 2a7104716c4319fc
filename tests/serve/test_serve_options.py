"""What `trident serve` asks of tritonserver before starting it: private bind addresses,
the router secret in the server's environment, and the refusal of a public Triton port
beside API keys. No server is started here (tests/server/test_serve.py checks the sockets
of a real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.cli.main import main
from builder.serve.install import TritonInstall
from builder.serve.server import Ports, TritonServer, connect_host, is_loopback
from trident_common import interface as INTERFACE

SECRET = INTERFACE.ROUTER_SECRET_ENV
INSTALL = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None, bundled=False)


def flags(server: TritonServer) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in server.command(INSTALL)[1:] if "=" in arg)


def test_triton_ports_bind_to_loopback_by_default(tmp_path):
    found = flags(TritonServer(tmp_path, Ports(1, 2, 3)))
    assert (found["http-address"], found["grpc-address"], found["metrics-address"]) == (
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.1",
    )
    assert found["model-control-mode"] == "explicit"  # models are loaded one by one


def test_bind_addresses_are_chosen_separately_and_clients_connect_where_they_can(tmp_path):
    server = TritonServer(tmp_path, Ports(1, 2, 3), host="0.0.0.0", metrics_host="10.0.0.7")
    found = flags(server)
    assert (found["http-address"], found["grpc-address"], found["metrics-address"]) == (
        "0.0.0.0",
        "0.0.0.0",
        "10.0.0.7",
    )
    assert server.http_url == "http://127.0.0.1:1" and server.grpc_url == "127.0.0.1:2"
    assert server.metrics_url == "http://10.0.0.7:3/metrics"
    assert connect_host("::") == "[::1]" and connect_host("fd00::5") == "[fd00::5]"


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("triton.internal", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_each_start_gets_its_own_router_secret(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET, raising=False)
    server = TritonServer(tmp_path)
    first, second = server.environment()[SECRET], server.environment()[SECRET]
    assert len(first) >= 32 and first != second


def test_an_operator_secret_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET, "set-by-the-operator")
    assert TritonServer(tmp_path).environment()[SECRET] == "set-by-the-operator"


def test_keys_with_a_public_triton_host_are_refused_in_one_line(tmp_path, capsys):
    keys = tmp_path / "keys"
    keys.write_text("sk-test-0123456789abcdef alice\n")
    (tmp_path / "repo").mkdir()
    code = main(
        [
            "serve",
            "--repo",
            str(tmp_path / "repo"),
            "--openai-port",
            "9",
            "--api-keys-file",
            str(keys),
            "--triton-host",
            "0.0.0.0",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--triton-host 0.0.0.0" in err
    assert "--allow-open-triton" in err and "Traceback" not in err
    assert "sk-test" not in err


def test_a_load_refused_by_a_server_on_its_way_out_reports_the_exit(tmp_path, monkeypatch):
    """A port another process took first can fail tritonserver's metrics service after
    its models began to load: the next load is refused while it shuts down. The error is
    then its exit (with the log's "already in use", which start_on_free_ports retries on
    new ports), not the refused load."""
    import subprocess
    import sys
    import urllib.error

    from builder.serve import server as serving
    from builder.serve.install import ServeError

    def refused(url, model, headers, done):
        done.append(urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")))

    monkeypatch.setattr(serving, "_load_into", refused)
    server = TritonServer(tmp_path, Ports(1, 2, 3))
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1); exit(1)"])
    with pytest.raises(ServeError, match="exited with status 1 before it was ready"):
        server.load("router", deadline=float("inf"), timeout_s=30)


@pytest.mark.parametrize("given", ["0.5", "4.9"])
def test_a_hang_timeout_that_would_kill_healthy_stubs_is_refused(tmp_path, capsys, given):
    (tmp_path / "repo").mkdir()
    code = main(["serve", "--repo", str(tmp_path / "repo"), "--stub-hang-timeout", given])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--stub-hang-timeout" in err and "at least 5, or 0 for never" in err
