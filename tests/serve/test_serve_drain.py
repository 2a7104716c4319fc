"""`trident serve`'s side of the drain (builder/serve/drain.py), without a server: the
steps of Drain.run against a stand-in frontend and busy files as the models write them,
and `trident drain` against a stand-in process that drains on SIGUSR1 as serve does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from builder.cli.main import main
from builder.serve.drain import (
    DRAINED,
    RUN_DIR_PREFIX,
    Drain,
    DrainError,
    DrainRequested,
    ask_to_drain,
    drain_on_signal,
    find_server,
    run_dir,
)
from trident_common.drain import BUSY_PREFIX, CUTOFF, DRAINING  # the models' side's names


class Frontend:
    def __init__(self, in_flight=0):
        self.in_flight, self.draining, self.cut = in_flight, False, False

    def drain(self):
        self.draining = True

    def cut_off(self):
        self.cut = True
        self.in_flight = 0


@pytest.fixture
def folder(tmp_path):
    return tmp_path / "run"


def test_a_drain_with_nothing_in_flight_ends_at_once(folder):
    frontend, lines = Frontend(), []
    drain = Drain(30.0, folder=folder, frontend=frontend).create()
    began = time.monotonic()
    assert drain.run(lines.append) is True
    assert time.monotonic() - began < 2
    assert frontend.draining and not frontend.cut
    assert (folder / DRAINING).exists() and not (folder / CUTOFF).exists()
    assert (folder / DRAINED).exists() and lines[-1].startswith("drained in")
    drain.remove()
    assert not folder.exists()


def test_it_waits_for_the_models_busy_counts_then_cuts_off_at_the_timeout(folder):
    frontend, lines = Frontend(in_flight=1), []
    drain = Drain(0.5, folder=folder, frontend=frontend).create()
    (folder / f"{BUSY_PREFIX}{os.getpid()}.qwen_0_0").write_text("2")
    (folder / f"{BUSY_PREFIX}999999999.gone_0_0").write_text("7")  # a dead stub's
    assert drain.in_flight() == 3
    assert drain.run(lines.append) is False
    assert (folder / CUTOFF).exists() and frontend.cut
    assert any(line.startswith("drain timeout: ending the answers") for line in lines)


def test_trident_drain_signals_the_server_and_waits_for_its_drain(tmp_path):
    # A stand-in for `trident serve`: its run folder, and SIGUSR1 -> `drained` a moment later.
    parent, prefix = str(run_dir(0).parent), RUN_DIR_PREFIX
    script = (
        "import os, signal, time, pathlib\n"
        f"folder = pathlib.Path({parent!r}) / f'{prefix}{{os.getpid()}}'\n"
        "folder.mkdir()\n"
        "drained = lambda *_: (time.sleep(0.3), (folder / 'drained').touch())\n"
        "signal.signal(signal.SIGUSR1, drained)\n"
        "print('up', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        assert find_server(proc.pid) == proc.pid
        assert ask_to_drain(proc.pid, timeout_s=10) is True
        assert main(["drain", "--pid", str(proc.pid), "--timeout", "5"]) == 0
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["rm", "-rf", str(run_dir(proc.pid))])


def test_trident_drain_without_a_server_is_a_usage_error(capsys):
    with pytest.raises(DrainError):
        find_server(999999999)
    assert main(["drain", "--pid", "999999999"]) == 2
    assert "no trident serve with pid 999999999" in capsys.readouterr().err


def test_while_serving_the_first_signal_drains_and_a_second_stops():
    """drain_on_signal (SIGTERM here: pytest's faulthandler holds SIGUSR1); the handler
    it replaced is back after it."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), drain_on_signal():
        with pytest.raises(DrainRequested) as asked:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at once, in this thread
        assert asked.value.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before
