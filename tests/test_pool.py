"""The pool's report of a dead server (tests/helpers/pool.py, Pool.deaths): the failing
test's report carries the log of the tritonserver it lost (tests/server/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.helpers.pool import Pool, _Process


def test_a_dead_process_is_reported_once_with_its_exit_code_and_log(tmp_path):
    pool = Pool(lambda name: tmp_path / name)
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    try:
        for name, process in (("alive", living), ("gone", dead)):
            server = SimpleNamespace(process=process, log_path=tmp_path / f"{name}.log")
            pool._live[name] = (server, _Process(server, tmp_path / name))  # type: ignore[arg-type]
        assert pool.deaths() == [("gone", 3, tmp_path / "gone.log")]
        assert pool.deaths() == []  # once: the next failing test of its lane says nothing
    finally:
        living.kill()
        living.wait()
