"""A model's view of `trident serve`'s drain, through files in one folder.

`trident serve` (builder/serve/drain.py) names the folder in tritonserver's environment
(interface.DRAIN_DIR_ENV); every stub inherits it and hands it to its DrainWatch. The
server writes, the models read:

- `draining`: take no new request (the router none at all; an engine model none but the
  router's, which finish requests admitted before the drain: their fallbacks included);
- `cutoff`: the drain's timeout passed: end every answer still running with an error
  (error_classes.SHUTDOWN) and take nothing more.

While draining, each model instance writes how many requests it has in flight to
`busy.<pid>.<instance>`, so the server knows when nothing is left. A thread polls the
folder: a request pays one attribute read, never a system call.

The same thread touches `alive.<pid>` every BEAT_S, always: the stub's heartbeat. It is
Python, so it stops when no Python runs in the stub, and `trident serve` kills a stub
whose heartbeat went stale (builder/serve/watch.py says why a live process can be hung).
No import from Triton or trident: the builder imports this module too, for the names.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

DRAINING, CUTOFF, BUSY_PREFIX, ALIVE_PREFIX = "draining", "cutoff", "busy.", "alive."
# How stale a model's view of the drain may be: new requests are refused within this of
# the server's signal, and the busy counts it reads are this fresh.
POLL_S = 0.1
BEAT_S = 1.0  # how often the heartbeat file is touched


class DrainWatch:
    """`draining` and `cut` as the server last said; `on_cutoff` runs once, on this
    watch's thread, when the drain's timeout passes."""

    def __init__(
        self,
        folder: str | None,
        instance: str,
        busy: Callable[[], int],
        on_cutoff: Callable[[], object] = lambda: None,
        poll_s: float = POLL_S,
    ) -> None:
        """folder: the server's (None: it never drains, nothing is watched)."""
        self.draining = self.cut = False
        self.folder = folder
        self.busy, self.on_cutoff, self.poll_s = busy, on_cutoff, poll_s
        self.busy_file = f"{BUSY_PREFIX}{os.getpid()}.{instance}"
        self.alive_file = f"{ALIVE_PREFIX}{os.getpid()}"
        self.next_beat = 0.0
        self.published: int | None = None
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        if self.folder:
            self.thread = threading.Thread(target=self._watch, name="drain-watch", daemon=True)
            self.thread.start()

    def close(self) -> None:
        """Stop watching; this instance has nothing in flight any more."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(2 * self.poll_s + 1)
        # A stub that finalises beats no more but is not hung: no heartbeat, not judged.
        if self.folder:
            stale = [self.alive_file] + ([self.busy_file] if self.published is not None else [])
            for name in stale:
                try:
                    os.unlink(os.path.join(self.folder, name))
                except OSError:
                    pass
        # The callbacks hold the model (a cycle through it): let go of them, so the model
        # is freed when Triton drops it. Left to the garbage collector, it would be freed
        # at the stub's exit, after its link to the server is gone: a segfault there.
        self.busy, self.on_cutoff = _nothing_busy, _nothing

    def _watch(self) -> None:
        assert self.folder is not None
        while True:
            try:
                self.beat()
                self.check()
            except Exception:  # noqa: BLE001 - a watch that dies would never drain
                pass
            if self.stopped.wait(self.poll_s):
                return

    def beat(self) -> None:
        """Touch the heartbeat file, at most every BEAT_S (the thread's step)."""
        now = time.monotonic()
        if now < self.next_beat or self.stopped.is_set():
            return
        self.next_beat = now + BEAT_S
        path = os.path.join(self.folder or "", self.alive_file)
        try:
            os.utime(path)
        except FileNotFoundError:  # the first beat, or the server removed a stale one
            open(path, "w").close()

    def check(self) -> None:
        """One look at the folder (the thread's step; tests call it directly)."""
        assert self.folder is not None
        if not self.draining and os.path.exists(os.path.join(self.folder, DRAINING)):
            self.draining = True
        if self.draining and not self.cut and os.path.exists(os.path.join(self.folder, CUTOFF)):
            self.cut = True
            self.on_cutoff()
        if self.draining:
            self._publish(self.busy())

    def _publish(self, count: int) -> None:
        if count == self.published:
            return
        path = os.path.join(self.folder or "", self.busy_file)
        # One temporary file per thread: tests call check() beside the watch's thread.
        temporary = f"{path}.{threading.get_ident()}.tmp"
        with open(temporary, "w") as f:
            f.write(str(count))
        os.replace(temporary, path)  # the server never reads half a number
        self.published = count


def _nothing_busy() -> int:
    return 0


def _nothing() -> None:
    return None
