"""The router's metric writes (bls/router_metrics.py): each is an IPC round trip from the
stub, made by a writer thread; increments that wait at once are added into one write."""

from __future__ import annotations

import threading

from bls import router_metrics


class Recorded:
    """A Triton metric that counts the writes it gets; `hold` blocks the writer thread."""

    def __init__(self, gate=None):
        self.writes, self.value, self.gate = 0, 0, gate

    def increment(self, value):
        self.writes += 1
        self.value += value

    def hold(self, _):
        self.gate.wait(5)


def test_increments_waiting_at_once_are_one_write():
    metrics = router_metrics.RouterMetrics("router")
    try:
        gate = threading.Event()
        blocker, requests = (
            metrics.metric("errors", (("reason", "x"),)),
            metrics.metric("requests", (("route", "r"), ("served_by", "b"))),
        )
        blocker.metric, requests.metric = Recorded(gate), Recorded()
        metrics.writes.put([(blocker, "hold", None)])  # the writer is busy...
        for _ in range(50):
            requests.increment(1)  # ...while 50 requests end
        gate.set()
        assert metrics.writes.flush()
        assert (requests.metric.value, requests.metric.writes) == (50, 1)
    finally:
        metrics.finalize()


def test_the_merge_keeps_sets_and_observations_in_order():
    merge = router_metrics._merge
    a, b, c = object(), object(), object()
    writes = [
        (a, "increment", 1),
        (b, "set", 2),
        (a, "increment", 2),
        (c, "observe", 0.1),
        (b, "set", 0),
        (c, "observe", 0.2),
    ]
    assert [tuple(w) for w in merge(writes)] == [
        (a, "increment", 3),
        (b, "set", 2),
        (c, "observe", 0.1),
        (b, "set", 0),
        (c, "observe", 0.2),
    ]


def test_the_routers_lost_spans_are_counted_and_nothing_is_written_when_none_were():
    metrics = router_metrics.RouterMetrics("router")
    try:
        metrics.trace_losses(0, 0)  # the common case: no series made, nothing written
        assert not {("trace_dropped", ()), ("trace_failed", ())} & set(metrics.metrics)
        dropped = metrics.metric("trace_dropped", ())
        dropped.metric = Recorded()
        metrics.trace_losses(3, 0)
        metrics.trace_losses(2, 0)
        assert metrics.writes.flush()
        assert dropped.metric.value == 5
        assert ("trace_failed", ()) not in metrics.metrics  # no failure: no series
    finally:
        metrics.finalize()
