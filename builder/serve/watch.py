"""Is the server still serving? Its Python-backend stubs, read from /proc, and the
decision whether one died (StubWatch, pure: unit-tested without a server) or hangs
(hung_stubs, on the stubs' heartbeats).

Triton 2.51 never restarts a crashed stub and keeps its model READY, so `trident serve`
watches the stubs itself and reloads the model whose stub or engine died (keeper.py).

A stub can also live on with no Python running in it: python_backend r24.10's BLS
iterators can deadlock the router's stub (trident_common/outbox.py says how; docs/router.md,
"Known limits"). The router's requests then hang forever and Triton sees nothing wrong.
Every trident model's drain thread touches a heartbeat file each second
(trident_common/drain.py); a stub of a READY model whose file is older than the hang
timeout is killed, and from there it is a death like any other.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from trident_common.drain import ALIVE_PREFIX

STUB_BINARY = "triton_python_backend_stub"
HEALTH_GAUGE = "trident_engine_healthy"  # 0: the engine died while its stub lives on
# A stub whose heartbeat (one a second) is this old is hung and killed. Generous: only a
# stub where no Python ran that long misses it (a C call that keeps the GIL, a deadlock),
# and on 2 busy cores a thread still gets the GIL within milliseconds.
HANG_TIMEOUT_S = 30.0
MIN_HANG_TIMEOUT_S = 5.0  # shorter, a stub whose beat came a second or two late would die


@dataclass(frozen=True)
class Stub:
    """A Python-backend stub process: one instance of one model."""

    pid: int
    model: str
    instance: str
    started: int  # start time, clock ticks since boot


def parse_stub(pid: int, cmdline: bytes, stat: str) -> Stub | None:
    """The stub's model and instance from its command line, or None for another process
    (or a dead stub not yet reaped: its command line is empty). 2.51 starts it as
    `stub <repo>/<model>/<version>/model.py <shm region> <size> <growth> <parent pid>
    <backend dir> <ipc handle> <instance name> <runtime modifier>`."""
    args = cmdline.split(b"\0")
    if len(args) < 9 or not args[0].endswith(STUB_BINARY.encode()):
        return None
    parts = Path(args[1].decode(errors="replace")).parts
    if len(parts) < 3:
        return None
    # /proc/<pid>/stat: "<pid> (<comm>) <state> ...", starttime is field 22.
    started = int(stat.rsplit(")", 1)[1].split()[19])
    return Stub(pid, parts[-3], args[8].decode(errors="replace"), started)


def group_processes(pgid: int):
    """/proc entries of the live processes in one process group (a server and its stubs)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid:
                yield proc
        except OSError:
            continue  # it exited while we looked


def stub_processes(pgid: int) -> dict[int, Stub]:
    """The live stubs in one process group (a server started by TritonServer)."""
    stubs = {}
    for proc in group_processes(pgid):
        try:
            stub = parse_stub(
                int(proc.name), (proc / "cmdline").read_bytes(), (proc / "stat").read_text()
            )
        except (OSError, ValueError, IndexError):
            continue  # it exited while we looked
        if stub is not None:
            stubs[stub.pid] = stub
    return stubs


def runs_in_stub(config_text: str) -> bool:
    """Whether a config.pbtxt is a Python-backend model (each instance one stub)."""
    return re.search(r'^\s*backend\s*:\s*"python"', config_text, re.MULTILINE) is not None


def unhealthy_engines(metrics_text: str) -> set[str]:
    """Models whose `trident_engine_healthy` gauge reads 0."""
    sick = set()
    for line in metrics_text.splitlines():
        if not line.startswith(HEALTH_GAUGE + "{"):
            continue
        labels, _, value = line.rpartition(" ")
        model = re.search(r'model="([^"]*)"', labels)
        if model and float(value) == 0:
            sick.add(model.group(1))
    return sick


def heartbeats(folder: Path) -> dict[int, float]:
    """The stubs' heartbeats in the server's drain folder: pid → when last touched (the
    wall clock's seconds, as os.stat gives them)."""
    beats = {}
    for path in folder.glob(ALIVE_PREFIX + "*"):
        pid = path.name[len(ALIVE_PREFIX) :]
        try:
            if pid.isdigit():
                beats[int(pid)] = path.stat().st_mtime
        except OSError:
            continue  # removed while we looked
    return beats


def forget_heartbeat(folder: Path, pid: int) -> None:
    (folder / f"{ALIVE_PREFIX}{pid}").unlink(missing_ok=True)


def hung_stubs(
    alive: dict[int, Stub], beats: dict[int, float], watched: set[str], now: float, hang_s: float
) -> list[tuple[Stub, float]]:
    """The live stubs of `watched` models whose heartbeat is older than hang_s, with its
    age in seconds. A stub without a heartbeat file is never judged: it has not started
    beating yet (a model still loading), it stopped on purpose (finalising), or it is not
    trident's."""
    hung = []
    for pid, stub in sorted(alive.items()):
        if stub.model in watched and pid in beats and now - beats[pid] > hang_s:
            hung.append((stub, now - beats[pid]))
    return hung


class Death(NamedTuple):
    """One model found dead: which, and what was seen (one line naming it)."""

    model: str
    reason: str

    def __str__(self) -> str:
        return self.reason


class StubWatch:
    """Tells a stub that died from one that exited on purpose, from snapshots of the live
    stubs, the READY models that run in stubs and the unhealthy engines, taken about once
    a second.

    A stub exits on purpose when its model is unloaded (the model leaves READY first) or
    reloaded (Triton starts the new stubs, one per instance name, before the old ones
    exit). Anything else is a death: a stub gone while its model is READY, or a READY
    model without any stub (one that died before a check saw it). An engine whose healthy
    gauge reads 0 while its model is READY counts as dead too, and so does a model that left
    READY while its gauge read 0 (a vLLM model unloads itself when its engine dies). Each is
    believed only when seen on two checks in a row: the stubs and the index cannot be read
    at one instant."""

    def __init__(self, alive: dict[int, Stub]):
        self.known = dict(alive)  # the live stubs of the last check
        self.replaced: set[int] = set()  # stubs whose model is being reloaded
        self.suspects: dict[int, Stub] = {}
        self.orphans: set[str] = set()
        self.sick: set[str] = set()
        self.ready: set[str] = set()

    def check(
        self,
        alive: dict[int, Stub],
        ready: set[str],
        unhealthy: set[str] | frozenset[str] = frozenset(),
    ) -> list[Death]:
        """The models found dead on this check, one Death each (empty when all is well).
        `ready`: the READY models that run in stubs and are to be watched (a caller leaves
        out a model it is reloading itself)."""
        for stub in alive.values():
            if stub.pid not in self.known:
                self._note_new(stub)
        gone = {
            pid: stub for pid, stub in {**self.suspects, **self.known}.items() if pid not in alive
        }
        suspects = {pid: stub for pid, stub in gone.items() if self._died(stub, alive, ready)}
        dead = [stub for pid, stub in suspects.items() if pid in self.suspects]
        orphans = {
            model for model in ready if not any(stub.model == model for stub in alive.values())
        }
        sick = {model for model in unhealthy if model in ready}
        confirmed_orphans, confirmed_sick = orphans & self.orphans, sick & self.sick
        # Gone from READY with a dead engine: it unloaded itself (the gauge keeps its value).
        unloaded = {model for model in (self.ready - ready) & unhealthy}
        self.known, self.suspects = dict(alive), suspects
        self.orphans, self.sick, self.ready = orphans, sick, set(ready)
        self.replaced &= set(alive)
        deaths: dict[str, str] = {}
        for stub in sorted(dead, key=lambda s: (s.model, s.instance)):
            deaths.setdefault(
                stub.model, f"the stub of model '{stub.model}' (instance {stub.instance}) died"
            )
        for model in sorted(confirmed_orphans):
            deaths.setdefault(model, f"the stub of model '{model}' died")
        for model in sorted(confirmed_sick):
            deaths.setdefault(model, f"the engine of model '{model}' died ({HEALTH_GAUGE} is 0)")
        for model in sorted(unloaded):
            deaths.setdefault(
                model,
                f"the engine of model '{model}' died "
                f"({HEALTH_GAUGE} is 0) and the model unloaded itself",
            )
        return [Death(model, reason) for model, reason in sorted(deaths.items())]

    def _note_new(self, new: Stub) -> None:
        """A second stub for one instance: its model is being reloaded, and every older
        stub of that model will exit."""
        if any(
            old.model == new.model and old.instance == new.instance for old in self.known.values()
        ):
            self.replaced.update(
                pid
                for pid, old in self.known.items()
                if old.model == new.model and old.started <= new.started
            )

    def _died(self, stub: Stub, alive: dict[int, Stub], ready: set[str]) -> bool:
        return (
            stub.model in ready
            and stub.pid not in self.replaced
            and not any(
                other.model == stub.model and other.instance == stub.instance
                for other in alive.values()
            )
        )
