"""The router's Prometheus metrics, on Triton's metrics port.

Every write of a Triton metric is an IPC round trip from the stub to the server that
blocks its caller. The router's event loop and relay threads only queue their writes;
a trident_common.metrics.Writer thread makes them, in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from bls.breaker import STATE_VALUES
from trident_common.metrics import COUNTER, GAUGE, HISTOGRAM, Metric, MetricSet, Writer

if TYPE_CHECKING:
    # One queued write: (series, op, value), op the name of a Metric method; _merge sums a
    # series' increments into a list of the same three.
    Write = tuple["Series", str, float] | list[Any]
    Labels = tuple[tuple[str, str], ...]
    Family = tuple[str, str, str]  # (name, description, metric kind)


def _apply(write: Write) -> None:
    """One queued write: (series, op, value); the series is made on its first write."""
    series, op, value = write
    if series.metric is None:
        series.metric = series.create()
    getattr(series.metric, op)(value)


def _merge(writes: list[Write]) -> list[Write]:
    """The writes waiting at once, each series' increments added into one write (at its
    first's place: counters commute); sets and observations kept as they are. Under load
    the router's per-request counters then cost one round trip per batch, not each."""
    merged: list[Write] = []
    added: dict[Series, list[Any]] = {}
    for write in writes:
        series, op, value = write
        if op != "increment":
            merged.append(write)
        elif series in added:
            added[series][2] += value
        else:
            added[series] = [series, op, value]
            merged.append(added[series])
    return merged


class Series:
    """One labelled series; its writes go through the router's Writer."""

    __slots__ = ("create", "metric", "writes")
    metric: Metric | None  # made on its first write (_apply)

    def __init__(self, create: Callable[[], Metric], writes: Writer) -> None:
        self.create, self.metric, self.writes = create, None, writes

    def increment(self, value: float) -> None:
        self.writes.put([(self, "increment", value)])

    def set(self, value: float) -> None:
        self.writes.put([(self, "set", value)])

    def observe(self, value: float) -> None:
        self.writes.put([(self, "observe", value)])


class RouterMetrics:
    """Requests by route and backend, fallbacks, aborts, errors, breaker states, added
    latency. Label sets are created lazily; like every trident metric they outlive this
    instance (see trident_common.metrics)."""

    FAMILIES: ClassVar[dict[str, Family]] = {  # kind: (name, description, metric kind)
        "requests": (
            "trident_router_requests_total",
            "Requests routed, by route and serving backend",
            COUNTER,
        ),
        "fallbacks": (
            "trident_router_fallbacks_total",
            "Requests moved to the next candidate after this backend failed before its first token",
            COUNTER,
        ),
        "aborts": (
            "trident_router_aborts_total",
            "Aborts sent to a backend (client cancel, timeout, deadline)",
            COUNTER,
        ),
        "errors": (
            "trident_router_errors_total",
            "Requests the router answered with an error, by reason",
            COUNTER,
        ),
        "breaker": (
            "trident_router_breaker_state",
            "Circuit breaker per backend: 0 closed, 1 half-open, 2 open",
            GAUGE,
        ),
        "latency": (
            "trident_router_added_latency_seconds",
            "Router time on the first-token path (before the backend call and "
            "relaying its first response)",
            HISTOGRAM,
        ),
        # Traces on only (trident_common/tracing.py): the router's spans that never
        # reached the collector, as the engine models count theirs.
        "trace_dropped": (
            "trident_router_trace_spans_dropped_total",
            "Spans of the router dropped: its export queue was full",
            COUNTER,
        ),
        "trace_failed": (
            "trident_router_trace_spans_export_failed_total",
            "Spans of the router the collector refused or did not take in time",
            COUNTER,
        ),
        # Replicas (bls/replicas.py): how each request's replica was chosen.
        "replica_requests": (
            "trident_router_replica_requests_total",
            "Requests a replica took, by backend, policy and reason "
            "(affinity, prefix, spill, load, round_robin, fallback)",
            COUNTER,
        ),
        "matched_blocks": (
            "trident_router_replica_matched_blocks",
            "Prompt blocks (128 characters) the chosen replica's prefix index matched",
            HISTOGRAM,
        ),
        "decision": (
            "trident_router_replica_decision_seconds",
            "Time to choose a replica: hashing the prompt, matching, scoring",
            HISTOGRAM,
        ),
        "index_blocks": (
            "trident_router_replica_index_blocks",
            "Blocks in this router instance's prefix index per replica",
            GAUGE,
        ),
        "index_updated": (
            "trident_router_replica_index_updated_timestamp_seconds",
            "Unix time of the last prompt recorded for a replica (its age: time() minus this)",
            GAUGE,
        ),
    }
    MATCHED_BUCKETS: ClassVar[list[float]] = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    DECISION_BUCKETS: ClassVar[list[float]] = [
        0.00001,
        0.000025,
        0.00005,
        0.0001,
        0.00025,
        0.001,
        0.005,
    ]

    def __init__(self, router: str, instance: str | None = None) -> None:
        self.router = router
        # Triton gives every stub of the server the same series for a name and labels:
        # counters and histograms of all router instances add up in it, but a gauge is
        # set, so each instance's gauges carry its instance name (docs/router.md).
        self.instance = instance
        self.set = MetricSet()
        self.writes = Writer("router-metrics", _apply, merge=_merge)
        self.metrics: dict[tuple[str, Labels], Series] = {}
        self._latency = self.metric(
            "latency", (), buckets=[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1]
        )

    def metric(
        self,
        kind: str,
        labels: Labels,
        buckets: Sequence[float] | None = None,
        families: Mapping[str, Family] | None = None,
    ) -> Series:
        """The series of family `kind` (in `families`, else FAMILIES) with the router's
        label and `labels`, created on first use. TenantMetrics' families live here too."""
        key = (kind, labels)
        metric = self.metrics.get(key)
        if metric is None:
            name, description, metric_kind = (families or self.FAMILIES)[kind]
            labelled = {"router": self.router, **dict(labels)}
            if metric_kind == GAUGE and self.instance:
                labelled["router_instance"] = self.instance
            metric = self.metrics[key] = Series(
                lambda: self.set.metric(name, description, metric_kind, labelled, buckets),
                self.writes,
            )
        return metric

    def request(self, route: str, backend: str) -> None:
        self.metric("requests", (("route", route), ("served_by", backend))).increment(1)

    def fallback(self, backend: str) -> None:
        self.metric("fallbacks", (("backend", backend),)).increment(1)

    def abort(self, backend: str) -> None:
        self.metric("aborts", (("backend", backend),)).increment(1)

    def error(self, reason: str) -> None:
        self.metric("errors", (("reason", reason),)).increment(1)

    def breaker_state(self, backend: str, state: str) -> None:
        self.metric("breaker", (("backend", backend),)).set(STATE_VALUES[state])

    def trace_losses(self, dropped: int, failed: int) -> None:
        """Spans just lost (SpanLosses' on_loss, on the thread that counted them: the
        writes are queued); a zero is not written."""
        if dropped:
            self.metric("trace_dropped", ()).increment(dropped)
        if failed:
            self.metric("trace_failed", ()).increment(failed)

    def added_latency(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def replica_decision(self, backend: str, matched_blocks: int, seconds: float) -> None:
        labels = (("backend", backend),)
        self.metric("matched_blocks", labels, self.MATCHED_BUCKETS).observe(matched_blocks)
        self.metric("decision", labels, self.DECISION_BUCKETS).observe(seconds)

    def replica_request(self, backend: str, replica: str, policy: str, reason: str) -> None:
        self.metric(
            "replica_requests",
            (("backend", backend), ("replica", replica), ("policy", policy), ("reason", reason)),
        ).increment(1)

    def replica_index(
        self, backend: str, replica: str, blocks: int, updated_at: float | None = None
    ) -> None:
        labels = (("backend", backend), ("replica", replica))
        self.metric("index_blocks", labels).set(blocks)
        if updated_at is not None:
            self.metric("index_updated", labels).set(updated_at)

    def replicas_loaded(self, replicas_of: Mapping[str, Iterable[str]], now: float) -> None:
        """Every replica's index gauges from the router's load (backend → its replicas):
        an empty record as old as the router. A replica never routed to then ages like
        one no longer routed to, and TridentReplicaRoutingStale (which reads the age)
        sees it; without a series it never would."""
        for backend, replicas in replicas_of.items():
            for replica in replicas:
                self.replica_index(backend, replica, 0, now)

    def finalize(self) -> None:
        self.writes.close()  # what was queued is written first
        self.set.close()  # the series stay for the router's next instance
