"""trident k8s: in every serving pod, Triton's model control needs the pod's own admin
key. The pods run `trident serve`, which makes a fresh random key at each start and puts
it on tritonserver's command line only: here each rendered serve command is run through
the real CLI up to the point where it would start tritonserver, and that command line is
checked. No key is rendered into any manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.cli.main import main
from builder.serve import admin
from builder.serve.install import TritonInstall
from builder.serve.server import TritonServer
from tests.k8s.test_access import H100X8, MULTINODE, kind, render, serve_args, write_spec

INSTALL = TritonInstall(Path("/opt/tritonserver/bin/tritonserver"), None, bundled=False)


def triton_command(args: list[str], repo: Path, monkeypatch) -> list[str]:
    """The tritonserver command `trident serve ARGS` would run (the pod's repository
    replaced by a local folder)."""
    started = []

    def start(server: TritonServer) -> None:
        started.append(server.command(INSTALL))
        raise KeyboardInterrupt  # `trident serve` stops quietly, exit 0

    monkeypatch.setattr(TritonServer, "start", start)
    monkeypatch.delenv(admin.KEY_ENV, raising=False)
    args = list(args)
    args[args.index("--repo") + 1] = str(repo)
    assert main(["serve", *args]) == 0
    return started[0]


def restricted_key(command: list[str]) -> str:
    spec = {
        arg.split("=", 1)[0]: arg.split("=", 1)[1]
        for arg in command
        if arg.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))
    }
    assert set(spec) == {"--http-restricted-api", "--grpc-restricted-protocol"}, command
    (only,) = set(spec.values())
    apis, header = only.split(":", 1)
    assert "model-repository" in apis.split(",")
    name, key = header.split("=", 1)
    assert name == admin.HEADER
    return key


@pytest.mark.parametrize(
    "source, path",
    [
        (H100X8, ("StatefulSet", "template")),
        (MULTINODE, ("LeaderWorkerSet", "leaderTemplate")),
    ],
)
def test_each_pod_start_restricts_model_control_with_its_own_key(
    tmp_path, monkeypatch, source, path
):
    # Without API keys Triton's ports are on the pod network: the case this closes.
    out = tmp_path / "out"
    objects = render(write_spec(tmp_path, source), out)
    workload = kind(objects, path[0])["spec"]
    template = workload.get("template") or workload["leaderWorkerTemplate"][path[1]]
    args = serve_args(template["spec"]["containers"][0]["command"])
    assert args[args.index("--triton-host") + 1] == "0.0.0.0"
    (tmp_path / "repo").mkdir()
    first = restricted_key(triton_command(args, tmp_path / "repo", monkeypatch))
    again = restricted_key(triton_command(args, tmp_path / "repo", monkeypatch))
    assert len(first) >= 32 and first != again  # per start, not per manifest
    rendered = "".join(p.read_text() for p in out.iterdir())
    assert first not in rendered and admin.KEY_ENV not in rendered
