"""Custom metrics of a Python-backend model that survive reloads of the model.

What a stub's metrics are in tritonserver 2.51 (python_backend src/metric*.cc, core
src/metric_family.cc): every `pb_utils.MetricFamily` and `Metric` a stub creates becomes
a core object in the server, but the Prometheus objects behind them are shared. The
registry hands every family of one name the same Prometheus family, and that family hands
every metric with the same labels the same series. The server counts the users of a series
per core family, not across them, so deleting a Metric frees the series as soon as *its*
family has no other user, even while another stub still writes to it: the new instance of a
reloaded model (Triton loads it before it finalizes the old one), a second instance, or the
next load after an unload whose old stub is still finalizing. Its next observe is a
use-after-free (tritonserver dies in prometheus::Histogram::Observe). Families themselves
are never removed from the registry.

So a metric created here is never deleted. Every family and metric this process creates
is pinned until the process ends: not freed in finalize(), and not at interpreter exit
either (the stub has torn down its connection to the server by then, and freeing a metric
without one crashes the stub). The next instance of a model gets the same series and
carries on counting where the last one stopped, so counters stay monotonic over reloads.
An instance closes its MetricSet in finalize(): from then on its writes are dropped, since
the series belong to its successor.

And every call into a stub's metrics is made by one thread at a time (`_calls`). In
python_backend r24.10 (src/metric.cc) `Metric.increment` and `observe` release the GIL,
then rewrite the Metric object's own shared-memory message and send it: two threads
writing one series at once free the message the other is still sending, and tritonserver
dies reading it (signal 11 in libtriton_python.so). An engine model counts a bad request on
the stub's main thread and a finished one on its send thread, both in `requests`: a client
sending bad requests beside good ones brought the whole server down within seconds. The
stub sends one metric message at a time anyway, so the lock costs no concurrency.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import triton_python_backend_utils as pb_utils

# Names of pb_utils.MetricFamily's kinds (the stub binds MetricFamily into pb_utils only
# after it imported the model's module, so it is looked up when a family is made).
COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

# Everything created here. One extra reference makes the list outlive the interpreter's
# own teardown (which frees module globals), so no metric is ever deleted from this stub.
_PINNED: list[object] = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_PINNED))

_families: dict[str, pb_utils.MetricFamily] = {}
# Held around every call into pb_utils' metrics (making a family or a series, writing one):
# see above.
_calls = threading.Lock()


def _family(name: str, description: str, kind: str) -> pb_utils.MetricFamily:
    """One family per name in this process (the server shares it by name anyway). Called
    with `_calls` held."""
    family = _families.get(name)
    if family is None:
        family = _families[name] = pb_utils.MetricFamily(
            name, description, getattr(pb_utils.MetricFamily, kind)
        )
        _PINNED.append(family)
    return family


class Metric:
    """One series, written through its MetricSet: nothing is written once it is closed."""

    __slots__ = ("_metric", "_owner")

    def __init__(self, metric: pb_utils.Metric, owner: MetricSet):
        self._metric, self._owner = metric, owner

    def increment(self, value: float) -> None:
        if self._owner.open:
            with _calls:
                self._metric.increment(value)

    def set(self, value: float) -> None:
        if self._owner.open:
            with _calls:
                self._metric.set(value)

    def observe(self, value: float) -> None:
        if self._owner.open:
            with _calls:
                self._metric.observe(value)


class MetricSet:
    """The metrics one model instance writes. Call close() in finalize()."""

    def __init__(self) -> None:
        self.open = True

    def metric(
        self,
        name: str,
        description: str,
        kind: str,
        labels: dict[str, str],
        buckets: Sequence[float] | None = None,
    ) -> Metric:
        with _calls:
            family = _family(name, description, kind)
            raw = family.Metric(labels=labels, buckets=buckets)
            _PINNED.append(raw)
        return Metric(raw, self)

    def close(self) -> None:
        """Stop writing (the series stay: the model's next instance writes them)."""
        self.open = False


class Writer:
    """Metric writes made by a thread of their own, in the order they were queued.

    A write to a Triton metric (and making a series) is an IPC round trip to the server
    that blocks its caller: an engine's event loop or the router's relays only queue
    batches of items here. `apply(item)` makes one write; `merge(items)`, if given, may
    turn the items waiting at once into fewer writes with the same result."""

    def __init__(
        self,
        name: str,
        apply: Callable[[Any], None],
        merge: Callable[[list[Any]], list[Any]] | None = None,
    ):
        self._apply, self._merge = apply, merge
        # A batch of items to write; an Event to set once the writes before it are made
        # (flush); None to stop (close).
        self._queue: queue.SimpleQueue[list[Any] | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, batch: list[Any]) -> None:
        self._queue.put(batch)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every write queued before this call was made."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Make the writes queued so far, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            waiting = [self._queue.get()]
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            pending: list[Any] = []
            for entry in waiting:
                if isinstance(entry, list):
                    pending.extend(entry)
                    continue
                self._write(pending)
                pending = []
                if entry is None:
                    return
                entry.set()
            self._write(pending)

    def _write(self, items: list[Any]) -> None:
        for item in self._merge(items) if self._merge and items else items:
            try:
                self._apply(item)
            except Exception:
                pass  # one lost sample: the writer must outlive it to keep counting
