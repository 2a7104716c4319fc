"""The run's ledger of what makes the suite slow: every tritonserver start and every
engine load, with how long each took, and the budget they must stay within.

Server starts are recorded where they happen: a TritonServer started in this process
(tests/conftest.py wraps its start and wait_ready), and a `trident serve` or demo
subprocess started through tests.helpers.servers.spawn (its own self-test server counts
too, unless it runs with --no-self-test). Engine loads are read afterwards from those
servers' logs: every engine model writes `[<engine>] Starting the engine of model X`
and `[<engine>] The engine of model X is ready` (trident_common/engine_model.py), so a
reload by `trident serve`'s keeper or through model control counts as well.

The budget is the one place that says how many starts a run may cost: a test that adds
a private server or another real vLLM engine makes the run fail here, so the cost is
a decision someone names (tests/README.md says how to add a server test).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

# What one full run may cost: the counts of the last full run that changed them (each
# run prints its own beside these). The tritonservers: one process each for the two
# real-vLLM configurations (default, fallback); one process in the servers lane serving
# every other pooled repository in turn (tests/helpers/pool.py), plus the second of
# test_tenants' two servers; and the `trident serve` subprocesses whose subject is a
# process of its own: the demo and the self-test refusal (each with its self-test's
# server: the demo's is the proof that the self-test passes here), blast radius (twice:
# its subject includes serve starting a killed tritonserver again in place), the shared
# `served` process (tests/server/served.py), and the self-test's throwaway server of a
# dying stub. The fourth real vLLM load is test_vllm_kv_events' engine outside
# any server. These numbers only come down (issue 33 asked for at most 12 and 4). None is
# left for the pool's replacement process (when a repository's model will not unload
# within 60 s): that is a defect to fix, not a cost. The one seen (the router after
# test_openai_tools' refusals, 1 full run in 4) was the frontend cancelling a call Triton
# had already answered (builder/serve/openai/triton.py, Call.cancel).
BUDGET = {
    "tritonserver starts": 12,
    "real vLLM loads": 4,
    "vLLM reloads": 2,
}
SLOWEST_SHOWN = 8
LEDGER_CACHE_KEY = "trident/ledger"  # where the run's whole ledger is kept (pytest's cache)
# What support/engine_doubles' AsyncLLM writes to its server's log when it starts, and
# the engine name the ledger then gives the load.
DOUBLE_MARK = "[vllm double]"
VLLM_DOUBLE = "vllm double"

# Triton's log prefix: level, MMDD, time, thread, source, then the message.
_LINE = re.compile(
    r"^[IWE]\d{4} (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d\.\d+) .*?"
    r"\[(?P<engine>\w+)\] (?P<what>Starting the engine|The engine) of model "
    r"(?P<model>[^\s\"]+?)(?P<ready> is ready)?\"?$"
)


@dataclass
class Start:
    # "tritonserver", "self-test", "trident serve", or "repository swap": a pooled
    # process given another repository (tests/helpers/pool.py), no tritonserver started.
    kind: str
    label: str  # what it serves: the repository's folder, or the command
    log: Path | None  # where its output (and its engines' lines) went
    since: int = 0  # the log's size when it began: its engines' lines come after
    began: float = field(default_factory=time.monotonic)
    seconds: float | None = None  # to ready; None: it never became ready
    tritonservers: int = 1  # a `trident serve` subprocess may start a self-test server too
    # The test it started in (pytest's PYTEST_CURRENT_TEST), or a fixture's first user.
    test: str = field(default_factory=lambda: os.environ.get("PYTEST_CURRENT_TEST", "?"))

    def ready(self) -> None:
        if self.seconds is None:
            self.seconds = time.monotonic() - self.began


@dataclass(frozen=True)
class EngineLoad:
    engine: str  # the model's log tag: vllm, sglang (the double here), ...
    model: str
    seconds: float | None  # None: the log shows no ready line (it failed, or was cut)
    log: Path
    since: int = 0  # where in the log its server's repository began (a start or a swap)
    where: str = "no server"  # that repository (the start's or swap's label)


def _clock(match: re.Match) -> float:
    return int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])


def engine_loads(log: Path, since: int = 0, until: int | None = None) -> list[EngineLoad]:
    """Every engine load one server's log shows, in order, between two byte offsets (the
    part one repository of a pooled process wrote). A vLLM load whose engine is the paced
    AsyncLLM double (it says so in the log, DOUBLE_MARK) is the double's: trident's vLLM
    model ran, vLLM did not."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            text = f.read(-1 if until is None else max(until - since, 0))
    except OSError:
        return []
    lines = text.decode(errors="replace").splitlines()
    loads: list[EngineLoad] = []
    pending: dict[tuple[str, str], float] = {}  # (engine, model) -> when it started
    doubles: set[tuple[str, str]] = set()  # pending vLLM loads the double announced

    def load(key: tuple[str, str], seconds: float | None) -> EngineLoad:
        engine = VLLM_DOUBLE if key in doubles else key[0]
        doubles.discard(key)
        return EngineLoad(engine, key[1], seconds, log, since)

    for line in lines:
        if DOUBLE_MARK in line:
            doubles.update(key for key in pending if key[0] == "vllm")
            continue
        match = _LINE.match(line.strip())
        if match is None:
            continue
        key = (match["engine"], match["model"])
        if match["what"] == "Starting the engine":
            if key in pending:  # started again before it was ready: the first failed
                loads.append(load(key, None))
            pending[key] = _clock(match)
        elif match["ready"] and key in pending:
            seconds = (_clock(match) - pending.pop(key)) % 86400  # past midnight
            loads.append(load(key, seconds))
    loads += [load(key, None) for key in pending]
    return loads


class Ledger:
    def __init__(self) -> None:
        self.starts: list[Start] = []
        self.direct_loads: list[EngineLoad] = []  # engines a test runs without a server

    def engine_without_server(self, engine: str, label: str, seconds: float) -> None:
        """An engine a test starts in a process of its own, outside tritonserver."""
        self.direct_loads.append(EngineLoad(engine, label, seconds, Path(label)))

    def record(self, kind: str, label: str, log: Path | None, tritonservers: int = 1) -> Start:
        since = log.stat().st_size if log is not None and log.exists() else 0
        start = Start(kind, label, log, since, tritonservers=tritonservers)
        self.starts.append(start)
        return start

    def to_json(self) -> dict:
        """What a pytest-xdist worker hands the controller (the logs stay on disk)."""
        return {
            "starts": [
                [
                    s.kind,
                    s.label,
                    None if s.log is None else str(s.log),
                    s.seconds,
                    s.tritonservers,
                    s.test,
                    s.since,
                ]
                for s in self.starts
            ],
            "direct": [[e.engine, e.model, e.seconds] for e in self.direct_loads],
        }

    def merge(self, data: dict) -> None:
        """A worker's ledger into this one (the controller's, which prints the run's)."""
        for kind, label, log, seconds, tritonservers, test, since in data["starts"]:
            start = self.record(kind, label, None if log is None else Path(log), tritonservers)
            start.seconds, start.test, start.since = seconds, test, since
        for engine, label, seconds in data["direct"]:
            self.engine_without_server(engine, label, seconds)

    def engine_loads(self) -> list[EngineLoad]:
        """Each start's or swap's loads: its log from where it began to where the next
        one on the same log began."""
        spans: dict[Path, dict[int, str]] = {}  # log -> where each repository began -> its label
        for s in self.starts:
            if s.log is not None:
                spans.setdefault(s.log, {})[s.since] = s.label
        loads = []
        for log, labels in spans.items():
            edges = sorted(labels)
            for since, until in zip(edges, [*edges[1:], None], strict=True):
                loads += [
                    dataclasses.replace(load, where=labels[since])
                    for load in engine_loads(log, since, until)
                ]
        return loads + self.direct_loads

    def counts(self) -> dict[str, int]:
        """A model's first load in a server's repository (after its start or its swap) is
        a load; loading it again there (model control, or `trident serve`'s keeper after
        a death) is a reload. A vLLM load
        that never became ready (a model that fails to load, on purpose) is neither:
        the summary lists it."""
        seen: set[tuple[Path, int, str]] = set()
        counts = dict.fromkeys(("real vLLM loads", "vLLM reloads", "engine double loads"), 0)
        for load in self.engine_loads():
            if load.engine != "vllm":
                counts["engine double loads"] += 1
            elif load.seconds is not None:
                first = (load.log, load.since, load.model) not in seen
                seen.add((load.log, load.since, load.model))
                counts["real vLLM loads" if first else "vLLM reloads"] += 1
        return {
            "tritonserver starts": sum(s.tritonservers for s in self.starts),
            "repository swaps": sum(s.kind == "repository swap" for s in self.starts),
            **counts,
        }

    def over_budget(self) -> list[str]:
        counts = self.counts()
        return [
            f"{what}: {counts[what]} > budget {limit} (tests/helpers/ledger.py)"
            for what, limit in BUDGET.items()
            if counts[what] > limit
        ]

    def every_start(self) -> list[str]:
        """Each start (per worker, in order) with the test it began in: which was extra."""
        return [
            f"  {s.kind:14} x{s.tritonservers} {s.label}  <- {s.test}"
            for s in self.starts
            if s.tritonservers
        ]

    def summary(self) -> list[str]:
        """The lines printed at the end of the run."""
        counts = self.counts()
        lines = [
            ", ".join(
                f"{what}: {n}" + (f" (budget {BUDGET[what]})" if what in BUDGET else "")
                for what, n in counts.items()
            )
        ]
        if not self.starts:
            return lines
        lines.append(
            f"server time to ready: {sum(s.seconds or 0 for s in self.starts):.0f} s; slowest:"
        )
        slowest = sorted(self.starts, key=lambda s: -(s.seconds or 0))[:SLOWEST_SHOWN]
        for s in slowest:
            took = "never ready" if s.seconds is None else f"{s.seconds:6.1f} s"
            lines.append(f"  {took}  {s.kind:14} {s.label}")
        loads = sorted(self.engine_loads(), key=lambda e: -(e.seconds or 0))[:SLOWEST_SHOWN]
        if loads:
            lines.append("engine loads, slowest:")
        for e in loads:
            took = "not ready" if e.seconds is None else f"{e.seconds:6.1f} s"
            lines.append(f"  {took}  {e.engine:14} {e.model} ({e.where})")
        return lines


LEDGER = Ledger()  # one per pytest process
