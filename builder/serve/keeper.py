"""Keep a running tritonserver's models serving: a model whose stub or engine died is
reloaded in place through the repository API (unload + load), with backoff, and given up
after a limit; the other models are not touched, and the server runs on. Only
tritonserver's own exit ends `trident serve`.

Why here and not in Triton: 2.51 never restarts a crashed stub and keeps its model READY
(requests then fail with "Stub process ... is not healthy"), and exiting the whole server
for one model's fault took every model of every engine down with it. The router falls back
to its other backends while one reloads.

A stub that hangs (its heartbeat older than the hang timeout: watch.py) is killed, and
is a death from then on.

Restarts (the policy) is pure; keep_serving is the loop, on a server object that
server.py's TritonServer provides (this module does not import it).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from builder.serve import loading
from builder.serve.watch import (
    HANG_TIMEOUT_S,
    HEALTH_GAUGE,
    Stub,
    StubWatch,
    forget_heartbeat,
    heartbeats,
    hung_stubs,
    stub_processes,
    unhealthy_engines,
)

RESTART_LIMIT = 5  # restarts in a row, then the model is given up
FIRST_DELAY_S = 1.0  # before the first reload; doubled for each further one
MAX_DELAY_S = 30.0
STABLE_S = 120.0  # a model that served this long after a reload starts afresh
UNLOAD_TIMEOUT_S = 60.0
RELOAD_TIMEOUT_S = 600.0  # a vLLM model takes 20-60 s to load on a loaded 2-core machine
# The engine health gauge of a reloaded model may still read the old instance's 0 for a
# moment after the load: a gauge-only death is not believed this soon after a reload.
GAUGE_GRACE_S = 10.0


@dataclass
class Restarts:
    """How long to wait before reloading a model that died, or that it is given up."""

    limit: int = RESTART_LIMIT
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    stable_s: float = STABLE_S
    counts: dict[str, int] = field(default_factory=dict)
    back_at: dict[str, float] = field(default_factory=dict)  # when each came back last

    def after_death(self, model: str, now: float) -> float | None:
        """Seconds to wait before reloading `model`, or None: it died `limit` times in a
        row (each time within stable_s of coming back) and is given up."""
        if now - self.back_at.get(model, now) >= self.stable_s:
            self.counts[model] = 0
        count = self.counts.get(model, 0) + 1
        self.counts[model] = count
        if count > self.limit:
            return None
        return min(self.first_delay_s * 2 ** (count - 1), self.max_delay_s)

    def came_back(self, model: str, now: float) -> None:
        self.back_at[model] = now


class Server(Protocol):
    @property
    def http_url(self) -> str: ...

    @property
    def admin_headers(self) -> Mapping[str, str]: ...  # model control needs them

    @property
    def process(self) -> subprocess.Popen | None: ...

    def ready_models(self) -> set[str] | None: ...

    def stub_models(self) -> set[str]: ...

    def metrics_text(self) -> str: ...

    @property
    def drain_folder(self) -> Path | None: ...  # the stubs' heartbeats are there


def reload(
    http_url: str, model: str, headers: Mapping[str, str], timeout_s: float = RELOAD_TIMEOUT_S
) -> None:
    """Unload then load one model; raises loading.LoadFailed or OSError when the load
    does not succeed. The unload may fail (a vLLM model whose engine died unloads itself):
    the load is what counts."""
    try:
        loading.request(http_url, model, "unload", UNLOAD_TIMEOUT_S, headers)
    except (loading.LoadFailed, OSError):
        pass
    loading.request(http_url, model, "load", timeout_s, headers)


def keep_serving(
    server: Server,
    report: Callable[[str], None],
    interval_s: float = 1.0,
    restarts: Restarts | None = None,
    reload_model: Callable[[str, str, Mapping[str, str]], None] = reload,
    lost: Callable[[str], None] = lambda _model: None,
    hang_s: float = HANG_TIMEOUT_S,
    kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL),
) -> int:
    """Watch the server's models until tritonserver exits; returns its exit status.
    `report` gets one line per event (a death, a hung stub killed, a reload, a model given
    up); `lost(model)` is told of each death first (the frontend ends what it still waits
    for from it). hang_s: a stub whose heartbeat is older is killed (0: never)."""
    process = server.process
    assert process is not None, "keep_serving needs a started server"
    try:
        watch = StubWatch(stub_processes(process.pid))
    except OSError:  # out of file descriptors: a READY model without a stub is seen later
        watch = StubWatch({})
    keeper = _Keeper(
        server, process.pid, report, restarts or Restarts(), reload_model, lost, watch, hang_s, kill
    )
    failing: str | None = None  # the keeper's own trouble, reported once until it passes
    while True:
        try:
            return process.wait(interval_s)
        except subprocess.TimeoutExpired:
            pass  # still running
        # The keeper's own failures (out of file descriptors, threads or memory; a
        # bug) never end the server: it serves on unwatched, and the keeper tries again.
        try:
            keeper.look(time.monotonic())
        except Exception as e:  # noqa: BLE001 - whatever it is, the server outlives it
            problem = f"{type(e).__name__}: {e}"
            if problem != failing:
                report(f"trident serve: the keeper cannot watch the models ({problem}); retrying")
            failing = problem
        else:
            if failing is not None:
                report("trident serve: the keeper watches the models again")
            failing = None


@dataclass
class _Keeper:
    """keep_serving's watch of the models: what each look at the server shares."""

    server: Server
    pid: int
    report: Callable[[str], None]
    restarts: Restarts
    reload_model: Callable[[str, str, Mapping[str, str]], None]
    lost: Callable[[str], None]
    watch: StubWatch
    hang_s: float
    kill: Callable[[int], None]
    due: dict[str, float] = field(default_factory=dict)  # model → when to reload it
    # model → when its reload began (one at a time)
    reloading: dict[str, float] = field(default_factory=dict)
    results: queue.Queue = field(default_factory=queue.Queue)
    # Models given up → whether they were seen unloaded since: one READY again after
    # that was loaded by an operator, and is watched again.
    given_up: dict[str, bool] = field(default_factory=dict)
    # model → until when a gauge-only death is ignored
    grace: dict[str, float] = field(default_factory=dict)

    def died(self, model: str, reason: str, now: float) -> None:
        self.lost(model)
        delay = self.restarts.after_death(model, now)
        if delay is None:
            self.given_up[model] = False
            self.report(
                f"trident serve: {reason}; giving up on model '{model}' after "
                f"{self.restarts.limit} restarts: it is unloaded, the other models keep "
                "serving"
            )
            threading.Thread(
                target=_unload_quietly,
                daemon=True,
                args=(self.server.http_url, model, self.server.admin_headers),
            ).start()
            return
        self.due[model] = now + delay
        self.report(
            f"trident serve: {reason}; reloading it in {delay:.0f} s (restart "
            f"{self.restarts.counts[model]} of {self.restarts.limit})"
        )

    def look(self, now: float) -> None:
        self.take_reload_results(now)
        alive = stub_processes(self.pid)
        ready = self.server.ready_models()
        if ready is None:
            return  # busy or shutting down: look again next time
        self.check_given_up(ready)
        busy = set(self.due) | set(self.reloading) | set(self.given_up)
        watched = (ready & self.server.stub_models()) - busy
        self.kill_hung(alive, watched)
        unhealthy = unhealthy_engines(self.server.metrics_text())
        for death in self.watch.check(alive, watched, unhealthy):
            gauge_only = HEALTH_GAUGE in death.reason
            if death.model in busy or (gauge_only and now < self.grace.get(death.model, 0)):
                continue
            self.died(death.model, death.reason, now)
        if not self.reloading:
            self.start_due_reload(now)

    def kill_hung(self, alive: dict[int, Stub], watched: set[str]) -> None:
        """Kill the stubs that hang; their death is seen on the next looks. Each one's
        heartbeat file goes with it (judged once; a later process with its pid is not)."""
        folder = self.server.drain_folder
        if not self.hang_s or folder is None:
            return
        for stub, age_s in hung_stubs(alive, heartbeats(folder), watched, time.time(), self.hang_s):
            self.report(
                f"trident serve: the stub of model '{stub.model}' (instance {stub.instance}) "
                f"hangs: no Python ran in it for {age_s:.0f} s (its heartbeat); killing it"
            )
            try:
                self.kill(stub.pid)
            except ProcessLookupError:
                pass  # gone meanwhile: a death all the same
            forget_heartbeat(folder, stub.pid)

    def take_reload_results(self, now: float) -> None:
        while not self.results.empty():
            model, error = self.results.get()
            started = self.reloading.pop(model)
            if error is None:
                self.restarts.came_back(model, now)
                self.grace[model] = now + GAUGE_GRACE_S
                self.report(
                    f"trident serve: model '{model}' is back (reloaded in {now - started:.1f} s)"
                )
            else:
                self.died(model, f"reloading model '{model}' failed: {error}", now)

    def check_given_up(self, ready: set[str]) -> None:
        for model, seen_gone in list(self.given_up.items()):
            if model not in ready:
                self.given_up[model] = True
            elif seen_gone:
                del self.given_up[model]
                self.restarts.counts[model] = 0
                self.report(f"trident serve: model '{model}' was loaded again; watching it again")

    def start_due_reload(self, now: float) -> None:
        ready_now = sorted((at, model) for model, at in self.due.items() if at <= now)
        if not ready_now:
            return
        model = ready_now[0][1]
        del self.due[model]
        self.reloading[model] = now
        threading.Thread(
            target=_reload_into,
            daemon=True,
            name=f"reload-{model}",
            args=(self.reload_model, self.server, model, self.results),
        ).start()


def _reload_into(reload_model, server: Server, model: str, results: queue.Queue) -> None:
    try:
        reload_model(server.http_url, model, server.admin_headers)
    except (loading.LoadFailed, OSError) as e:
        results.put((model, str(e) or type(e).__name__))
    else:
        results.put((model, None))


def _unload_quietly(http_url: str, model: str, headers: Mapping[str, str]) -> None:
    try:
        loading.request(http_url, model, "unload", UNLOAD_TIMEOUT_S, headers)
    except (loading.LoadFailed, OSError):
        pass  # the server is going away, or the model already is
