"""The replicas of the router's backends: which models to call for a backend, in which
order, and what each one has been given (issue 23; docs/router.md, "Replicas and
cache-aware routing").

A backend whose router.json entry lists `"replicas": ["m__r0", "m__r1"]` is never called
by its own name: the rule policy (policy.py) still picks the backend, then `expand` puts
its live replicas in its place, in the order its ReplicaChooser gives (replica_policy.py),
ahead of the backend's fallback chain. The replica that takes the request is told to the
chooser (`routed`), which records the prompt's blocks in that backend's prefix index
(prefix_index.py), seeded with the tenant's cache salt. A replica whose breaker opens is
`dropped`: its engine is gone or restarting, and so is its cache.

Every router instance (stub process) keeps its own choosers and indexes, of what it
routed itself: nothing here is shared, so nothing here locks. All of it runs on the
router's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bls.policy import DEFAULT_REPLICA_POLICY, REPLICA_POLICIES
from bls.prefix_index import PrefixIndex, prompt_key
from bls.replica_policy import Decision, ReplicaChooser, ReplicaLoad
from bls.router_config import BackendConfig, RouterConfig

GAUGE_EVERY_S = 1.0  # a replica's index gauges are written at most this often (IPC each)


def check_policy(policy: Any, where: str) -> str:
    """A policy name from router.json, or ValueError naming where it was found."""
    if policy not in REPLICA_POLICIES:
        raise ValueError(
            f"router.json {where}: policy '{policy}' is not one of {', '.join(REPLICA_POLICIES)}"
        )
    return str(policy)


def tenant_salt(tenants: Any, name: str | None) -> str | None:
    """The index's seed for a tenant: its engine cache salt (None: the shared, unsalted
    cache). Called once the tenant is admitted, so identify() does not refuse it."""
    if not tenants.enabled:
        return None
    salt: str | None = tenants.identify(name).salt
    return salt


class Choice:
    """One request's choice among one backend's replicas, until a replica takes it."""

    __slots__ = ("backend", "policy", "decision", "hashes")

    def __init__(self, backend: str, policy: str, decision: Decision, hashes: Sequence[int]):
        self.backend, self.policy, self.decision = backend, policy, decision
        self.hashes = hashes


class Replicas:
    def __init__(
        self,
        config: RouterConfig,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        backends = config.backends
        self.of = {name: info.replicas for name, info in backends.items() if info.replicas}
        self.backend_of = {
            replica: name for name, replicas in self.of.items() for replica in replicas
        }
        self.policy = {
            name: check_policy(backends[name].policy or DEFAULT_REPLICA_POLICY, f"backends.{name}")
            for name in self.of
        }
        # A rule's policy wins over its backends' own for the requests that rule routes.
        self.rule_policy = {
            rule.name: check_policy(rule.policy, f"rule {rule.name}")
            for rule in config.rules
            if rule.policy
        }
        # Every backend gets an index, whatever its own policy: a rule may ask for
        # prefix_aware on a backend whose default is round_robin.
        self.indexes = {name: PrefixIndex() for name in self.of}
        self.choosers = {
            name: ReplicaChooser(self.policy[name], index=self.indexes[name]) for name in self.of
        }
        self.metrics, self.clock, self.wall = metrics, clock, wall
        self._gauged: dict[str, float] = {}  # replica → when its gauges were last written

    def __bool__(self) -> bool:
        return bool(self.of)

    def targets(
        self, backends: Mapping[str, BackendConfig], adapters: dict[str, Any]
    ) -> dict[str, BackendConfig]:
        """Every model the router may call, with its backend's router.json entry: a
        backend's replicas in its place, or the backend itself (each gets its breaker,
        in-flight count and limit). A replica speaks through its backend's adapter
        (added to `adapters`)."""
        targets: dict[str, BackendConfig] = {}
        for name, info in backends.items():
            for target in self.of.get(name, (name,)):
                targets[target] = info
                adapters[target] = adapters[name]
        return targets

    def prompt(self, text: str | None, messages: list[Any] | None) -> str:
        """What the index cuts into blocks (the router asks only for a route with
        replicas, so no other request pays for it)."""
        return prompt_key(text, messages)

    def expand(
        self,
        route: str,
        candidates: list[str],
        features: Any,
        prompt: str | None,
        salt: str | None,
        live: Callable[[str], bool],
        inflight: Mapping[str, int],
    ) -> tuple[list[str], dict[str, Choice]]:
        """(the models to try in order, {backend: Choice}): each backend with replicas
        replaced by its live replicas in its chooser's order; other backends as they are.
        `live(replica)`: its breaker lets a request through; `inflight`: the router's
        requests per model, the load the chooser weighs."""
        if not self.of or not any(name in self.of for name in candidates):
            return candidates, {}
        targets: list[str] = []
        choices: dict[str, Choice] = {}
        hashes: list[int] | None = None
        for name in candidates:
            replicas = self.of.get(name)
            if replicas is None:
                targets.append(name)
                continue
            alive = [r for r in replicas if live(r)]
            if not alive:
                continue
            started = time.perf_counter()
            policy = self.rule_policy.get(route) or self.policy[name]
            used: Sequence[int] = ()
            if policy == "prefix_aware":
                if hashes is None:  # the same blocks for every backend (one block size)
                    hashes = self.indexes[name].block_hashes(prompt or "", salt)
                used = hashes
            loads = {r: ReplicaLoad(in_flight=inflight[r]) for r in alive}
            decision = self.choosers[name].choose(
                alive, loads, used, features.conversation_id, policy
            )
            if self.metrics is not None:
                self.metrics.replica_decision(
                    name, decision.matched_blocks, time.perf_counter() - started
                )
            choices[name] = Choice(name, policy, decision, used)
            targets.extend(decision.order)
        return targets, choices

    def routed(self, target: str, choices: Mapping[str, Choice]) -> None:
        """`target` answered with its first token: record the prompt on it, and count it
        under the reason of the choice (`fallback` when an earlier replica failed)."""
        backend = self.backend_of.get(target)
        choice = choices.get(backend) if backend is not None else None
        if backend is None or choice is None:
            return
        chooser = self.choosers[backend]
        chooser.routed(target, choice.hashes)
        if self.metrics is None:
            return
        reason = choice.decision.reason if target == choice.decision.replica else "fallback"
        self.metrics.replica_request(backend, target, choice.policy, reason)
        if choice.policy == "prefix_aware":  # its record is fresh (a short prompt
            self._gauges(backend, target, force=False)  # adds no block, yet is routed)

    def dropped(self, target: str) -> None:
        """`target`'s breaker opened: its cache is gone (dead, or reloaded empty)."""
        backend = self.backend_of.get(target)
        if backend is None:
            return
        self.choosers[backend].dropped(target)
        if self.metrics is not None:
            self._gauges(backend, target, force=True)

    def _gauges(self, backend: str, replica: str, force: bool) -> None:
        now = self.clock()
        if not force and now - self._gauged.get(replica, -GAUGE_EVERY_S) < GAUGE_EVERY_S:
            return
        self._gauged[replica] = now
        blocks = self.indexes[backend].sizes().get(replica, 0)
        self.metrics.replica_index(backend, replica, blocks, None if force else self.wall())
