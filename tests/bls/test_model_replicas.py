"""The router choosing among a backend's replicas (bls/replicas.py wired into
bls/model.py): its real code against the doubles of tests/bls/test_model.py. Each test
fails on a router that calls the backend by its own name (no such model here) or that
orders replicas blindly; tests/server/test_replica_routing.py runs the same choices
through a real tritonserver."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from tests.bls.test_model import (  # noqa: F401  (router: the fixture used below)
    ClientRequest,
    FakeBackend,
    router,
    run,
)
from tests.fakes import fake_pb_utils as pb

REPLICAS = {"primary": ["primary__r0", "primary__r1"]}
SYSTEM = "You answer questions about the hardware shop's orders, briefly and exactly. " * 8


def chat(conversation, turns):
    """A conversation's messages up to its `turns`-th user turn, history resent."""
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Conversation {conversation} asks question {t} about its order. " * 3,
            }
        )
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {t}. " * 20})
    return json.dumps(messages)


def replicas(**kwargs):
    return [
        FakeBackend("primary__r0", **kwargs),
        FakeBackend("primary__r1", **kwargs),
        FakeBackend("backup"),
    ]


@pytest.fixture
def replicated(router):  # noqa: F811  (test_model's fixture: a router and its doubles)
    return router


async def until(condition, timeout_s=5.0):
    """Wait on the test's loop for `condition()`; fail the test after timeout_s."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.002)


def served(request):
    (name,) = request.served_by()
    return name


def routed(model, replica, policy, reason):
    """Requests this router counted under these labels."""
    series = model.metrics.metrics.get(
        (
            "replica_requests",
            (("backend", "primary"), ("replica", replica), ("policy", policy), ("reason", reason)),
        )
    )
    return 0 if series is None or series.metric is None else series.metric._metric.value()


def by_prefix(model):
    return sum(routed(model, r, "prefix_aware", "prefix") for r in REPLICAS["primary"])


def test_each_conversation_stays_on_one_replica_across_turns(replicated):
    model = replicated(backends=replicas(), replicas=REPLICAS)
    homes, before = {}, None
    for turn in range(1, 5):
        if turn == 2:
            before = by_prefix(model)
        for conversation in range(6):  # interleaved, as concurrent users send them
            request = ClientRequest(prompt=None, messages=chat(conversation, turn))
            run(model, request)
            homes.setdefault(conversation, set()).add(served(request))
    assert all(len(seen) == 1 for seen in homes.values()), homes
    assert by_prefix(model) - before == 6 * 3  # turns 2-4 each matched their own history


def test_a_conversation_id_pins_its_replica_under_round_robin(replicated):
    model = replicated(backends=replicas(), replicas=REPLICAS, policies={"primary": "round_robin"})
    seen = Counter()
    before = {r: routed(model, r, "round_robin", "affinity") for r in REPLICAS["primary"]}
    for _ in range(4):
        request = ClientRequest(hints={"conversation_id": "c-17"})
        run(model, request)
        seen[served(request)] += 1
    assert len(seen) == 1 and sum(seen.values()) == 4
    home = next(iter(seen))
    assert routed(model, home, "round_robin", "affinity") - before[home] == 4


def test_round_robin_alternates(replicated):
    model = replicated(backends=replicas(), replicas=REPLICAS, policies={"primary": "round_robin"})
    order = []
    for _ in range(6):
        request = ClientRequest(prompt=SYSTEM)  # the same prompt: no prefix steering
        run(model, request)
        order.append(served(request))
    assert order[0::2] == [order[0]] * 3 and order[1::2] == [order[1]] * 3
    assert order[0] != order[1]


def test_a_hot_prefix_spills_past_the_balance_bound(replicated):
    """Streams of one prompt held open: the replica holding its prefix takes them until
    its load passes the least loaded one's by more than 4 (and 1.5x), then one spills."""
    model = replicated(
        backends=replicas(chunks=["x"] * 40, delay_s=0.03),
        replicas=REPLICAS,
        max_inflight_per_backend=16,
    )
    streams = [ClientRequest(prompt=SYSTEM) for _ in range(7)]
    spills = sum(routed(model, r, "prefix_aware", "spill") for r in REPLICAS["primary"])

    async def one_by_one():  # each starts once the one before has its first token
        tasks = []
        for request in streams:
            tasks.append(asyncio.ensure_future(model.handle_batch([request])))
            await until(lambda request=request: request.texts() or request.errors())
        await asyncio.gather(*tasks)

    asyncio.run(one_by_one())
    for request in streams:
        request.sender.wait_closed(5)
    model.metrics.writes.flush()
    names = [served(r) for r in streams]
    hot, other = names[0], next(r for r in REPLICAS["primary"] if r != names[0])
    assert names[:5] == [hot] * 5 and names[5] == other, names
    assert routed(model, other, "prefix_aware", "spill") - spills == 1


def test_a_dead_replicas_conversations_move_and_succeed(replicated):
    """Conversations c0, c3 and c6 live on r0 (rendezvous); r0 dies: their turns fall
    back to r1 at once, and once r0's breaker opens they go to r1 first."""
    dead = FakeBackend("primary__r0", first_error="Stub process is not healthy")
    live, backup = FakeBackend("primary__r1"), FakeBackend("backup")
    model = replicated(backends=[dead, live, backup], replicas=REPLICAS)
    requests = [
        ClientRequest(prompt=None, messages=chat(n, 2), hints={"conversation_id": f"c{n}"})
        for n in range(8)
    ]
    for request in requests:
        run(model, request)
    assert all(served(r) == "primary__r1" and not r.errors() for r in requests)
    assert backup.calls == 0  # a sibling replica comes before the fallback chain
    # two failures open r0's breaker (consecutive_failures: 2): never called again, and
    # forgotten by the index
    assert dead.calls == 2 and model.breakers["primary__r0"].state == "open"
    index = model.replicas.choosers["primary"].index
    assert "primary__r0" not in index.sizes() and index.sizes()["primary__r1"] > 0
    assert (
        pb.metric("trident_router_breaker_state", router="router", backend="primary__r0").value()
        == 2
    )


def test_every_replica_failing_falls_back_to_the_backends_chain(replicated):
    failing = [
        FakeBackend("primary__r0", first_error="boom"),
        FakeBackend("primary__r1", first_error="boom"),
    ]
    model = replicated(backends=[*failing, FakeBackend("backup")], replicas=REPLICAS)
    request = ClientRequest()
    run(model, request)
    assert served(request) == "backup" and not request.errors()
    assert [b.calls for b in failing] == [1, 1]  # each replica first, then the chain


def test_full_replicas_are_overloaded_per_replica(replicated):
    model = replicated(
        backends=replicas(chunks=["x"] * 5, delay_s=0.05),
        replicas=REPLICAS,
        max_inflight_per_backend=1,
        rules=[],
        fallback={},
    )
    streams = [ClientRequest() for _ in range(3)]

    async def together():
        tasks = [asyncio.ensure_future(model.handle_batch([r])) for r in streams[:2]]
        await until(lambda: all(r.texts() or r.errors() for r in streams[:2]))
        await model.handle_batch([streams[2]])
        await asyncio.gather(*tasks)

    asyncio.run(together())
    assert {served(r) for r in streams[:2]} == set(REPLICAS["primary"])
    (error,) = streams[2].errors()
    assert error.startswith("overloaded: ") and "primary__r0" in error


def test_salted_tenants_never_match_each_others_prefixes(replicated):
    tenants = {
        "default": {"requests_per_minute": 1000},
        "limits": {"alice": {}, "bob": {}, "carol": {}, "dave": {}},
        "share_prefix_cache": ["carol", "dave"],
    }
    model = replicated(backends=replicas(), replicas=REPLICAS, tenants=tenants)
    index = model.replicas.choosers["primary"].index

    def send(tenant):
        request = ClientRequest(prompt=SYSTEM, hints={"tenant": tenant})
        run(model, request)
        return served(request)

    matched = by_prefix(model)
    send("alice")
    before = dict(index.sizes())
    send("bob")  # the same prompt, another salt: new blocks, no prefix reason
    assert sum(index.sizes().values()) == 2 * sum(before.values())
    assert by_prefix(model) == matched
    home = send("carol")  # carol and dave share the unsalted cache: dave follows carol
    assert send("dave") == home
    assert by_prefix(model) == matched + 1


def test_the_decision_is_measured(replicated):
    model = replicated(backends=replicas(), replicas=REPLICAS)
    for n in range(3):
        run(model, ClientRequest(prompt=SYSTEM + str(n)))
    decisions = pb.metric(
        "trident_router_replica_decision_seconds", router="router", backend="primary"
    ).observations
    matched = pb.metric(
        "trident_router_replica_matched_blocks", router="router", backend="primary"
    ).observations
    assert len(decisions) == 3 and all(0 < s < 0.1 for s in decisions)
    blocks = len(SYSTEM) // 128
    assert matched[0] == 0 and blocks in matched[1:]
    sizes = [
        pb.metric(
            "trident_router_replica_index_blocks", router="router", backend="primary", replica=r
        )
        for r in REPLICAS["primary"]
    ]
    assert max(m.value() for m in sizes if m is not None) >= blocks
