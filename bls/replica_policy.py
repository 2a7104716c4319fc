"""Choosing the replica of a backend for one request: round_robin, least_loaded or
prefix_aware, with conversation affinity first and a balance bound over all of them.

Pure: no Triton, no clock. The router hands over the live replicas, their loads and the
request's prefix hashes (bls/prefix_index.py), gets a Decision (the replicas in the order
to try them), and reports which replica took the request with `routed`, which records
the prompt in the index. A replica that dies is left out of `replicas` and `dropped`.
Neither this nor the index locks anything: the router calls them from its event loop only.

The rules, in order (docs/router.md, "Replicas and cache-aware routing"):
1. The balance bound: a replica whose load exceeds the least loaded one's by more than
   `abs_threshold` requests and by more than `rel_threshold` times is not chosen first
   (both must hold, as in SGLang's router, so small absolute gaps on idle replicas and
   small ratios on busy ones are both tolerated). A replica whose engine reports its KV
   cache nearly full is treated the same: a new prompt there would evict or preempt.
2. Conversation affinity: a request with a conversation_id goes to the replica that
   rendezvous hashing gives that id among the live replicas, whatever the policy, so
   all its turns meet their own cache; if that replica dies only its conversations
   move. Past the bound, the conversation spills by the policy for this one turn.
3. The policy. round_robin rotates; least_loaded takes the smallest load; prefix_aware
   minimizes the blocks to prefill plus `load_weight` blocks per request already there
   (the overlap-and-load cost of Dynamo's KV router, in the index's block units).
Ties go to the next replica in rotation, so equal replicas share new prefixes evenly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bls.policy import DEFAULT_REPLICA_POLICY
from bls.policy import REPLICA_POLICIES as POLICIES
from bls.prefix_index import PrefixIndex

# How many blocks of prefill (64 characters, ~16 tokens each) one request already on a
# replica is worth: a request waiting there delays this one's first token about as much
# as prefilling a few dozen tokens more elsewhere.
LOAD_WEIGHT_BLOCKS = 0.5
KV_FULL = 0.95  # engine KV-cache usage at which a replica counts as past the bound


class ReplicaLoad(NamedTuple):
    """One replica's load as the router sees it. A NamedTuple, not a frozen dataclass:
    the router builds one per replica per request, inside the decision's budget, and a
    frozen dataclass's __init__ costs ~1 us (object.__setattr__ per field)."""

    in_flight: int = 0  # the router's requests on it, not yet finished
    engine_queue: int | None = None  # the engine's running + waiting (its own gauges)
    kv_usage: float | None = None  # the engine's KV-cache usage, 0..1

    @property
    def requests(self) -> int:
        # The engine's gauges also count direct calls and other router instances' requests;
        # the router's own count is exact and never stale. The larger is the truer load.
        return max(self.in_flight, self.engine_queue or 0)


@dataclass(frozen=True)
class Balance:
    abs_threshold: int = 4
    rel_threshold: float = 1.5

    def over(self, load: int, least: int) -> bool:
        return load - least > self.abs_threshold and load > least * self.rel_threshold


class Decision(NamedTuple):  # one per request, as ReplicaLoad: no frozen-dataclass init
    order: tuple[str, ...]  # every live replica, the chosen one first: try in this order
    reason: str  # affinity | prefix | spill | load | round_robin
    matched_blocks: int  # of the request's prefix, on the chosen replica

    @property
    def replica(self) -> str:
        return self.order[0]


def affinity_replica(conversation_id: str, replicas: Sequence[str]) -> str:
    """Rendezvous (highest random weight) hashing: stable across router processes and
    restarts, and removing a replica moves only the conversations that were on it."""

    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{conversation_id}\0{replica}".encode(), digest_size=8).digest()

    return max(replicas, key=weight)


class ReplicaChooser:
    def __init__(
        self,
        policy: str = DEFAULT_REPLICA_POLICY,
        index: PrefixIndex | None = None,
        balance: Balance | None = None,
        load_weight: float = LOAD_WEIGHT_BLOCKS,
        kv_full: float = KV_FULL,
    ):
        if policy not in POLICIES:
            raise ValueError(f"router.policy: '{policy}' is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.index = index if index is not None or policy != "prefix_aware" else PrefixIndex()
        self.balance = balance or Balance()
        self.load_weight = load_weight
        self.kv_full = kv_full
        self._turn = 0

    def choose(
        self,
        replicas: Sequence[str],
        loads: Mapping[str, ReplicaLoad],
        hashes: Sequence[int] = (),
        conversation_id: str | None = None,
        policy: str | None = None,
    ) -> Decision:
        """`policy` overrides the chooser's own for this request (a rule's `policy`: the
        backend's index and rotation are shared by every rule that routes to it)."""
        if not replicas:
            raise ValueError("no live replica to choose from")
        policy = policy or self.policy
        # This runs for every request on the router's event loop (issue 23's budget: 50
        # us at p99 with the index's hashing): plain loops over the few replicas, no
        # per-request closures or generators.
        start = self._turn % len(replicas)
        self._turn += 1
        rotation = [*replicas[start:], *replicas[:start]]
        load, full = self._loads(rotation, loads)
        eligible = self._eligible(rotation, load, full)
        matched = (
            self.index.match(hashes, rotation)
            if self.index is not None and hashes
            else dict.fromkeys(rotation, 0)
        )

        spilled = False
        if conversation_id:
            home = affinity_replica(conversation_id, replicas)
            if home in eligible:
                return self._decision(home, "affinity", rotation, load, matched)
            spilled = True  # its own replica is past the bound: this turn goes elsewhere
        pick = PICKERS[policy]
        chosen, reason, left_out = pick(self, rotation, eligible, load, matched, len(hashes))
        if spilled or left_out:
            reason = "spill"
        return self._decision(chosen, reason, rotation, load, matched)

    def _loads(
        self, rotation: list[str], loads: Mapping[str, ReplicaLoad]
    ) -> tuple[dict[str, int], list[str]]:
        """Each replica's requests, and those whose KV cache is nearly full (past the
        bound whatever their load)."""
        load: dict[str, int] = {}
        full: list[str] = []
        for r in rotation:
            given = loads.get(r)
            load[r] = 0 if given is None else given.requests
            usage = None if given is None else given.kv_usage
            if usage is not None and usage >= self.kv_full:
                full.append(r)
        return load, full

    def _eligible(self, rotation: list[str], load: dict[str, int], full: list[str]) -> list[str]:
        """The replicas within the balance bound and not full; all when none is."""
        least, over = min(load.values()), self.balance.over
        # `over` grows with the load, so when the most loaded replica is not past the
        # bound none is, and the per-replica checks are skipped: the common case (on
        # bench.prefix_decision's decisions: choose's p99 26-37 us before, 18-31 after).
        if not full and not over(max(load.values()), least):
            return rotation
        eligible = [r for r in rotation if not over(load[r], least) and r not in full]
        return eligible or rotation  # every replica's KV cache full: load alone decides

    def _round_robin(
        self,
        rotation: list[str],
        eligible: list[str],
        load: dict[str, int],
        matched: Mapping[str, int],
        blocks: int,
    ) -> tuple[str, str, bool]:
        """The next replica in turn, whatever its load."""
        return rotation[0], "round_robin", False

    def _least_loaded(
        self,
        rotation: list[str],
        eligible: list[str],
        load: dict[str, int],
        matched: Mapping[str, int],
        blocks: int,
    ) -> tuple[str, str, bool]:
        """The eligible replica with the fewest requests (the first of equals)."""
        return min(eligible, key=load.__getitem__), "load", False

    def _by_prefix(
        self,
        rotation: list[str],
        eligible: list[str],
        load: dict[str, int],
        matched: Mapping[str, int],
        blocks: int,
    ) -> tuple[str, str, bool]:
        """The prefix policy: the least cost of blocks to prefill plus load_weight per
        request there; the first of equals wins, so the rotation order breaks ties."""
        weight = self.load_weight
        chosen, best = eligible[0], None
        for r in eligible:
            cost = blocks - matched[r] + weight * load[r]
            if best is None or cost < best:
                chosen, best = r, cost
        reason = "prefix" if matched[chosen] else "load"
        left_out = False
        if len(eligible) < len(rotation):  # was a replica holding more left out?
            held = matched[chosen]
            left_out = any(matched[r] > held for r in rotation if r not in eligible)
        return chosen, reason, left_out

    def routed(self, replica: str, hashes: Sequence[int]) -> None:
        """The replica that took the request (the first that answered, after any
        fallback): its engine now holds this prompt's prefix."""
        if self.index is not None and hashes:
            self.index.insert(replica, hashes)

    def dropped(self, replica: str) -> None:
        """A replica died or restarted: its cache is gone, so is its record."""
        if self.index is not None:
            self.index.drop_replica(replica)

    @staticmethod
    def _decision(
        chosen: str, reason: str, rotation: list[str], load: dict[str, int], matched: dict[str, int]
    ) -> Decision:
        rest = sorted([r for r in rotation if r != chosen], key=load.__getitem__)
        return Decision((chosen, *rest), reason, matched[chosen])


# The replica policies, one picker each, behind one signature: (the chooser, the
# replicas in this turn's order, those within the balance bound, each one's requests,
# each one's matched prefix blocks, the prompt's blocks) -> (the replica, the reason,
# whether a replica holding more of the prompt was left out). A new policy is a method
# and a line here, and its name in bls/policy.py's REPLICA_POLICIES (a test holds the two
# together).
_Picker = Callable[
    [ReplicaChooser, list[str], list[str], dict[str, int], Mapping[str, int], int],
    tuple[str, str, bool],
]
PICKERS: dict[str, _Picker] = {
    "round_robin": ReplicaChooser._round_robin,
    "least_loaded": ReplicaChooser._least_loaded,
    "prefix_aware": ReplicaChooser._by_prefix,
}
