"""Rendering specs and starting real tritonservers (and OpenAI frontends) for tests."""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from builder.pipeline import build_repository
from builder.serve.server import Ports, TritonServer, free_port, start_on_free_ports
from builder.spec import load_spec, parse_spec
from tests.helpers.ledger import LEDGER, Start

ROOT = Path(__file__).resolve().parents[2]


def free_ports() -> Ports:
    return Ports(free_port(), free_port(), free_port())


def render(spec_path_or_data, out: Path) -> Path:
    """Render a spec file (path) or spec data (dict) into out; returns out."""
    if isinstance(spec_path_or_data, dict):
        spec = parse_spec(spec_path_or_data, "<test>")
    else:
        spec = load_spec(spec_path_or_data)
    build_repository(spec, out)
    return out


def start_server(
    repo: Path, log_dir: Path, load_models=None, timeout_s=240.0, extra_args=()
) -> TritonServer:
    """A started and ready tritonserver on free ports; the caller stops it. Without the
    string self-test `trident serve` runs first (one more tritonserver per process): a
    stub that corrupts strings fails every server test here, and tests/server/
    test_selftest.py proves the self-test itself."""
    return start_on_free_ports(
        Path(repo),
        Path(log_dir) / "tritonserver.log",
        load_models=load_models,
        timeout_s=timeout_s,
        extra_args=tuple(extra_args),
        self_test=False,
        gauges_folder=Path(log_dir) / "engine-gauges",  # as `trident serve` names one
    )


def _tcp_sockets(pid: int) -> Iterator[tuple[str, str, int]]:
    """(state, address, port) of each TCP socket process `pid` holds, read from /proc:
    the socket inodes among its file descriptors, looked up in /proc/net/tcp and tcp6.
    The state is the kernel's hex code (0A: LISTEN, 01: ESTABLISHED)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode not in inodes:
                continue
            address, port = local.split(":")
            raw = bytes.fromhex(address)
            # /proc writes each 32-bit word of the address in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(words)
            # gRPC listens on an IPv6 socket with an IPv4-mapped address (::ffff:127.0.0.1)
            yield state, str(getattr(ip, "ipv4_mapped", None) or ip), int(port, 16)


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets process `pid` listens on."""
    return {(address, port) for state, address, port in _tcp_sockets(pid) if state == "0A"}


def accepted_connections(pid: int, port: int) -> int:
    """How many connections process `pid` holds that it accepted on `port` (any state
    but LISTEN: a connection its client has closed still holds a descriptor)."""
    return sum(1 for state, _, local in _tcp_sockets(pid) if local == port and state != "0A")


def record_spawn(argv: list[str], output: Path | None, label: str, restarts: int = 0) -> Start:
    """Note a `trident serve` (or demo) subprocess in the run's ledger: it starts its
    tritonserver, and its self-test's first unless told --no-self-test, and once more per
    restart of a tritonserver the test kills. The caller marks the entry ready() when the
    process says so; its log (output) names its engine loads."""
    self_tests = 0 if "--no-self-test" in argv else 1
    return LEDGER.record("trident serve", label, output, tritonservers=1 + self_tests + restarts)


def served_pid(ports: Ports) -> int:
    """The pid of the one tritonserver a `trident serve` subprocess started on `ports`."""
    found = subprocess.run(
        ["pgrep", "-f", "--", f"--http-port={ports.http}"], capture_output=True, text=True
    ).stdout.split()
    assert len(found) == 1, found
    return int(found[0])


@contextlib.contextmanager
def running_uvicorn(config) -> Iterator[None]:
    """A uvicorn.Server on `config` in a thread, started within 15 s, stopped after."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        yield
    finally:
        server.should_exit = True
        thread.join(10)
