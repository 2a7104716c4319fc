"""The engine model's responses leave from threads of their own, coalesced per stream.

Each `sender.send` is a blocking round trip to tritonserver (python_backend's
ResponseSender::Send waits for the server to take the response; it releases the GIL
meanwhile), and so is `is_cancelled()` and every metric write. Made on the event loop,
each one stalled every other stream for its whole round trip. Here the loop only appends
to a stream's pending items and, if the stream is not queued yet, queues it on its lane; a
lane's thread takes its queued streams in order and sends what each has pending. Deltas
that piled up while the thread was busy with other streams leave as one response
(deltas.merge): the busier the server, the fewer round trips per token. Nothing waits for
company: a stream queued on an idle lane is sent at once, so an idle path never holds a
token back.

SEND_LANES lanes, each stream on one for its whole life (so its order holds), given out
in turn: while one lane's send waits for the server, another's goes out, and a stream
waits for fewer others between two of its responses. Two lanes against one on the paced
double, 2 cores: the router's chunk gap p99 55-65 ms against 85-109 at 64 streams x 100
tokens/s, 330-350 ms against 0.7-2.2 s at 256 x 100, delivered tokens/s the same
(docs/results/2026-12-05-2100-two-send-lanes.md). Several threads of one stub may send at
once (the router's relays always have); their metric writes may not, and
trident_common/metrics.py makes them take turns.

Order per stream is the order of `push`; a callable item (an error response, the final
flag, a metric write that must precede the client's last response) runs in its place.
A `defer`red callable (a metric write no response waits for) may run later: after the
stream's next data response unless that one is its last, before its next callable. So
the first token of a stream that is not also its last leaves before the request's
time-to-first-token write (a round trip), not behind it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from trident_common.deltas import Delta, batches

# Put on the queue among the jobs and found by identity; typed Any so that it may be.
_STOP: Any = object()
SEND_LANES = 2  # send threads per engine model instance (above)

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
    a delta with a finish_reason is sent with the final flag. Fields other than `items`,
    `queued` and `lane` are its lane's thread's."""

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
        self.lane: queue.SimpleQueue[_Job] | None = None  # its lane's queue, from its first push
        self.held: list[_Deferred] = []  # deferred callables the thread holds
        self.next_check, self.check_every_s = first_check, check_every_s
        self.stopped = False  # the client left, or a send failed


class Outbox:
    """The sender threads, one per lane. `on_stopped(owner, error)` is called on a lane's
    thread when a stream's client is found gone before a data response (error None), or
    sending one raised `error`. Nothing more of that stream's data is sent; its callables
    still run, and a final delta still ends the request with the final flag (flags only)."""

    def __init__(
        self,
        name: str,
        on_stopped: Callable[[Any, Exception | None], object],
        clock: Callable[[], float] = time.monotonic,
        lanes: int = SEND_LANES,
    ) -> None:
        self._on_stopped, self._clock = on_stopped, clock
        self._lanes: list[queue.SimpleQueue[_Job]] = [queue.SimpleQueue() for _ in range(lanes)]
        self._next_lane = itertools.cycle(self._lanes).__next__  # given out in turn
        self._threads = [
            threading.Thread(target=self._run, args=(lane,), name=f"{name}-{i}", daemon=True)
            for i, lane in enumerate(self._lanes)
        ]
        for thread in self._threads:
            thread.start()

    def push(self, outlet: Outlet, item: Delta | Callable[[], None]) -> None:
        """From one thread per outlet (the model's event loop)."""
        outlet.items.append(item)
        if not outlet.queued:
            outlet.queued = True
            if outlet.lane is None:
                outlet.lane = self._next_lane()
            outlet.lane.put(outlet)

    def defer(self, outlet: Outlet, function: Callable[[], None]) -> None:
        """Queue `function` for the stream, to run after its next data response unless
        that is its last (then before it), and before any later callable. It does not
        wake the thread: an item pushed after it will (every stream ends with a final
        delta or a callable)."""
        outlet.items.append(_Deferred(function))

    def call(self, function: Callable[..., object], *args: Any) -> None:
        """Run function(*args) on the first lane, after everything queued there before it
        (e.g. a metric write: a round trip the loop need not wait for)."""
        self._lanes[0].put((function, args))

    def close(self, timeout_s: float) -> bool:
        """Send what is queued, then stop; False if a lane's thread did not end in time."""
        for lane in self._lanes:
            lane.put(_STOP)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self, lane: queue.SimpleQueue[_Job]) -> None:
        while True:
            job = lane.get()
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
