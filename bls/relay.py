"""Relaying one backend attempt's stream to the client (Relay): a worker thread makes the
BLS call, sends the first response at once and then every later one, and the client's
final flag exactly once; and keeping finished BLS iterators alive until the stub's own
cleanup is done (Retired)."""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING

import triton_python_backend_utils as pb_utils

from trident_common.error_classes import CLIENT, SHUTDOWN, ErrorClass, classify, triton_error

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator
    from concurrent.futures import Executor
    from typing import TypeVar

    # Annotations only: the stub adds pb_utils' classes after the model's files import.
    from bls.adapters import PythonLlmAdapter, Split, TrtllmAdapter
    from bls.tenants import Tally

    # A decoupled BLS call's responses (InferenceRequest.exec(decoupled=True)).
    Responses = Iterator[pb_utils.InferenceResponse]
    _T = TypeVar("_T")

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
REFUSED = "refused"  # Relay.start outcome: the backend's refusal went to the client as is
# Refusals no other backend would answer differently: the request is wrong (CLIENT), or
# the server is stopping (SHUTDOWN: a drain's timeout, every backend's). They reach the
# client unchanged, are retried nowhere and are not the backend's failure.
FINAL_CLASSES = (CLIENT, SHUTDOWN)
RETIRE_S = 10.0  # finished BLS iterators are kept this long (see Retired)
# Cancel checks in a row that find a send in progress and give up (Relay.client_cancelled)
MAX_SKIPPED = 3
PRUNE_EVERY_S = 1.0  # how often Retired.prune looks (it is called per request)


class Retired:
    """Finished BLS response iterators, kept referenced for RETIRE_S, then dropped on the
    event loop.

    Why (python_backend r24.10, pb_stub.cc): reading an iterator's final response queues
    a cleanup that a C++ thread of the stub runs later, erasing the stub's own reference
    to the iterator, without holding the GIL. If Python dropped its references first,
    that erase destroys the iterator and every response it kept, and each response's
    tensors hold numpy arrays: freed without the GIL, they corrupt the heap (the stub
    died in _multiarray_umath under cancel storms). Kept past the cleanup, the last
    reference is Python's, released with the GIL held."""

    def __init__(self) -> None:
        # (finished at, iterator); append is atomic
        self.entries: collections.deque[tuple[float, Responses]] = collections.deque()
        self.next_prune = 0.0

    def add(self, responses: Responses) -> None:
        self.entries.append((time.monotonic(), responses))

    def prune(self) -> None:
        """Drop those finished RETIRE_S ago (on the event loop: one thread pops)."""
        now = time.monotonic()
        if now < self.next_prune:
            return
        self.next_prune = now + PRUNE_EVERY_S
        horizon = now - RETIRE_S
        while self.entries and self.entries[0][0] < horizon:
            self.entries.popleft()


class CallSlots:
    """At most `size` attempts wait in a BLS call for their first response; the others
    wait here, first come first served (a freed slot never goes to a newer attempt
    while an older one waits: that one would pass its first-token timeout). Queued,
    started and released on the event loop (a relay hands its slot back once its first
    response went out, with the outcome: Relay._started)."""

    def __init__(self, size: int, pool: Executor, loop: asyncio.AbstractEventLoop) -> None:
        self.free, self.pool, self.loop = size, pool, loop
        # (relay, child)
        self.waiting: collections.deque[tuple[Relay, pb_utils.InferenceRequest]] = (
            collections.deque()
        )

    def start(self, relay: Relay, child: pb_utils.InferenceRequest) -> None:
        """Run relay.run(child) on the pool now, or once a slot is free."""
        self.waiting.append((relay, child))
        self._start_waiting()

    def released(self) -> None:
        self.free += 1
        self._start_waiting()

    def _start_waiting(self) -> None:
        while self.free and self.waiting:
            relay, child = self.waiting.popleft()
            if relay.closed:
                continue  # given up while it waited: never sent
            self.free -= 1
            self.pool.submit(relay.run, child, self)


class Relay:
    """One attempt's stream, from the backend to the client.

    A worker thread runs `run`: the BLS call (which returns once the backend's first
    response is in), `start` on that first response, then `pump` over the rest. The
    first-token path never waits for the event loop; the loop learns the outcome of the
    first response from `first` and the end of the stream from `done` (False only after
    the backend failed mid-stream). Every send to the client holds `lock`, and `closed`
    is set by whoever sends the client's final flag, so it is sent exactly once and
    nothing follows it. An attempt the router abandons before its first token sends
    nothing at all: the router falls back or answers the client itself.
    """

    def __init__(
        self,
        sender: pb_utils.ResponseSender,
        adapter: PythonLlmAdapter | TrtllmAdapter,
        backend: str,
        loop: asyncio.AbstractEventLoop,
        single: bool,
        retired: Retired,
    ) -> None:
        self.sender, self.adapter, self.backend, self.loop = sender, adapter, backend, loop
        self.retired = retired
        self.single = single  # the client wants one response (stream false)
        self.lock = threading.Lock()
        self.streaming = False  # the first response went to the client
        self.closed = False  # final flag sent, or attempt abandoned
        self.answered = False  # this attempt sent the client's final flag
        self.complete = False  # ... with the answer's last response (its finish reason)
        self.backend_failed = False  # the backend's error ended the stream
        self.chunks = 0  # backend responses seen: progress, for silence probes
        self.cancel_checks_skipped = 0  # the loop's, in a row (client_cancelled)
        self.first_relay_s = 0.0  # router time between the first response and its send
        # the last response sent (bls/tenants.py reads its counts)
        self.last: pb_utils.InferenceResponse | None = None
        self.tally: Tally | None = None  # counts tokens per response, if set (bls/tenants.py)
        self.refusal: ErrorClass | None = None  # the class of a REFUSED first response
        # start's outcome (or the call's failure)
        self.first: asyncio.Future[str | None] = loop.create_future()
        # the client's stream ended (its final flag sent): the backend's own final may
        # still be on its way, drained by the worker thread
        self.done: asyncio.Future[bool] = loop.create_future()
        # called on the loop as `done` is set, in the same wake-up (the router hands the
        # backend's in-flight slot back there: see _end)
        self.on_end: Callable[[], None] | None = None
        self._end_told = False  # the loop was told the end (worker thread only)

    # -- worker thread ------------------------------------------------------------------
    def run(self, child: pb_utils.InferenceRequest, slots: CallSlots) -> None:
        """The whole attempt, on a worker thread: call, first response, the rest. The
        call holds one of `slots` (CallSlots) until the backend's first response is
        relayed."""
        responses: Responses | None = None
        outcome: str | None
        try:
            if self.closed:
                outcome = "abandoned by the router"
            else:
                responses = child.exec(decoupled=True)
                outcome = self.start(next(responses, None))
        except Exception as e:  # not loaded, stub unhealthy, ...
            outcome = str(e) or type(e).__name__
        # The slot is freed and the loop told the outcome in one wake-up of the loop,
        # after the first response went out: a wake-up before the send would take the
        # GIL from this thread on the first-token path.
        ended = outcome is None and self.complete  # a whole answer: its one response went
        self._end_told = ended
        self.loop.call_soon_threadsafe(self._started, slots, outcome, ended)
        if responses is None:
            return
        if outcome is None:
            self.pump(responses)
        else:
            # The attempt is over; its stream is drained here (a BLS iterator dropped
            # unfinished blocks the thread that drops it until the backend's stream ends).
            drain(responses, self.retired)

    def _started(self, slots: CallSlots, outcome: str | None, ended: bool) -> None:  # on the loop
        slots.released()
        _set_once(self.first, outcome)
        if ended:
            self._end(True)

    def _end(self, ok: bool) -> None:  # on the loop
        """The client's stream is over. After a complete answer this comes as soon as its
        last response went out (the backend's own final flag may still be on its way):
        the backend's slot is handed back here, in the loop wake-up the worker thread
        queued before the client could read its final flag, so the client's next request
        (queued after it) finds the slot free; handed back after `done`'s waiters ran,
        that request could meet `overloaded` at max_inflight_per_backend 1 (issue 34). A
        stream ended otherwise (cancelled, failed, past its deadline) holds its slot until
        the backend's stream ends, as the backend may still be generating."""
        if self.done.done():
            return
        if self.on_end is not None:
            self.on_end()
        self.done.set_result(ok)

    def _tell_end(self) -> None:  # worker thread
        if not self._end_told:
            self._end_told = True
            self.loop.call_soon_threadsafe(self._end, not self.backend_failed)

    def start(self, first: pb_utils.InferenceResponse | None) -> str | None:
        """Send the first response, or say why not: None, REFUSED or the problem
        (then this attempt sends nothing more; the router falls back or answers)."""
        received = time.monotonic()
        problem: str | None
        outgoing: pb_utils.InferenceResponse | None
        if first is None:
            problem, outgoing, last = "stream ended without a response", None, False
        else:
            problem, outgoing, last = self._split(first)
        with self.lock:
            if self.closed:
                return problem or "abandoned by the router"
            if problem is not None and _final(problem):
                # Not the backend's failure: tell the client, retry nowhere. first is
                # not None: its absence is a problem no client caused.
                self.refusal = classify(problem)
                self._finish(first.error() if first.has_error() else problem)  # type: ignore[union-attr]
                return REFUSED
            if problem is not None:
                self.closed = True
                return problem
            self.streaming = True
            if outgoing is not None:
                # A non-streamed answer is this one response (the backend's own final
                # follows on the iterator and is drained, not relayed).
                self._send(outgoing, last or self.single)
            self.last = outgoing
        self.first_relay_s = time.monotonic() - received
        return None

    def pump(self, responses: Responses) -> None:
        try:
            # next(), never `for`: iter() on a finished BLS iterator (Triton 2.51) rewinds
            # it, so a loop started after the final response replays the whole stream.
            response = next(responses, None)
            while response is not None:
                self.chunks += 1
                self._forward(response)
                if self.complete:  # the answer's end: the backend's final may follow
                    self._tell_end()
                response = next(responses, None)
            self.retired.add(responses)
            self.close()
        except Exception as e:  # the router must answer even if its own relay breaks
            self.close(f"router relay failed: {e}")
        finally:
            self._tell_end()

    def _forward(self, response: pb_utils.InferenceResponse) -> None:
        """Relay one chunk; a chunk carrying an error ends the client's stream."""
        problem, outgoing, last = self._split(response)
        with self.lock:
            if self.closed:
                return  # answered, abandoned or cancelled: drain only
            if problem is not None and _final(problem):
                self._finish(problem)  # the request's fault, or the server stops
            elif problem is not None:
                self.backend_failed = True
                self._finish(f"{self.backend} failed mid-stream: {problem}")
            elif outgoing is not None:
                self._send(outgoing, last)
                self.last = outgoing

    def _send(self, outgoing: pb_utils.InferenceResponse, last: bool) -> None:
        """Relay a response; the answer's last carries the client's final flag (one send
        fewer than a separate final, as the engine model itself sends it). Under lock."""
        if last:
            self.closed = self.answered = self.complete = True
            self.sender.send(outgoing, flags=FINAL)
        else:
            self.sender.send(outgoing)

    def _split(self, response: pb_utils.InferenceResponse) -> Split:
        problem, outgoing, last = self.adapter.split(response)
        if outgoing is not None and self.tally is not None:
            outgoing = self.tally.take(outgoing)
        return problem, outgoing, last

    # -- any thread ---------------------------------------------------------------------
    def close(self, error: str | None = None) -> bool:
        """Finish the client's stream (an error response first if given); False if it
        was already finished."""
        with self.lock:
            if self.closed:
                return False
            self._finish(error)
            return True

    def client_cancelled(self) -> bool:
        """Has the client cancelled? Asked under the lock and only while the stream is
        open: once the final flag is sent Triton releases the request, and asking then
        crashes the server (TRITONBACKEND_ResponseFactoryIsCancelled).

        The event loop asks (the router's watch), and it serves every request: it does
        not wait while the worker thread holds the lock for a send (a round trip to the
        server, long under load), it says "not yet" and asks at the next check. After
        MAX_SKIPPED such answers in a row it waits, so a stream that sends back to back
        still has its cancel seen."""
        if self.cancel_checks_skipped < MAX_SKIPPED:
            if not self.lock.acquire(blocking=False):
                self.cancel_checks_skipped += 1
                return False
        else:
            self.lock.acquire()
        self.cancel_checks_skipped = 0
        try:
            return not self.closed and self.sender.is_cancelled()
        finally:
            self.lock.release()

    def abandon(self) -> bool:
        """Give up before the first token without telling the client anything; False if
        the first response already went out (then the stream is the client's)."""
        with self.lock:
            if self.streaming or self.closed:
                return False
            self.closed = True
            return True

    def _finish(self, error: str | pb_utils.TritonError | None) -> None:
        self.closed = self.answered = True
        try:
            if error is not None:  # a message, or a backend's TritonError (keeps its code)
                if isinstance(error, str):  # its marker sets the Triton code
                    error = triton_error(pb_utils, error)
                self.sender.send(pb_utils.InferenceResponse(error=error))
            self.sender.send(flags=FINAL)
        except Exception:
            pass  # the client is gone (cancelled): nothing left to tell it


def _set_once(future: asyncio.Future[_T], value: _T) -> None:
    if not future.done():
        future.set_result(value)


def _final(problem: str) -> bool:
    """A backend's error message of a FINAL_CLASSES class."""
    return classify(problem) in FINAL_CLASSES


def drain(responses: Responses, retired: Retired) -> None:
    try:
        while next(responses, None) is not None:  # next(): see Relay.pump
            pass
    except Exception:
        return  # the backend is gone: nothing left to drain (and no cleanup queued)
    retired.add(responses)


def first_error(
    responses: Responses, retired: Retired, split: Callable[[pb_utils.InferenceResponse], Split]
) -> str | None:
    """A control call's first error, as its backend's adapter reads one (`split`: an error
    response, or the `error` output that interface.ERRORS_IN_BAND asks for), reading the
    call to its end."""
    error = None
    response = next(responses, None)
    while response is not None:
        if error is None:
            error = split(response)[0]
        response = next(responses, None)
    retired.add(responses)
    return error
