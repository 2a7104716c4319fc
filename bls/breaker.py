"""A circuit breaker per backend: a pure state machine with an injected clock.

closed ──(error rate over the window ≥ threshold with enough requests, or N consecutive
failures)──► open ──(cooldown elapsed)──► half_open ──(probe succeeds)──► closed
                                              └──────(probe fails)──────► open
While open, `allow()` is False and the router routes around the backend. In half_open
exactly one probe request is let through at a time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from bls.router_config import BreakerConfig

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}  # for the breaker-state gauge


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, clock: Callable[[], float]):
        self.config, self._clock = config, clock
        self.state = CLOSED
        self._outcomes: deque[tuple[float, bool]] = deque()  # (time, failed)
        self._failures_in_window = 0
        self._consecutive = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    def allow(self) -> bool:
        """May a request be sent now? In half_open this claims the single probe slot."""
        if self.state == OPEN:
            if self._clock() - self._opened_at < self.config.cooldown_s:
                return False
            self.state, self._probe_in_flight = HALF_OPEN, False
        if self.state == HALF_OPEN:
            if self._probe_in_flight:
                return False
            self._probe_in_flight = True
        return True

    def available(self) -> bool:
        """Like allow() but without claiming anything (for routing decisions)."""
        if self.state == OPEN:
            return self._clock() - self._opened_at >= self.config.cooldown_s
        return not (self.state == HALF_OPEN and self._probe_in_flight)

    def record_success(self) -> None:
        self._record(failed=False)
        self._consecutive = 0
        if self.state == HALF_OPEN:
            self._close()

    def record_failure(self) -> None:
        self._record(failed=True)
        self._consecutive += 1
        if self.state == HALF_OPEN or self._should_open():
            self._open()

    def release_probe(self) -> None:
        """A claimed request ended without an outcome (e.g. client cancelled)."""
        self._probe_in_flight = False

    # -- internals ----------------------------------------------------------------------
    def _record(self, failed: bool) -> None:
        now = self._clock()
        self._outcomes.append((now, failed))
        self._failures_in_window += failed
        horizon = now - self.config.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            _, old_failed = self._outcomes.popleft()
            self._failures_in_window -= old_failed

    def _should_open(self) -> bool:
        if self._consecutive >= self.config.consecutive_failures:
            return True
        total = len(self._outcomes)
        return (
            total >= self.config.min_requests
            and self._failures_in_window / total >= self.config.error_rate
        )

    def _open(self) -> None:
        self.state, self._opened_at, self._probe_in_flight = OPEN, self._clock(), False

    def _close(self) -> None:
        self.state, self._probe_in_flight, self._consecutive = CLOSED, False, 0
        self._outcomes.clear()
        self._failures_in_window = 0
