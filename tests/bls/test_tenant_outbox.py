"""The outbox of releases and token charges (bls/tenant_outbox.py): off the request's
path, retried with backoff until the store takes them, bounded, every drop counted.
A store double stands in for Redis here; tests/bls/test_tenant_redis.py runs the same
path against a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from bls import tenant_outbox
from bls.tenant_outbox import Outbox


class Store:
    """finish() fails while `failing` is true; `gate` (an Event) holds every call."""

    def __init__(self, failing=False):
        self.failing, self.gate = failing, None
        self.written, self.attempts, self.at_once, self.most_at_once = [], 0, 0, 0
        self.tried = []  # lease ids, one per attempt

    async def finish(self, tenant, limits, lease_id, tokens):
        self.attempts += 1
        self.tried.append(lease_id)
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


async def until(condition, timeout_s=5.0):
    """Wait for the writer to get somewhere (a fixed sleep is too short on a loaded box)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the writer made no progress"
        await asyncio.sleep(0.005)


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
        await asyncio.sleep(0.3)  # the outage
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
        await until(lambda: store.attempts >= 4)  # each write failed at least twice
        assert box.pending() == 2 and counts.lost == 0
        now[0] = 61.0  # "old" has failed for a minute
        await until(lambda: counts.lost == 1)
        since = len(store.tried)
        await until(lambda: len(store.tried) >= since + 3)
        return store.tried[since:], box.pending()

    tried_after_the_drop, pending = asyncio.run(go())
    assert set(tried_after_the_drop) == {"young"} and pending == 1
    assert counts.lost == 1


def test_a_write_cut_off_by_its_loop_closing_is_written_by_the_next_loop_once():
    store, counts = Store(), Counts()
    store.gate = None
    box = outbox(store, counts)

    async def cut_off():
        store.gate = asyncio.Event()  # never set: the write hangs
        box.put("t", None, "a", 7)
        await asyncio.sleep(0.02)
        assert box.pending() == 1  # taken, in flight

    asyncio.run(cut_off())  # cancels the writer mid-write
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
    assert sleeps == [first * 2**i for i in range(failures)]


def _loop_in_a_thread():
    """An event loop running in a thread of its own, as the Triton stub runs the router's."""
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def _put_from_outside(loop, box, count):
    async def put():
        for i in range(count):
            box.put("alice", None, f"lease-{i}", 10)

    asyncio.run_coroutine_threadsafe(put(), loop).result(5)


def test_a_stopping_router_writes_what_is_queued_before_it_goes():
    # Before: finalize left the queue to die with the process ("Task was destroyed but
    # it is pending! ... Outbox._write_all()"), releases and charges with it.
    store, counts = Store(), Counts()
    store.gate = asyncio.Event()  # every write waits until the store opens
    box = outbox(store, counts)
    loop, thread = _loop_in_a_thread()
    try:
        _put_from_outside(loop, box, 40)
        assert box.pending() == 40 and store.written == []
        loop.call_later(0.2, store.gate.set)  # the store answers while flush waits
        assert box.flush(loop, 5.0) is True
        assert len(store.written) == 40 and counts.lost == 0
        assert box.task.done()  # the idle writer is stopped, not left pending
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_writes_the_store_never_takes_by_the_deadline_are_counted_lost():
    store, counts = Store(failing=True), Counts()
    box = outbox(store, counts)
    loop, thread = _loop_in_a_thread()
    try:
        _put_from_outside(loop, box, 3)
        assert box.flush(loop, 0.3) is False
        assert counts.lost == 3 and store.written == []
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_with_no_running_loop_the_queue_is_counted_lost_at_once():
    store, counts = Store(), Counts()
    box = outbox(store, counts)
    for i in range(2):  # queued, as put() leaves them, on a loop that no longer runs
        box.queue.append(tenant_outbox.Write("bob", None, f"lease-{i}", 1, 0.0))
    loop = asyncio.new_event_loop()
    loop.close()
    assert box.flush(loop, 5.0) is False and counts.lost == 2
