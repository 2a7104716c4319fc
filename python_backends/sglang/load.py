"""SGLang's own load gauges on Triton's metrics port: `sglang:num_running_reqs`,
`sglang:num_queue_reqs` and `sglang:token_usage`, labelled {model}. The names are those
SGLang's own server exports (sglang 0.5.23, observability/metrics_collector.py), so
dashboards and endpoint pickers written for SGLang read trident's SGLang model unchanged;
the OpenAI frontend's `GET /metrics` sums them into the pod's load
(builder/serve/openai/pod_metrics.py).

Where they come from: SGLang's scheduler writes a LoadSnapshot per data-parallel rank into
shared memory every few iterations, at each prefill and when it goes idle (managers/
scheduler.py publish_load_snapshot); `TokenizerManager.get_loads()` only reads those
(managers/tokenizer_control_mixin.py): no round trip to the scheduler. A snapshot's
token_usage is the share of the KV pool held by live requests ((max_total_num_tokens -
available - evictable) / max_total_num_tokens, pool_stats_observer.py): prefixes the radix
cache keeps but could evict do not count, as in vLLM's kv_cache_usage_perc.

`poll` reads them on the engine model's event loop; `summarize` (pure) turns the snapshots
into the three numbers; LoadGauges hands the writes (a metric write is a round trip to the
server that blocks its caller) to another thread, only those of values that changed. The
series are trident_common.metrics' (never deleted: a reloaded model's next instance writes
the same ones).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple

from trident_common.log import Log
from trident_common.metrics import GAUGE, Metric, MetricSet
from trident_common.request import describe

# How often the snapshots are read. An endpoint picker scrapes the pod every 50 ms, so a
# gauge may lag the engine by up to this much on top of SGLang's own publishing interval;
# the read is a shared-memory read on the loop (microseconds), and a write is queued only
# when a value changed, so four reads a second cost the loop and the server next to nothing.
LOAD_POLL_S = 0.25
# Every gauge is rewritten this often even when unchanged: while a reload overlaps two
# instances of the model, the old one writes the same series (trident_common/metrics.py),
# and its last values must not stay once it is gone.
REFRESH_S = 5.0
# A read that takes longer counts as a failed one (it is a shared-memory read: it never
# should).
READ_TIMEOUT_S = 5.0

# Load's field -> (SGLang's name, SGLang's help text).
FAMILIES = {
    "running": ("sglang:num_running_reqs", "The number of running requests."),
    "waiting": ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    "token_usage": ("sglang:token_usage", "The token usage."),
}


class Load(NamedTuple):
    """The engine's load over its data-parallel ranks."""

    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0  # 0-1


def summarize(snapshots: Iterable[Any]) -> Load | None:
    """SGLang's LoadSnapshots (one per data-parallel rank) -> the engine's load: requests
    running and waiting summed over the ranks, the token usage of the fullest rank (a
    request runs on one rank: the engine is as full as that one). None without a snapshot
    (get_loads returns none before the scheduler's first publish)."""
    snapshots = list(snapshots)
    if not snapshots:
        return None
    return Load(
        running=sum(int(s.num_running_reqs) for s in snapshots),
        waiting=sum(int(s.num_waiting_reqs) for s in snapshots),
        token_usage=max(float(s.token_usage) for s in snapshots),
    )


def changed(new: Load, old: Load | None) -> list[tuple[str, float]]:
    """(field, value) of each of `new`'s gauges that differs from `old` (all without it)."""
    return [
        (key, value)
        for key, value in new._asdict().items()
        if old is None or getattr(old, key) != value
    ]


class LoadGauges:
    """The three series of one model instance. `publish` runs on the event loop and hands
    the writes to `send(function, *args)` (the engine model's outbox.call), which makes them
    on its own thread, the series on first use there too: until the first snapshot there is
    no series (the pod's load then counts the model's requests in flight). Call close() at
    unload: later writes are dropped."""

    def __init__(
        self,
        model: str,
        send: Callable[..., None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._labels = {"model": model}
        self._send, self._clock = send, clock
        self._set = MetricSet()
        self._series: dict[str, Metric] = {}  # the writing thread's
        self._last: Load | None = None
        self._written_all_at = -math.inf

    def publish(self, load: Load) -> None:
        now = self._clock()
        old = self._last if now - self._written_all_at < REFRESH_S else None
        if old is None:
            self._written_all_at = now
        self._last = load
        writes = changed(load, old)
        if writes:
            self._send(self._write, writes)

    def close(self) -> None:
        self._set.close()

    def _write(self, writes: list[tuple[str, float]]) -> None:
        for key, value in writes:
            if not self._set.open:  # unloaded: make no series for a successor to inherit
                return
            series = self._series.get(key)
            if series is None:
                name, description = FAMILIES[key]
                series = self._series[key] = self._set.metric(
                    name, description, GAUGE, self._labels
                )
            series.set(value)


async def poll(
    get_loads: Callable[[], Awaitable[list[Any]]],
    gauges: LoadGauges,
    log: Log,
    interval_s: float = LOAD_POLL_S,
) -> None:
    """Read the engine's load every interval_s and publish it, until cancelled. A read
    that fails is logged once, not again (the gauges keep their last values meanwhile),
    and polling goes on: the model keeps serving."""
    failed = False
    while True:
        try:
            load = summarize(await asyncio.wait_for(get_loads(), READ_TIMEOUT_S))
        except Exception as e:  # not CancelledError (a BaseException): that ends the task
            if not failed:
                failed = True
                log.warning(
                    f"SGLang's load could not be read (get_loads: {describe(e)}); the "
                    "sglang:* gauges keep their last values while it fails (logged once)"
                )
        else:
            if load is not None:
                gauges.publish(load)
        await asyncio.sleep(interval_s)
