"""The router's Prometheus metrics, on Triton's metrics port.

Every write of a Triton metric is an IPC round trip from the stub to the server that
blocks its caller. The router's event loop and relay threads only queue their writes;
one thread of the router's own makes them, in order (Writes)."""
import queue
import threading

from breaker import STATE_VALUES
from trident_common.metrics import COUNTER, GAUGE, HISTOGRAM, MetricSet


class Writes:
    """Metric writes made by a thread of their own, in the order they were queued."""

    def __init__(self):
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="router-metrics", daemon=True)
        self.thread.start()

    def put(self, series, op, value):
        self.queue.put((series, op, value))

    def flush(self, timeout=5.0):
        """Wait until every write queued before this call was made."""
        done = threading.Event()
        self.queue.put(done)
        return done.wait(timeout)

    def close(self, timeout=5.0):
        self.queue.put(None)
        self.thread.join(timeout)

    def _run(self):
        while (item := self.queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            series, op, value = item
            try:
                if series.metric is None:
                    series.metric = series.create()   # also an IPC call: made here
                getattr(series.metric, op)(value)
            except Exception:
                pass   # a metric must never break the router (the server is stopping)


class Series:
    """One labelled series; its writes go through Writes."""

    __slots__ = ("create", "metric", "writes")

    def __init__(self, create, writes):
        self.create, self.metric, self.writes = create, None, writes

    def increment(self, value):
        self.writes.put(self, "increment", value)

    def set(self, value):
        self.writes.put(self, "set", value)

    def observe(self, value):
        self.writes.put(self, "observe", value)


class RouterMetrics:
    """Requests by route and backend, fallbacks, aborts, errors, breaker states, added
    latency. Label sets are created lazily; like every trident metric they outlive this
    instance (see trident_common.metrics)."""

    FAMILIES = {   # kind: (name, description, metric kind)
        "requests": ("trident_router_requests_total",
                     "Requests routed, by route and serving backend", COUNTER),
        "fallbacks": ("trident_router_fallbacks_total",
                      "Requests moved to the next candidate after this backend failed "
                      "before its first token", COUNTER),
        "aborts": ("trident_router_aborts_total",
                   "Aborts sent to a backend (client cancel, timeout, deadline)", COUNTER),
        "errors": ("trident_router_errors_total",
                   "Requests the router answered with an error, by reason", COUNTER),
        "breaker": ("trident_router_breaker_state",
                    "Circuit breaker per backend: 0 closed, 1 half-open, 2 open", GAUGE),
        "latency": ("trident_router_added_latency_seconds",
                    "Router time on the first-token path (before the backend call and "
                    "relaying its first response)", HISTOGRAM),
    }

    def __init__(self, router):
        self.router = router
        self.set = MetricSet()
        self.writes = Writes()
        self.metrics = {}
        self._latency = self.metric("latency", (), buckets=[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1])

    def metric(self, kind, labels, buckets=None, families=None):
        """The series of family `kind` (in `families`, else FAMILIES) with the router's
        label and `labels`, created on first use. TenantMetrics' families live here too."""
        key = (kind, labels)
        metric = self.metrics.get(key)
        if metric is None:
            name, description, metric_kind = (families or self.FAMILIES)[kind]
            labelled = {"router": self.router, **dict(labels)}
            metric = self.metrics[key] = Series(lambda: self.set.metric(
                name, description, metric_kind, labelled, buckets), self.writes)
        return metric

    def request(self, route, backend):
        self.metric("requests", (("route", route), ("served_by", backend))).increment(1)

    def fallback(self, backend):
        self.metric("fallbacks", (("backend", backend),)).increment(1)

    def abort(self, backend):
        self.metric("aborts", (("backend", backend),)).increment(1)

    def error(self, reason):
        self.metric("errors", (("reason", reason),)).increment(1)

    def breaker_state(self, backend, state):
        self.metric("breaker", (("backend", backend),)).set(STATE_VALUES[state])

    def added_latency(self, seconds):
        self._latency.observe(seconds)

    def finalize(self):
        self.writes.close()   # what was queued is written first
        self.set.close()      # the series stay for the router's next instance
