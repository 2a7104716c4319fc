"""The outbox of releases and token charges (bls/tenant_outbox.py): off the request's
path, retried with backoff until the store takes them, bounded, every drop counted.
A store double stands in for Redis here; tests/bls/test_tenant_redis.py runs the same
path against a real redis-server."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bls"))
import tenant_outbox  # noqa: E402  (a sibling module of the router, imported by bare name)
from tenant_outbox import Outbox  # noqa: E402

sys.path.pop(0)


class Store:
    """finish() fails while `failing` is true; `gate` (an Event) holds every call."""

    def __init__(self, failing=False):
        self.failing, self.gate = failing, None
        self.written, self.attempts, self.at_once, self.most_at_once = [], 0, 0, 0

    async def finish(self, tenant, limits, lease_id, tokens):
        self.attempts += 1
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            await asyncio.sleep(0.001)
            if self.gate is not None:
                await self.gate.wait()
            if self.failing:
                raise RuntimeError("store unavailable")
            self.written.append((tenant, lease_id, tokens))
        finally:
            self.at_once -= 1


class Counts:
    def __init__(self):
        self.retries = self.lost = 0

    def retry(self):
        self.retries += 1

    def lose(self):
        self.lost += 1


def outbox(store, counts, **options):
    return Outbox(store, on_retry=counts.retry, on_lost=counts.lose, **options)


def test_every_write_lands_once_a_burst_in_parallel_batches():
    store, counts = Store(), Counts()
    box = outbox(store, counts)

    async def go():
        for i in range(40):
            box.put("t", None, f"lease{i}", i)
        assert await box.drained(5)
    asyncio.run(go())
    assert sorted(lease for _, lease, _ in store.written) == sorted(f"lease{i}" for i in range(40))
    assert 1 < store.most_at_once <= tenant_outbox.BATCH
    assert (counts.retries, counts.lost) == (0, 0)


def test_a_store_outage_delays_writes_and_loses_none(monkeypatch):
    monkeypatch.setattr(tenant_outbox, "MAX_BACKOFF_S", 0.05)
    store, counts = Store(failing=True), Counts()
    box = outbox(store, counts)

    async def go():
        for i in range(5):
            box.put("t", None, f"lease{i}", 10)
        await asyncio.sleep(0.3)                 # the outage
        assert store.written == [] and box.pending() == 5
        store.failing = False
        assert await box.drained(5)
    asyncio.run(go())
    assert [lease for _, lease, _ in store.written] == [f"lease{i}" for i in range(5)]
    assert counts.retries >= 5 and counts.lost == 0


def test_past_its_capacity_the_oldest_write_is_dropped_and_counted():
    store, counts = Store(failing=True), Counts()
    box = outbox(store, counts, capacity=3)

    async def go():
        for i in range(5):
            box.put("t", None, f"lease{i}", 1)
        await asyncio.sleep(0.02)
        return [write.lease_id for write in box.queue]
    assert asyncio.run(go()) == ["lease2", "lease3", "lease4"]
    assert counts.lost == 2


def test_a_write_failing_past_give_up_s_is_dropped_and_counted(monkeypatch):
    monkeypatch.setattr(tenant_outbox, "MAX_BACKOFF_S", 0.01)
    now = [0.0]
    store, counts = Store(failing=True), Counts()
    box = outbox(store, counts, give_up_s=60.0, clock=lambda: now[0])

    async def go():
        box.put("t", None, "old", 1)
        now[0] = 30.0
        box.put("t", None, "young", 1)
        await asyncio.sleep(0.05)
        assert box.pending() == 2 and counts.lost == 0
        now[0] = 61.0                            # "old" has failed for a minute
        await asyncio.sleep(0.05)
        return [write.lease_id for write in box.queue]
    assert asyncio.run(go()) == ["young"]
    assert counts.lost == 1


def test_a_write_cut_off_by_its_loop_closing_is_written_by_the_next_loop_once():
    store, counts = Store(), Counts()
    store.gate = None
    box = outbox(store, counts)

    async def cut_off():
        store.gate = asyncio.Event()             # never set: the write hangs
        box.put("t", None, "a", 7)
        await asyncio.sleep(0.02)
        assert box.pending() == 1                # taken, in flight
    asyncio.run(cut_off())                       # cancels the writer mid-write
    assert box.pending() == 1 and store.written == []

    async def next_loop():
        store.gate = None
        box.put("t", None, "b", 1)
        assert await box.drained(5)
    asyncio.run(next_loop())
    assert sorted(store.written) == [("t", "a", 7), ("t", "b", 1)]


@pytest.mark.parametrize("failures", [1, 3])
def test_the_backoff_doubles_and_resets_after_a_success(monkeypatch, failures):
    sleeps = []
    real_sleep = asyncio.sleep

    async def recorded(delay, *args):
        if delay >= tenant_outbox.FIRST_BACKOFF_S:
            sleeps.append(delay)
            delay = 0
        await real_sleep(delay, *args)
    store, counts = Store(), Counts()
    calls = [0]
    finish = store.finish

    async def flaky(*args):
        calls[0] += 1
        if calls[0] <= failures:
            raise RuntimeError("down")
        await finish(*args)
    store.finish = flaky
    box = outbox(store, counts)
    monkeypatch.setattr(tenant_outbox.asyncio, "sleep", recorded)

    async def go():
        box.put("t", None, "a", 1)
        assert await box.drained(5)
        assert box.backoff_s == 0.0
    asyncio.run(go())
    first = tenant_outbox.FIRST_BACKOFF_S
    assert sleeps == [first * 2 ** i for i in range(failures)]
