"""The start-up self-test: one string (BYTES) round trip through a Python-backend echo
model on a short-lived second tritonserver, started with the same binary, stub and
environment as the real one, on free loopback ports.

Why: the bundled tritonserver's Python 3.12 stub corrupts every BYTES input (`go` arrives
as `02 02 02 02 02 02`) and dies at the first real request, while its models report
READY. Nothing at start-up shows that; one echo does, in about a second.

This module does not import server.py (which calls it): the caller hands in how to start
a server, so the import graph stays acyclic.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from builder.errors import TridentError, printable

MODEL_NAME = "trident_selftest"
MODEL_SOURCE = Path(__file__).with_name("selftest_model") / "model.py"
# Test-only: the path of a model.py to use instead of the echo model, so a test can make
# the round trip fail on a machine whose stub is sound (tests/server/test_selftest.py).
MODEL_ENV = "TRIDENT_SELFTEST_MODEL"
# Multi-byte UTF-8 as well as ASCII: a stub that mangles either fails.
PROBE = "trident self-test: go \u2713 \u00e9\u6f22"
TIMEOUT_S = 60.0  # to be ready; it takes ~0.3-1 s, more on a loaded 2-core machine
REQUEST_TIMEOUT_S = 30.0

CONFIG = f"""name: "{MODEL_NAME}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

log = logging.getLogger("trident.selftest")


class SelfTestFailed(TridentError):
    """The server's Python backend cannot carry a string: serving would fail later."""


class Server(Protocol):
    @property
    def http_url(self) -> str: ...

    def stop(self, grace_s: float = ...) -> object: ...


# One verdict per (binary, Python, model) in a process: tests start many servers.
_verdicts: dict[tuple[str, ...], str | None] = {}
FOLDER_PREFIX = "trident-selftest-"  # its temporary folder, kept when it failed


def model_source() -> Path:
    return Path(os.environ.get(MODEL_ENV) or MODEL_SOURCE)


def ensure(binary: Path, bundled: bool, start: Callable[[Path, Path], Server]) -> None:
    """Run the self-test once per process for this binary and Python; raise
    SelfTestFailed with a one-line reason when the echo does not come back intact.
    start(repository, log_path) returns a ready server on free ports (or raises)."""
    key = (str(binary), sys.executable, str(model_source()))
    if key not in _verdicts:
        started = time.monotonic()
        _verdicts[key] = run(start)
        log.debug(
            "self-test %s in %.2f s",
            "failed" if _verdicts[key] else "passed",
            time.monotonic() - started,
        )
    problem = _verdicts[key]
    if problem:
        raise SelfTestFailed(reason(problem, bundled))


def run(start: Callable[[Path, Path], Server]) -> str | None:
    """What went wrong in one self-test, or None when the echo came back intact. The
    temporary folder is kept when it failed: its tritonserver.log tells more."""
    folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    server_log = folder / "tritonserver.log"
    try:
        repository = write_repository(folder / "repo", model_source())
        try:
            server = start(repository, server_log)
        except TridentError as e:
            return f"its server did not start: {e}"
        try:
            problem = round_trip(server.http_url)
        finally:
            # Killed at once: a graceful stop waits ~3 s for the stub to unload, and
            # stop() removes the shared memory the stub leaves behind.
            server.stop(grace_s=0)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if problem is None:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return f"{problem}; log: {server_log}"


def write_repository(repository: Path, source: Path) -> Path:
    version = repository / MODEL_NAME / "1"
    version.mkdir(parents=True)
    (repository / MODEL_NAME / "config.pbtxt").write_text(CONFIG)
    shutil.copyfile(source, version / "model.py")
    return repository


def round_trip(http_url: str) -> str | None:
    """Send PROBE to the echo model over HTTP (no tritonclient import: it is slow);
    what went wrong, or None."""
    body = {"inputs": [{"name": "INPUT", "shape": [1], "datatype": "BYTES", "data": [PROBE]}]}
    request = urllib.request.Request(
        f"{http_url}/v2/models/{MODEL_NAME}/infer",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as e:
        return f"the echo failed: {_error_text(e)}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"the echo got no answer: {e}"
    try:
        echoed = answer["outputs"][0]["data"][0]
    except (KeyError, IndexError, TypeError):
        return f"the echo came back without its output: {str(answer)[:200]}"
    if echoed != PROBE:
        return f"sent {PROBE!r}, got back {str(echoed)[:40]!r}"
    return None


def _error_text(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read())["error"])[:300]
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {error.code}"


def reason(problem: str, bundled: bool) -> str:
    version = "{}.{}".format(*sys.version_info[:2])
    whose = "the bundled tritonserver's" if bundled else "tritonserver's"
    if bundled and version != "3.11":
        hint = "use Python 3.11 (make install picks it)"
    elif bundled:
        hint = "reinstall with `make install` (the lock pins numpy < 2, which the stub needs)"
    else:
        hint = "trident's models pass strings, so this server cannot serve them"
    return (
        f"{whose} Python {version} stub corrupts string inputs: {hint} "
        f"(start-up self-test: {printable(problem)})"
    )
