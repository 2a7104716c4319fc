"""Triton's model control behind trident's admin key (builder/serve/admin.py): the flags
`trident serve` gives tritonserver, the key's origin, and the header trident's own
model-control calls carry. No server is started here: tests/server/test_restricted_api.py
shows a real tritonserver refusing a client without the key."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.serve import admin, loading
from builder.serve.install import TritonInstall
from builder.serve.server import Ports, TritonServer
from trident_common import interface as INTERFACE

INSTALL = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None, bundled=False)


def restrictions(server: TritonServer) -> dict[str, str]:
    flags = ("--http-restricted-api=", "--grpc-restricted-protocol=")
    return {
        arg.split("=", 1)[0]: arg.split("=", 1)[1]
        for arg in server.command(INSTALL)
        if arg.startswith(flags)
    }


def test_model_control_and_settings_need_the_key_over_http_and_grpc(tmp_path, monkeypatch):
    monkeypatch.delenv(admin.KEY_ENV, raising=False)
    server = TritonServer(tmp_path, Ports(1, 2, 3))
    found = restrictions(server)
    assert set(found) == {"--http-restricted-api", "--grpc-restricted-protocol"}
    for value in found.values():
        apis, header = value.split(":", 1)
        assert set(apis.split(",")) == {
            "model-repository",
            "shared-memory",
            "logging",
            "trace",
        }  # inference, health, config stay open
        assert header == f"trident-admin={server.admin_key}"
    assert server.admin_headers == {"trident-admin": server.admin_key}


def test_each_server_has_its_own_key_apart_from_the_router_secret(tmp_path, monkeypatch):
    monkeypatch.delenv(admin.KEY_ENV, raising=False)
    monkeypatch.delenv(INTERFACE.ROUTER_SECRET_ENV, raising=False)
    first, second = TritonServer(tmp_path), TritonServer(tmp_path)
    assert len(first.admin_key) >= 32 and first.admin_key != second.admin_key
    env = first.environment()
    secret = env[INTERFACE.ROUTER_SECRET_ENV]
    # The key is on Triton's command line (ps shows it); the router secret never is.
    assert first.admin_key != secret and secret not in " ".join(first.command(INSTALL))
    assert admin.KEY_ENV not in env and first.admin_key not in env.values()
    assert "admin_key" not in repr(first)


def test_an_operator_key_is_kept_and_a_bad_one_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(admin.KEY_ENV, "o" * 40)
    assert TritonServer(tmp_path).admin_key == "o" * 40
    (tmp_path / "repo").mkdir()
    for bad in ("short", "x" * 40 + ":model-control=y"):
        monkeypatch.setenv(admin.KEY_ENV, bad)
        code = main(["serve", "--repo", str(tmp_path / "repo")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and admin.KEY_ENV in err
        assert bad not in err and "Traceback" not in err


@pytest.mark.parametrize("action", ["load", "unload"])
def test_trident_s_own_load_and_unload_carry_the_key(monkeypatch, action):
    sent = []

    class Answer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(request: urllib.request.Request, timeout=None):
        sent.append(request)
        return Answer()

    monkeypatch.setattr(loading.urllib.request, "urlopen", urlopen)
    loading.request("http://127.0.0.1:1", "qa", action, 5, admin.http_headers("k" * 64))
    assert sent[0].full_url.endswith(f"/v2/repository/models/qa/{action}")
    assert sent[0].get_header("Trident-admin") == "k" * 64  # urllib capitalizes names


def test_the_grpc_header_is_the_name_triton_looks_for():
    # Triton 2.51 refuses with "expecting header 'triton-grpc-protocol-trident-admin'".
    assert admin.grpc_headers("v") == {"triton-grpc-protocol-trident-admin": "v"}
    assert admin.grpc_headers(None) == {} == admin.http_headers("")
