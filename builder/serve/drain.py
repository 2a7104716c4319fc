"""The drain of `trident serve`: on SIGTERM (or `trident drain`) the server stops taking
new work, lets the answers in flight finish, ends what is left at the drain timeout with
an explicit error, then stops tritonserver.

How long each step may take is fixed here, once: Kubernetes' grace period is their sum
(builder/k8s/workloads.py), so the kubelet never kills a pod that is still draining.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from builder import signals
from builder.errors import TridentError
from trident_common import drain as _MODELS_SIDE

# tritonserver's own --exit-timeout-secs: what is left in flight when it is told to stop
# (nothing, after a drain) gets this long.
TRITON_EXIT_TIMEOUT_S = 5
# TritonServer.stop: SIGKILL for the process group this long after its SIGTERM.
STOP_GRACE_S = 10
# After a drain nothing is in flight, so nothing is lost when tritonserver is killed: it
# gets this long to unload its models (a double's in ~1 s), then its process group (the
# stubs and their engines' processes) is killed. Triton 2.51 waits its whole exit timeout
# whenever a client keeps open the gRPC stream of a request that ended in an error (the
# drain's refusals), and unloads one model after another: a drained pod would take 5 s
# or more to go where 1 s will do.
DRAINED_EXIT_GRACE_S = 1.0
# After the drain timeout the models end every answer still running with an error
# (`server shutdown: `); they get this long to send it before tritonserver is stopped.
CUTOFF_GRACE_S = 3


def shutdown_budget_s(drain_timeout_s: float) -> int:
    """The longest a drain and the exit after it take, in whole seconds."""
    return int(-(-drain_timeout_s // 1)) + CUTOFF_GRACE_S + TRITON_EXIT_TIMEOUT_S + STOP_GRACE_S


# -- the server's side of the drain folder -----------------------------------------------

# The files the server writes and the models read (or the reverse), and how often the
# models look: trident_common/drain.py, the models' side, owns them.
DRAINING: str = _MODELS_SIDE.DRAINING
CUTOFF: str = _MODELS_SIDE.CUTOFF
BUSY_PREFIX: str = _MODELS_SIDE.BUSY_PREFIX
POLL_S: float = _MODELS_SIDE.POLL_S

RUN_DIR_PREFIX = "trident-serve-"  # + the pid: where `trident drain` finds a server
DRAINED = "drained"  # written when the drain is over (`trident drain` waits for it)
TIMEOUT_FILE = "drain_timeout_s"  # the server's drain timeout, for `trident drain`
WAIT_STEP_S = 0.1


class DrainError(TridentError):
    """`trident drain` found no server to drain, or several; the message says which."""


def run_dir(pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"{RUN_DIR_PREFIX}{pid}"


@dataclass
class Drain:
    """One `trident serve`'s drain: the folder its models watch (created at start, 0700,
    removed at exit), and the steps of the drain itself. `frontend`: the OpenAI
    frontend in this process, if any (its own in-flight count and cut-off)."""

    timeout_s: float
    folder: Path = field(default_factory=lambda: run_dir(os.getpid()))
    frontend: Any = None
    clock: Callable[[], float] = time.monotonic

    def create(self) -> Drain:
        if self.folder.exists():  # a dead server's, whose pid this process now has
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(mode=0o700)
        (self.folder / TIMEOUT_FILE).write_text(f"{self.timeout_s:g}")
        return self

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def start(self) -> None:
        """Refuse new work from now on: the frontend at once, the models within their
        poll (trident_common/drain.py POLL_S)."""
        if self.frontend is not None:
            self.frontend.drain()
        (self.folder / DRAINING).touch()

    def in_flight(self) -> int:
        """Requests still running: the frontend's, and each live model instance's."""
        count = self.frontend.in_flight if self.frontend is not None else 0
        for path in self.folder.glob(BUSY_PREFIX + "*"):
            pid = path.name[len(BUSY_PREFIX) :].split(".", 1)[0]
            if path.suffix == ".tmp" or not pid.isdigit() or not _alive(int(pid)):
                continue  # half written, or a stub that died (its requests died with it)
            try:
                count += int(path.read_text() or 0)
            except (OSError, ValueError):
                continue
        return count

    def wait(self, until: float) -> bool:
        """Wait for nothing in flight until the clock reaches `until`; True if so. The
        first look is after the models' poll, so each has said how busy it is."""
        time.sleep(3 * POLL_S)
        while self.in_flight() > 0:
            if self.clock() >= until:
                return False
            time.sleep(WAIT_STEP_S)
        return True

    def run(self, report: Callable[[str], None]) -> bool:
        """The whole drain; True when every answer finished, False when the timeout
        ended some (each got an explicit end)."""
        began = self.clock()
        self.start()
        report(
            f"draining: new requests are refused; the answers in flight get up to "
            f"{self.timeout_s:g} s (signal again to stop now)"
        )
        finished = self.wait(began + self.timeout_s)
        if not finished:
            # A request counts at each hop it is in (frontend, router, engine model).
            report(
                f"drain timeout: ending the answers still running "
                f"({self.in_flight()} requests in flight across the hops)"
            )
            (self.folder / CUTOFF).touch()
            self.wait(self.clock() + CUTOFF_GRACE_S - 1)
            if self.frontend is not None:
                self.frontend.cut_off()  # what the models did not end, the frontend does
                # Its last events on their way: until it has none in flight, 0.5 s at most.
                ends = self.clock() + 0.5
                while self.frontend.in_flight and self.clock() < ends:
                    time.sleep(WAIT_STEP_S)
        (self.folder / DRAINED).touch()
        report(f"drained in {self.clock() - began:.1f} s")
        return finished


class DrainRequested(BaseException):
    """The first SIGTERM, SIGINT or SIGUSR1 while serving (a BaseException, as
    KeyboardInterrupt: it must leave whatever the main thread was doing)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def drain_on_signal() -> Iterator[None]:
    """While serving: the first SIGTERM, SIGINT or SIGUSR1 raises DrainRequested; any
    signal after it raises KeyboardInterrupt (stop at once)."""
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if seen:
            signals.interrupt(signum, frame)
        seen.append(signum)
        raise DrainRequested(signum)

    with signals.handling(DRAIN_SIGNALS, handler):
        yield


# SIGUSR1: `trident drain` (a preStop hook), so that the kubelet's SIGTERM after it is
# not a second signal; SIGTERM: a supervisor's stop; SIGINT: Ctrl-C.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


# -- `trident drain` -----------------------------------------------------------------------


def find_server(pid: int | None) -> int:
    """The pid of the `trident serve` to drain: `pid`, or the only one running here."""
    if pid is not None:
        if not run_dir(pid).is_dir() or not _alive(pid):
            raise DrainError(f"no trident serve with pid {pid} here ({run_dir(pid)} not found)")
        return pid
    pids = [
        path.name[len(RUN_DIR_PREFIX) :] for path in run_dir(0).parent.glob(RUN_DIR_PREFIX + "*")
    ]
    found = sorted(int(p) for p in pids if p.isdigit() and _alive(int(p)))
    if not found:
        raise DrainError(f"no trident serve running here ({run_dir(0).parent}/{RUN_DIR_PREFIX}*)")
    if len(found) > 1:
        raise DrainError(f"{len(found)} trident serve processes here {found}: name one with --pid")
    return found[0]


def ask_to_drain(pid: int, timeout_s: float | None = None) -> bool:
    """Send the drain signal and wait for the drain to end (True), or for timeout_s
    (default: the server's drain timeout and the cut-off after it; False)."""
    folder = run_dir(pid)
    if timeout_s is None:
        try:
            timeout_s = float((folder / TIMEOUT_FILE).read_text()) + CUTOFF_GRACE_S + 2
        except (OSError, ValueError):
            timeout_s = 30.0 + CUTOFF_GRACE_S + 2
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while not (folder / DRAINED).exists() and _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(WAIT_STEP_S)
    return True
