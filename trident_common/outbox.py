"""The engine model's responses leave from a thread of their own, coalesced per stream.

Each `sender.send` is a blocking round trip to tritonserver (python_backend's
ResponseSender::Send waits for the server to take the response; it releases the GIL
meanwhile), and so is `is_cancelled()` and every metric write. Made on the event loop,
each one stalled every other stream for its whole round trip. Here the loop only appends
to a stream's pending items and, if the stream is not queued yet, queues it; one thread
takes queued streams in order and sends what each has pending. Deltas that piled up while
the thread was busy with other streams leave as one response (deltas.merge): the busier
the server, the fewer round trips per token. Nothing waits for company: a stream queued on
an idle thread is sent at once, so an idle path never holds a token back.

One thread, not a pool. Two send threads halved the chunk gaps at 64 and 256 streams, but
with them the router's stub deadlocked in 2 of 7 zero_cost runs (0 of 4 without): in
python_backend r24.10 a BLS iterator woken with a response re-takes the GIL while holding
its own mutex, the stub's receiving thread holds the iterator map's mutex while it waits
for that one, and a thread starting a BLS call holds the GIL while it waits for the map's.
More responses arriving at once make that cycle likelier
(docs/results/2026-12-05-2100-two-send-lanes.md).

Order per stream is the order of `push`; a callable item (an error response, the final
flag, a metric write that must precede the client's last response) runs in its place.
A `defer`red callable (a metric write no response waits for) may run later: after the
stream's next data response unless that one is its last, before its next callable. So
the first token of a stream that is not also its last leaves before the request's
time-to-first-token write (a round trip), not behind it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from trident_common.deltas import Delta, batches

# Put on the queue among the jobs and found by identity; typed Any so that it may be.
_STOP: Any = object()

if TYPE_CHECKING:
    # What the loop queues for the thread: a stream to flush, or a call (function, args).
    _Job: TypeAlias = "Outlet | tuple[Callable[..., object], tuple[Any, ...]]"
    # An item of a stream: a delta to send, a callable to run in its place, a deferred one.
    _Item: TypeAlias = "Delta | Callable[[], None] | _Deferred"


class Sender(Protocol):
    """A stream's response sender (pb_utils.ResponseSender; a double in tests)."""

    def send(self, response: Any = ..., flags: int = ...) -> None: ...

    def is_cancelled(self) -> bool: ...


class Outlet:
    """One stream's way out. `build(delta)` makes the response for a (merged) delta;
    a delta with a finish_reason is sent with the final flag. Fields other than `items`
    and `queued` are the sender thread's."""

    def __init__(
        self,
        sender: Sender,
        build: Callable[[Delta], object],
        final_flag: int,
        first_check: float,
        check_every_s: float,
        owner: Any = None,
    ) -> None:
        self.sender, self.build, self.final_flag = sender, build, final_flag
        self.owner = owner  # what the callbacks are told about
        self.items: deque[_Item] = deque()  # appended by the loop, taken by the thread
        self.queued = False
        self.held: list[_Deferred] = []  # deferred callables the thread holds
        self.next_check, self.check_every_s = first_check, check_every_s
        self.stopped = False  # the client left, or a send failed


class Outbox:
    """The sender thread. `on_stopped(owner, error)` is called on the thread when a
    stream's client is found gone before a data response (error None), or sending one
    raised `error`. Nothing more of that stream's data is sent; its callables still run,
    and a final delta still ends the request with the final flag (flags only)."""

    def __init__(
        self,
        name: str,
        on_stopped: Callable[[Any, Exception | None], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_stopped, self._clock = on_stopped, clock
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def push(self, outlet: Outlet, item: Delta | Callable[[], None]) -> None:
        """From one thread per outlet (the model's event loop)."""
        outlet.items.append(item)
        if not outlet.queued:
            outlet.queued = True
            self._queue.put(outlet)

    def defer(self, outlet: Outlet, function: Callable[[], None]) -> None:
        """Queue `function` for the stream, to run after its next data response unless
        that is its last (then before it), and before any later callable. It does not
        wake the thread: an item pushed after it will (every stream ends with a final
        delta or a callable)."""
        outlet.items.append(_Deferred(function))

    def call(self, function: Callable[..., object], *args: Any) -> None:
        """Run function(*args) on the thread, after everything queued before it (e.g. a
        metric write: a round trip the loop need not wait for)."""
        self._queue.put((function, args))

    def close(self, timeout_s: float) -> bool:
        """Send what is queued, then stop; False if the thread did not end in time."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            if isinstance(job, Outlet):
                self._flush(job)
            else:
                function, args = job
                quietly(function, *args)

    def _flush(self, outlet: Outlet) -> None:
        # Cleared before taking: an item the loop adds from here on is either taken
        # below or queues the outlet again (then, maybe, to find nothing: harmless).
        outlet.queued = False
        items: list[Delta | Callable[[], None]] = []
        while outlet.items:
            item = outlet.items.popleft()
            # A deferred write may run later than its place, never after a callable or
            # the last response: held apart, so deltas on either side of it still merge.
            if isinstance(item, _Deferred):
                outlet.held.append(item)
            else:
                items.append(item)
        for item in batches(items):
            if not isinstance(item, Delta):
                self._run_held(outlet)
                quietly(item)
                continue
            if item.finish_reason or outlet.stopped:
                self._run_held(outlet)
            if not outlet.stopped:
                self._send(outlet, item)
            if outlet.stopped and item.finish_reason:  # no more data: still end it, once
                quietly(outlet.sender.send, None, outlet.final_flag)
            self._run_held(outlet)  # after a data response: off its path

    @staticmethod
    def _run_held(outlet: Outlet) -> None:
        held, outlet.held = outlet.held, []
        for deferred in held:
            quietly(deferred.function)

    def _send(self, outlet: Outlet, delta: Delta) -> None:
        final = bool(delta.finish_reason)
        try:
            if self._due(outlet) and outlet.sender.is_cancelled():
                outlet.stopped = True
                self._on_stopped(outlet.owner, None)
                return
            outlet.sender.send(outlet.build(delta), flags=outlet.final_flag if final else 0)
        except Exception as e:
            outlet.stopped = True
            self._on_stopped(outlet.owner, e)

    def _due(self, outlet: Outlet) -> bool:
        """Whether the client's cancellation is checked now (a round trip: not per token,
        at most every check_every_s per stream)."""
        now = self._clock()
        if now < outlet.next_check:
            return False
        outlet.next_check = now + outlet.check_every_s
        return True


class _Deferred:
    """A callable queued with Outbox.defer."""

    __slots__ = ("function",)

    def __init__(self, function: Callable[[], None]) -> None:
        self.function = function


def quietly(function: Callable[..., object], *args: Any) -> None:
    try:
        function(*args)
    except Exception:
        pass  # a send to a client that is gone, a metric of a closed set: nothing to do
