"""Choosing a replica (bls/replica_policy.py): conversations stay with their cache, a hot
prefix spills past the balance bound, a dropped replica's conversations move, tenants
never route by each other's prefixes, and the three policies do what they say."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bls.prefix_index import PrefixIndex, prompt_key
from bls.replica_policy import (
    Balance,
    ReplicaChooser,
    ReplicaLoad,
    affinity_replica,
)

REPLICAS = ("m__r0", "m__r1")
SYSTEM = "You are the support assistant of a hardware shop. Be brief and exact. " * 14


def history(n: int, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Customer {n} asks question {t} about order {n * 7919 % 1000}. " * 4,
            }
        )
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"Reply {t} to {n}. " * 24})
    return messages


class Router:
    """The router's side of the loop: hash the prompt, choose, record where it went."""

    def __init__(self, chooser: ReplicaChooser, replicas=REPLICAS):
        self.chooser, self.replicas = chooser, list(replicas)
        self.in_flight = Counter()

    def route(self, messages, salt=None, conversation_id=None, finish=True):
        index = self.chooser.index
        hashes = index.block_hashes(prompt_key(None, messages), salt) if index else []
        loads = {r: ReplicaLoad(in_flight=self.in_flight[r]) for r in self.replicas}
        decision = self.chooser.choose(self.replicas, loads, hashes, conversation_id)
        self.chooser.routed(decision.replica, hashes)
        if not finish:
            self.in_flight[decision.replica] += 1
        return decision


def run_conversations(router, conversations=8, turns=4) -> dict[int, set]:
    """Concurrent users: each round sends every conversation's next turn, all of them in
    flight together, then they finish. Returns the replicas each conversation met."""
    seen: dict[int, set] = {n: set() for n in range(conversations)}
    for t in range(1, turns + 1):
        for n in range(conversations):
            seen[n].add(router.route(history(n, t), finish=False).replica)
        router.in_flight.clear()
    return seen


def test_each_conversation_stays_on_one_replica_by_its_prefix_alone():
    router = Router(ReplicaChooser("prefix_aware", PrefixIndex()))
    seen = run_conversations(router)
    assert all(len(replicas) == 1 for replicas in seen.values()), seen
    # and the conversations spread over both replicas rather than piling on one
    assert {next(iter(r)) for r in seen.values()} == set(REPLICAS)


def test_round_robin_scatters_the_same_conversations():
    """The control for the test above: without the index, turns land anywhere."""
    seen = run_conversations(Router(ReplicaChooser("round_robin")), conversations=7)
    assert any(len(replicas) > 1 for replicas in seen.values())


def test_a_conversation_id_keeps_its_replica_under_every_policy():
    for policy in ("round_robin", "least_loaded", "prefix_aware"):
        router = Router(ReplicaChooser(policy))
        decisions = [router.route(history(3, t), conversation_id="conv-3") for t in range(1, 6)]
        assert {d.replica for d in decisions} == {affinity_replica("conv-3", REPLICAS)}
        assert {d.reason for d in decisions} == {"affinity"}


def test_a_hot_prefix_spills_to_the_other_replica_past_the_balance_bound():
    """Every request shares one long prefix and none finishes: the replica holding the
    prefix takes requests until it leads by more than 3 and by more than 2x, then the
    other replica takes the next one, marked as a spill."""
    chooser = ReplicaChooser(
        "prefix_aware",
        PrefixIndex(),
        balance=Balance(abs_threshold=3, rel_threshold=2.0),
        load_weight=0.0,
    )
    router = Router(chooser)
    hot = history(0, 1)
    first = router.route(hot, finish=False)
    other = next(r for r in REPLICAS if r != first.replica)
    decisions = [router.route(hot, finish=False) for _ in range(4)]
    assert [d.replica for d in decisions] == [first.replica] * 3 + [other]
    assert [d.reason for d in decisions] == ["prefix"] * 3 + ["spill"]
    assert router.in_flight == {first.replica: 4, other: 1}


def test_without_the_bound_the_hot_prefix_would_pile_on_one_replica():
    """The control for the test above: an unreachable bound never spills."""
    chooser = ReplicaChooser(
        "prefix_aware", PrefixIndex(), balance=Balance(abs_threshold=10**6), load_weight=0.0
    )
    router = Router(chooser)
    decisions = [router.route(history(0, 1), finish=False) for _ in range(12)]
    assert len({d.replica for d in decisions}) == 1


def test_a_dropped_replica_loses_its_conversations_and_only_those():
    replicas = ("m__r0", "m__r1", "m__r2")
    router = Router(ReplicaChooser("prefix_aware", PrefixIndex()), replicas)
    placed = {
        n: next(iter(r)) for n, r in run_conversations(router, conversations=9, turns=2).items()
    }
    dead, _ = Counter(placed.values()).most_common(1)[0]
    assert len(set(placed.values())) > 1
    router.replicas.remove(dead)
    router.chooser.dropped(dead)
    assert dead not in router.chooser.index.sizes()
    for n, before in placed.items():
        after = router.route(history(n, 3)).replica
        assert after != dead
        if before != dead:
            assert after == before  # a survivor's conversations keep their cache
    ids = [f"conv-{n}" for n in range(50)]
    homes = {c: affinity_replica(c, replicas) for c in ids}
    for c in ids:  # by conversation_id: the same holds
        now = affinity_replica(c, [r for r in replicas if r != dead])
        assert now == homes[c] or homes[c] == dead


def test_two_tenants_with_different_salts_never_route_by_each_others_prefix():
    router = Router(ReplicaChooser("prefix_aware", PrefixIndex()))
    prompt = history(5, 2)
    acme = [router.route(prompt, salt="acme-salt") for _ in range(3)]
    assert acme[-1].reason == "prefix" and acme[-1].matched_blocks > 10
    globex = router.route(prompt, salt="globex-salt")
    assert globex.matched_blocks == 0 and globex.reason == "load"
    # the same prompt with acme's own salt does find it
    assert router.route(prompt, salt="acme-salt").matched_blocks == acme[-1].matched_blocks


def test_least_loaded_and_round_robin():
    chooser = ReplicaChooser("least_loaded")
    loads = {"a": ReplicaLoad(3), "b": ReplicaLoad(1, engine_queue=2), "c": ReplicaLoad(1)}
    decision = chooser.choose(["a", "b", "c"], loads)
    assert decision.order == ("c", "b", "a") and decision.reason == "load"
    rr = ReplicaChooser("round_robin")
    assert [rr.choose(["a", "b", "c"], {}).replica for _ in range(4)] == ["a", "b", "c", "a"]


def test_a_replica_with_a_full_kv_cache_is_not_chosen_first():
    chooser = ReplicaChooser("prefix_aware", PrefixIndex())
    hashes = chooser.index.block_hashes(prompt_key(None, history(1, 1)))
    chooser.routed("a", hashes)
    loads = {"a": ReplicaLoad(kv_usage=0.97), "b": ReplicaLoad(kv_usage=0.2)}
    decision = chooser.choose(["a", "b"], loads, hashes)
    assert decision.order == ("b", "a") and decision.reason == "spill"


def test_an_unknown_policy_is_refused_with_its_field():
    with pytest.raises(ValueError, match="router.policy: 'sticky' is not one of"):
        ReplicaChooser("sticky")


def test_a_rules_policy_overrides_the_backends_for_its_requests():
    """One backend's chooser serves every rule that routes to it: a rule's policy applies
    to its own requests, the index stays shared."""
    chooser = ReplicaChooser("prefix_aware", PrefixIndex())
    hashes = chooser.index.block_hashes(prompt_key(None, history(1, 1)))
    chooser.routed("a", hashes)
    rotated = [chooser.choose(["a", "b"], {}, hashes, policy="round_robin") for _ in range(4)]
    assert [d.replica for d in rotated] == ["a", "b", "a", "b"]
    assert {d.reason for d in rotated} == {"round_robin"}
    decision = chooser.choose(["a", "b"], {}, hashes)  # the backend's own: prefix_aware
    assert decision.replica == "a" and decision.reason == "prefix"


# The choices bls/replica_policy.py and bls/prefix_index.py made on fixed_workload at
# commit 948f56c, before the index's generations became GC-untracked dicts: a change made
# for speed must route every request exactly as before (replica, reason, blocks matched).
PINNED_PICKS = (
    "2021110021001222101200020021100020022001220011121220102120200020020201110222220112"
    "2000202001010121200110201022221211222200200202120101201210221201102002211211002221"
    "1212021011112001002100012010200110221011010001001101010111110101010101110101010100"
    "100110010100000010100000010100001100110011011101001011"
)
PINNED_REASONS = {"affinity": 54, "load": 1, "prefix": 176, "round_robin": 34, "spill": 35}
PINNED_MATCHED = 2559


def test_the_choices_on_a_fixed_workload_are_the_pinned_ones():
    """300 requests of 40 conversations from two salted tenants over three replicas, with
    random loads, an index small enough to evict (96 blocks a replica), affinity for
    every fifth conversation, a rule's round_robin every seventh request, a fallback
    replica recording every eleventh, and one replica dropped two thirds in. Nothing
    here depends on the hash values, only on which of them are equal, so the pin holds
    under any PYTHONHASHSEED."""
    rng = random.Random(2323)
    replicas = ("m__r0", "m__r1", "m__r2")
    index = PrefixIndex(block_chars=32, max_blocks_per_replica=96)
    chooser = ReplicaChooser("prefix_aware", index)
    systems = [f"Tenant {t} rules: " + "be brief, be exact. " * (8 + 4 * t) for t in range(2)]
    turns: Counter = Counter()
    picks, reasons, matched = [], Counter(), 0
    for step in range(300):
        n = rng.randrange(40)
        tenant, turns[n] = n % 2, turns[n] + 1
        messages = [{"role": "system", "content": systems[tenant]}]
        messages += [
            {"role": "user", "content": f"user {n} turn {t} " * 3} for t in range(turns[n])
        ]
        live = replicas if step < 200 else replicas[:2]
        if step == 200:
            chooser.dropped("m__r2")
        loads = {r: ReplicaLoad(in_flight=rng.randint(0, 9)) for r in live}
        hashes = index.block_hashes(prompt_key(None, messages), f"salt-{tenant}")
        conversation = f"c{n}" if n % 5 == 0 else None
        decision = chooser.choose(
            live, loads, hashes, conversation, "round_robin" if step % 7 == 0 else None
        )
        chooser.routed(decision.order[1 if step % 11 == 0 else 0], hashes)
        picks.append(decision.replica[-1])
        reasons[decision.reason] += 1
        matched += decision.matched_blocks
    assert index.evicted > 0  # the generations turned over: eviction is pinned too
    assert "".join(picks) == PINNED_PICKS
    assert dict(reasons) == PINNED_REASONS
    assert matched == PINNED_MATCHED


def test_every_replica_policy_has_its_picker_and_no_other():
    """The spec's and router.json's policy names (bls/policy.py) and the chooser's table."""
    from bls.policy import REPLICA_POLICIES
    from bls.replica_policy import PICKERS

    assert tuple(PICKERS) == REPLICA_POLICIES
