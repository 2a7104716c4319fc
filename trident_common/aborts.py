"""The router's aborts in an engine model: which running request each of the router's
request ids names, and aborts that overtook their request.

Only the router's requests are registered (their proof was checked: trust.py), so an
abort can reach nothing but a request the router itself sent. The first request owns its
id: a duplicate cannot take over (or be aborted in place of) the one already running.
Touched on the engine model's event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

EARLY_ABORT_TTL_S = 30.0  # how long a router's abort for an unseen request id is remembered
EARLY_ABORT_MAX = 1024


class Aborts:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._running: dict[str, object] = {}  # request id → its generation
        self._early: dict[str, float] = {}  # request id → forget-after time

    def overtaken(self, request_id: str) -> bool:
        """Was this request aborted before it arrived? (Then it is never started.)"""
        return self._early.pop(request_id, None) is not None

    def register(self, request_id: str, generation: object) -> None:
        self._running.setdefault(request_id, generation)

    def unregister(self, request_id: str, generation: object) -> None:
        if self._running.get(request_id) is generation:
            del self._running[request_id]

    def take(self, request_id: str) -> object | None:
        """The running generation this abort names; None when there is none yet, and
        then the abort is remembered a while, bounded (an abort and its request are
        queued separately by Triton, and the abort may come first)."""
        generation = self._running.get(request_id)
        if generation is None:
            now = self._clock()
            for key, until in list(self._early.items()):
                if until < now or len(self._early) >= EARLY_ABORT_MAX:
                    del self._early[key]
            self._early[request_id] = now + EARLY_ABORT_TTL_S
        return generation
