"""Shared test fixtures: paths, rendering, and real tritonserver instances.

Tests under tests/server/ start a real tritonserver and are marked `server` here (and
`vllm` by their module when a real vLLM engine loads); `make test-fast` skips them.
Helpers live in tests/helpers/, test doubles in tests/fakes/.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.helpers.s3_fixtures"]  # the real SeaweedFS S3 server fixtures

from builder.serve import selftest  # noqa: E402
from builder.serve.server import TritonServer  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402
from tests.fakes import fake_pb_utils  # noqa: E402
from tests.helpers.ledger import LEDGER, LEDGER_CACHE_KEY, Start  # noqa: E402
from trident_common.interface import DRAIN_DIR_ENV  # noqa: E402

# Triton's pb_utils exists only inside a stub: the runtime modules the tests import by
# their names (bls.*, python_backends.*) get the test double, for the whole run.
sys.modules.setdefault("triton_python_backend_utils", fake_pb_utils)


@pytest.fixture(autouse=True)
def _no_cancel_check_after_final():
    """A model that asks a sender whether it is cancelled after its final flag makes
    tritonserver 2.51 read freed memory (fake_pb_utils.cancel_checks_after_final)."""
    fake_pb_utils.cancel_checks_after_final.clear()
    yield
    asked = list(fake_pb_utils.cancel_checks_after_final)
    assert not asked, f"is_cancelled() after the final flag: {asked}"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="module")
def redis():
    """A real redis-server on a free loopback port, one per test module that asks."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def drain_folder(tmp_path, monkeypatch) -> Path:
    """A `trident serve` drain folder (builder/serve/drain.py), named in the environment
    as tritonserver names it to its stubs: the models under test watch it
    (trident_common/drain.py)."""
    path = tmp_path / "drain"
    path.mkdir()
    monkeypatch.setenv(DRAIN_DIR_ENV, str(path))
    return path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
# pip's internals (tests/packaging's lock check) import the standard library's distutils;
# setuptools, imported later by torch under vLLM, then asserts it owns distutils and
# fails. One distutils for the whole session: the standard library's.
os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")
# Model control on a trident-started Triton needs its admin key (builder/serve/admin.py).
# One operator key for the session, so a frontend started apart from its server (in
# process or as `trident openai`) can list the models; the tests of the key itself unset it.
os.environ.setdefault("TRIDENT_TRITON_ADMIN_KEY", "trident-test-session-" + "k" * 24)
# `kill -USR1 <pytest pid>` prints every thread's stack: the way to see what a hung run
# waits for.
faulthandler.register(signal.SIGUSR1, all_threads=True)


def pytest_collection_modifyitems(config, items):
    """Every test under tests/server/ starts a real tritonserver: mark it `server`."""
    server_dir = ROOT / "tests" / "server"
    for item in items:
        if server_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.server)


_entries: dict[int, Start] = {}  # id(server) -> its entry, from start() to wait_ready()


def _recorded_start(start):
    def recorded(server: TritonServer) -> None:
        repo = Path(server.repository).resolve()  # a pooled process's link: what it serves
        kind = (
            "self-test" if repo.parent.name.startswith(selftest.FOLDER_PREFIX) else "tritonserver"
        )
        entry = LEDGER.record(kind, f"{repo.parent.name}/{repo.name}", server.log_path)
        _entries[id(server)] = entry
        try:
            start(server)
        finally:
            if server.process is None:  # refused before starting (a port in use)
                LEDGER.starts.remove(entry)
                _entries.pop(id(server))

    return recorded


def _recorded_wait_ready(wait_ready):
    def recorded(server: TritonServer, *args, **kwargs) -> None:
        wait_ready(server, *args, **kwargs)
        entry = _entries.pop(id(server), None)
        if entry is not None:
            entry.ready()

    return recorded


def pytest_configure(config):
    """Every tritonserver this process starts goes into the run's ledger."""
    TritonServer.start = _recorded_start(TritonServer.start)
    TritonServer.wait_ready = _recorded_wait_ready(TritonServer.wait_ready)


def pytest_sessionfinish(session, exitstatus):
    """A run that spent more starts than the budget fails, whatever its tests said. A
    pytest-xdist worker hands its ledger to the controller, which judges the whole run."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["ledger"] = LEDGER.to_json()
    elif LEDGER.over_budget() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker finished; its servers and engines join the run's ledger."""
    ledger = getattr(node, "workeroutput", {}).get("ledger")
    if ledger is not None:
        LEDGER.merge(ledger)


def pytest_terminal_summary(terminalreporter):
    reporter = terminalreporter
    if not LEDGER.starts:
        return
    reporter.section("servers and engines (tests/helpers/ledger.py)")
    for line in LEDGER.summary():
        reporter.write_line(line)
    cache = getattr(reporter.config, "cache", None)  # none under -p no:cacheprovider
    if cache is not None:  # every start with its test, for the curious
        cache.set(LEDGER_CACHE_KEY, LEDGER.to_json())
        reporter.write_line(f"every start, with its test: .pytest_cache/v/{LEDGER_CACHE_KEY}")
    over = LEDGER.over_budget()
    for line in over:
        reporter.write_line(f"OVER BUDGET: {line}", red=True)
    if over:  # a CI log keeps no cache: name every start here, so the extra one shows
        for line in LEDGER.every_start():
            reporter.write_line(line)
