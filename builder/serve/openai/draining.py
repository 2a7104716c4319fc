"""The frontend's drain (a SIGTERM, a rolling restart): new work is refused in words,
the answers in flight finish, and at the drain's timeout what still runs is ended with
an explicit error, never a silent cut.

`DrainGate` is shared by the app (on its event loop) and whoever drives the drain from
another thread (`trident serve`'s main thread on SIGTERM, runner.run's signal
handler). Its flags are plain attributes: a bool or int store is atomic in CPython, so
start() needs no lock, and the hot path pays one attribute read per request plus the
in_flight count. Only cut_off() touches asyncio objects, so it hands its work to the
loop (call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Protocol

from builder.serve.openai.errors import OpenAIError, model_died, server_shutdown

# Retry-After on a refusal while draining, in seconds. Kubernetes probes readiness every
# 5 s (builder/k8s/workloads.py) and takes a terminating pod out of its Service's
# endpoints within a second or two: a retry 5 s later lands on another server, and the
# person behind the request waits no longer than that.
RETRY_AFTER_S = 5


class Cuttable(Protocol):
    """A Triton call (triton.Call) as the drain ends it."""

    model: str

    def cut_off(self, error: OpenAIError) -> None: ...


class DrainGate:
    """The drain's state. `draining`: new /v1 requests and /health are refused (503);
    `in_flight`: the generation requests admitted and not yet fully answered (a stream
    until its last event left or its client went away); `cut`: cut_off() was called."""

    def __init__(self) -> None:
        # Read per request: new work is refused while it is set, by the drain for good,
        # by pause() until resume().
        self.draining = False
        self.stopping = False  # start() was called: resume() no longer lets work in
        self.cut = False
        self.in_flight = 0  # changed on the app's loop only, read from any thread
        # The Triton calls of the answers being made. Weak: a call leaves once its
        # request is gone, with no bookkeeping on the paths where it ends.
        self._calls: weakref.WeakSet = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The app's loop (set at the app's startup): cut_off() runs there."""
        self._loop = loop

    def start(self) -> None:
        """Enter the drain (idempotent, from any thread)."""
        self.stopping = self.draining = True

    def pause(self) -> None:
        """Refuse new work as the drain does, for a while: `trident serve` restarts a
        tritonserver that died, and nothing can be answered until its models are back.
        The answers in flight end with Triton's own error."""
        self.draining = True

    def resume(self) -> None:
        """Take new work again after pause(), unless the drain began meanwhile."""
        self.draining = self.stopping

    def track(self, call: Cuttable) -> None:
        """A Triton call that cut_off() ends if it is still running then."""
        self._calls.add(call)

    def cut_off(self) -> None:
        """End every answer still running (from any thread): each stream gets one
        `server_shutdown` error event, then [DONE]; an answer not yet started gets a
        503 of that code; a request still arriving is refused with it."""
        self.draining = self.cut = True
        self._on_loop(self._cut_calls, server_shutdown(), None)

    def abandon(self, model: str) -> None:
        """End the answers in flight from `model` now (from any thread), with an error
        saying its process died: Triton 2.51 never ends the requests a killed stub held
        (its clients would wait for ever), and none of them can still be answered."""
        self._on_loop(self._cut_calls, model_died(model), model)

    def _on_loop(self, work, *args) -> None:
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or loop is here:
            work(*args)
            return
        try:
            # The calls are asyncio objects: they are ended on their loop, which wakes
            # a stream waiting for its next token at once.
            loop.call_soon_threadsafe(work, *args)
        except RuntimeError:
            pass  # the loop is closed: the server has stopped, nothing runs

    def _cut_calls(self, error: OpenAIError, model: str | None) -> None:
        for call in list(self._calls):
            if model is None or call.model == model:
                call.cut_off(error)
