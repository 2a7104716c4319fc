"""The models the router calls, each with its circuit breaker, its in-flight count and its
limit: every backend of router.json, or in its place a replicated backend's replicas
(bls/replicas.py). A replicated backend is available while any of its replicas is, and
full when all are. The in-flight counts are the router's over all its instances
(bls/inflight.py), the breakers this instance's. Touched from the router's event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bls.breaker import OPEN, CircuitBreaker
from bls.inbound import QUEUE_FACTOR, inflight_limit
from bls.inflight import Inflight
from bls.replicas import Replicas
from bls.router_config import RouterConfig


class Targets:
    def __init__(
        self,
        config: RouterConfig,
        replicas: Replicas,
        adapters: dict[str, Any],
        metrics: Any,
        log: Any,
        counts: Callable[[list[str]], Inflight] = Inflight,
    ):
        """`counts` makes the in-flight counts for the targets' names (Inflight.shared
        when the router has several instances)."""
        self.replicas, self.metrics, self.log = replicas, metrics, log
        self.configured = config.max_inflight_per_backend
        targets = replicas.targets(config.backends, adapters)
        self.breakers = {name: CircuitBreaker(config.breaker, time.monotonic) for name in targets}
        self.inflight = counts(list(targets))
        # The engine's capacity as the builder wrote it (one replica's, or the model's
        # over its instances), for the router as a whole (over its instances).
        self.max_inflight = {
            name: inflight_limit(self.configured, info.capacity) for name, info in targets.items()
        }
        for name, breaker in self.breakers.items():
            metrics.breaker_state(name, breaker.state)

    def available(self, backend: str) -> bool:
        return any(
            self.breakers[name].available() and not self.full(name)
            for name in self.replicas.of.get(backend, (backend,))
        )

    def full(self, backend: str) -> bool:
        return all(
            self.inflight[name] >= self.max_inflight[name]
            for name in self.replicas.of.get(backend, (backend,))
        )

    def unavailable_reason(self, backend: str) -> str:
        if backend in self.replicas.of:
            return "; ".join(map(self.unavailable_reason, self.replicas.of[backend]))
        if self.full(backend):
            return (
                f"{backend}: {self.inflight[backend]} requests in flight "
                f"(its limit is {self.max_inflight[backend]}: "
                f"max_inflight_per_backend is {self.configured}, "
                f"the engine's {QUEUE_FACTOR} x concurrent sequences caps it)"
            )
        return f"{backend}: circuit breaker {self.breakers[backend].state}"

    def claim(self, name: str) -> Claim | None:
        """A slot of backend `name` for one attempt, or None (full, or its breaker)."""
        if self.full(name) or not self.breakers[name].allow():
            return None
        self.inflight.add(name, 1)
        return Claim(self, name)

    def record(self, name: str, ok: bool) -> None:
        breaker, before = self.breakers[name], self.breakers[name].state
        breaker.record_success() if ok else breaker.record_failure()
        if breaker.state != before:
            self.log.warning(f"{name}: circuit breaker {before} -> {breaker.state}")
            self.metrics.breaker_state(name, breaker.state)
            if breaker.state == OPEN:  # a replica's engine is dead: so is its cache
                self.replicas.dropped(name)


class Claim:
    """One attempt's in-flight slot of a backend, handed back once: when the client's
    stream ends (Relay.on_end) or when the attempt is over, whichever comes first."""

    __slots__ = ("targets", "name", "held")

    def __init__(self, targets: Targets, name: str) -> None:
        self.targets, self.name, self.held = targets, name, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.targets.inflight.add(self.name, -1)
