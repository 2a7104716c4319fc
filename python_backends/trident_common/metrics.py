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
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

import triton_python_backend_utils as pb_utils

# Names of pb_utils.MetricFamily's kinds (the stub binds MetricFamily into pb_utils only
# after it imported the model's module, so it is looked up when a family is made).
COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

# Everything created here. One extra reference makes the list outlive the interpreter's
# own teardown (which frees module globals), so no metric is ever deleted from this stub.
_PINNED: list = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_PINNED))

_families: dict[str, "pb_utils.MetricFamily"] = {}
_lock = threading.Lock()


def _family(name: str, description: str, kind: str) -> "pb_utils.MetricFamily":
    """One family per name in this process (the server shares it by name anyway)."""
    with _lock:
        family = _families.get(name)
        if family is None:
            family = _families[name] = pb_utils.MetricFamily(
                name, description, getattr(pb_utils.MetricFamily, kind))
            _PINNED.append(family)
        return family


class Metric:
    """One series, written through its MetricSet: nothing is written once it is closed."""

    __slots__ = ("_metric", "_owner")

    def __init__(self, metric, owner: "MetricSet"):
        self._metric, self._owner = metric, owner

    def increment(self, value: float) -> None:
        if self._owner.open:
            self._metric.increment(value)

    def set(self, value: float) -> None:
        if self._owner.open:
            self._metric.set(value)

    def observe(self, value: float) -> None:
        if self._owner.open:
            self._metric.observe(value)


class MetricSet:
    """The metrics one model instance writes. Call close() in finalize()."""

    def __init__(self):
        self.open = True

    def metric(self, name: str, description: str, kind: str, labels: dict,
               buckets: Optional[list] = None) -> Metric:
        family = _family(name, description, kind)
        raw = family.Metric(labels=labels, buckets=buckets)
        _PINNED.append(raw)
        return Metric(raw, self)

    def close(self) -> None:
        """Stop writing (the series stay: the model's next instance writes them)."""
        self.open = False
