"""Releases and token charges on their way to the tenant store, off the request's path.

A request's end queues one write (release its concurrency lease, charge its tokens).
One task on the router's event loop writes the queue, up to BATCH writes at once. A
write the store cannot take (Redis down, slow or refusing) goes back to the front of
the queue and is tried again after a backoff that doubles from FIRST_BACKOFF_S up to
MAX_BACKOFF_S, so an outage delays a write instead of losing it. The queue is bounded:
past `capacity` the oldest write is dropped, and a write still failing after
`give_up_s` is dropped (its lease expired long before; its token charge is what is
lost). Every drop is reported to `on_lost`, every failed attempt to `on_retry`.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

# Annotations only: tenant_store brings redis, which the outbox itself does not need.
if TYPE_CHECKING:
    from bls.tenant_store import Limits, Store

CAPACITY = 10_000  # writes waiting; ~200 bytes each
BATCH = 16  # writes in flight at once (a burst of ends is not serialised)
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
GIVE_UP_S = 600.0  # ten minutes of failing: the write is dropped and counted


class Write:
    """One request's end: the lease to release and the tokens to charge."""

    __slots__ = ("tenant", "limits", "lease_id", "tokens", "since", "done")

    def __init__(
        self, tenant: str, limits: Limits, lease_id: str, tokens: int, since: float
    ) -> None:
        self.tenant, self.limits, self.lease_id = tenant, limits, lease_id
        self.tokens, self.since, self.done = tokens, since, False


class Outbox:
    def __init__(
        self,
        store: Store,
        on_retry: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
        capacity: int = CAPACITY,
        give_up_s: float = GIVE_UP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.on_retry, self.on_lost = store, on_retry, on_lost
        self.capacity, self.give_up_s, self.clock = capacity, give_up_s, clock
        self.queue: collections.deque[Write] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()  # set by put: the writer has work (replaced per loop)
        self.backoff_s = 0.0
        self.writing = 0  # writes taken from the queue, not yet answered

    def put(self, tenant: str, limits: Limits, lease_id: str, tokens: int) -> None:
        """Queue one write; call on the router's event loop. Never waits."""
        self.queue.append(Write(tenant, limits, lease_id, tokens, self.clock()))
        self._trim()
        loop = asyncio.get_running_loop()
        # The writer lives on the current loop (the stub has one; tests run several):
        # a writer whose loop is gone left its writes in the queue.
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.task = loop.create_task(self._write_all(self.wake))
        self.wake.set()

    def pending(self) -> int:
        """Writes not yet taken by the store (queued or in flight)."""
        return len(self.queue) + self.writing

    async def drained(self, timeout_s: float) -> bool:
        """Wait until every queued write is written (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.pending():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def flush(self, loop: asyncio.AbstractEventLoop | None, timeout_s: float) -> bool:
        """From a thread other than the loop's (the router's finalize: the stub runs its
        event loop in a thread of its own): write what is queued, at most timeout_s, then
        stop the writer. A stopping router so loses none of what the store can still take;
        what is left is counted as lost. False when some were left."""
        if loop is None or loop.is_closed() or not loop.is_running():
            left = self.pending()
        else:
            future = asyncio.run_coroutine_threadsafe(self._close(timeout_s), loop)
            try:
                left = 0 if future.result(timeout_s + 1.0) else self.pending()
            except Exception:  # the loop stopped under us: nothing more will be written
                future.cancel()
                left = self.pending()
        for _ in range(left):
            self.on_lost()
        return left == 0

    async def _close(self, timeout_s: float) -> bool:
        written = await self.drained(timeout_s)
        if self.task is not None:
            self.task.cancel()  # an idle writer left pending is reported at exit
        return written

    async def _write_all(self, wake: asyncio.Event) -> None:
        while True:
            if not self.queue:
                wake.clear()
                await wake.wait()
                continue
            batch = [self.queue.popleft() for _ in range(min(BATCH, len(self.queue)))]
            self.writing = len(batch)
            try:
                await asyncio.gather(*(self._write(write) for write in batch))
            finally:
                # Also when the loop is closing: what was not written waits for the next.
                failed = [write for write in batch if not write.done]
                self.queue.extendleft(reversed(failed))
                self.writing = 0
            if not failed:
                self.backoff_s = 0.0
                continue
            self._give_up(failed)
            self.backoff_s = min(max(2 * self.backoff_s, FIRST_BACKOFF_S), MAX_BACKOFF_S)
            await asyncio.sleep(self.backoff_s)

    async def _write(self, write: Write) -> None:
        try:
            await self.store.finish(write.tenant, write.limits, write.lease_id, write.tokens)
        except Exception:  # StoreUnavailable, or anything else: the writer must live on
            self.on_retry()
        else:
            write.done = True

    def _give_up(self, failed: list[Write]) -> None:
        now = self.clock()
        for write in failed:
            if now - write.since >= self.give_up_s:
                self.queue.remove(write)
                self.on_lost()
        self._trim()

    def _trim(self) -> None:
        while len(self.queue) > self.capacity:
            self.queue.popleft()
            self.on_lost()
