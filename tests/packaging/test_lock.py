"""requirements.lock's public path: the lock names the index of its +cpu pins, and the
checker `.ci/run` runs (tests/packaging/lock_check.py) tells a missing pin (failure) from
an index that does not answer (warning), against real HTTP indexes on loopback."""

from __future__ import annotations

import functools
import http.server
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.packaging.lock_check import read_lock

ROOT = Path(__file__).resolve().parents[2]


def test_the_lock_names_an_index_for_its_local_builds():
    lock = read_lock(ROOT / "requirements.lock")
    local = [f"{n}=={v}" for n, v in lock.pins if "+" in v]
    assert local == ["torch==2.13.0+cpu"]  # PyPI never carries local version labels
    assert len(lock.indexes) == 2 and lock.indexes[1].endswith("/whl/cpu")


def _index(root: Path, projects: dict[str, list[str]]) -> None:
    for name, files in projects.items():
        page = root / "simple" / name
        page.mkdir(parents=True)
        links = "".join(f'<a href="../../files/{f}">{f}</a><br/>' for f in files)
        (page / "index.html").write_text(f"<html><body>{links}</body></html>")


@pytest.fixture
def serve_dir():
    servers = []

    def start(root: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/simple"

    yield start
    for server in servers:
        server.shutdown()


def _check(tmp_path: Path, lock_text: str) -> subprocess.CompletedProcess:
    lock = tmp_path / "requirements.lock"
    lock.write_text(lock_text)
    return subprocess.run(
        [sys.executable, "-m", "tests.packaging.lock_check", str(lock)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pins_resolve_across_the_declared_indexes(tmp_path, serve_dir):
    main = serve_dir(tmp_path / "main")
    extra = serve_dir(tmp_path / "extra")
    _index(
        tmp_path / "main",
        {
            "click": ["click-8.1.8-py3-none-any.whl"],
            "pyyaml": ["PyYAML-6.0.2.tar.gz"],
            "torch": ["torch-2.13.0-cp39-abi3-win_amd64.whl"],
        },
    )
    _index(tmp_path / "extra", {"torch": ["torch-2.13.0+cpu-py3-none-any.whl"]})
    result = _check(
        tmp_path,
        f"--index-url {main}\n--extra-index-url {extra}\n"
        "# a comment\nclick==8.1.8\nPyYAML==6.0.2\ntorch==2.13.0+cpu\n",
    )
    assert result.returncode == 0, result.stderr
    assert "3 of 3 pins resolve" in result.stdout and result.stderr == ""


def test_a_pin_no_index_has_fails(tmp_path, serve_dir):
    main = serve_dir(tmp_path / "main")
    _index(
        tmp_path / "main",
        {"click": ["click-8.1.8-py3-none-any.whl", "click-8.1.7-py3-none-win32.whl"]},
    )
    result = _check(
        tmp_path, f"--index-url {main}\nclick==8.1.8\nclick==8.1.7\nno-such-project==1.0\n"
    )
    assert result.returncode == 1
    missing = result.stderr.splitlines()
    assert len(missing) == 2  # 8.1.7 has no wheel for this interpreter; the other is absent
    assert any("click==8.1.7 is on none of" in line for line in missing)
    assert any("no-such-project==1.0 is on none of" in line for line in missing)


def test_an_index_that_does_not_answer_only_warns(tmp_path, serve_dir):
    main = serve_dir(tmp_path / "main")
    _index(tmp_path / "main", {"click": ["click-8.1.8-py3-none-any.whl"]})
    gone = f"http://127.0.0.1:{_closed_port()}/simple"
    result = _check(
        tmp_path, f"--index-url {main}\n--extra-index-url {gone}\nclick==8.1.8\ntorch==2.13.0+cpu\n"
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("warning: lock check: 1 pin(s) unchecked") and "torch" in line
    offline = _check(tmp_path, f"--index-url {gone}\nclick==8.1.8\n")
    assert offline.returncode == 0
    assert offline.stderr.startswith("lock check skipped: no index answered")
