"""The router choosing among a model's replicas in a real tritonserver (issue 23): a
2-instance SGLang model behind the router renders as qwen__r0 and qwen__r1 (trident's
SGLang model on the SGLang double, whose radix cache reports the prompt tokens it
already held as cached tokens), tenants salted apart.

What docs/router.md ("Replicas and cache-aware routing") promises, checked here: turns
of a conversation stay on the replica holding its history, and that replica's engine
finds it in its cache far more often than round_robin's; a hot prefix fills its replica
up to the balance bound, then spills; a tenant is never routed by another tenant's
prefix; round_robin alternates; a killed replica's conversations move to the live one
and succeed. The tests run in file order: the last one kills a replica's stub.
"""

from __future__ import annotations

import os
import signal

import pytest

from builder.serve.client import build_inputs
from builder.serve.watch import stub_processes
from support.sglang_double import MODEL, SHIM, deployment
from tests.helpers import metric_value, wait_for
from tests.helpers.servers import render
from tests.helpers.streams import Stream

pytestmark = pytest.mark.server

REPLICAS = (f"{MODEL}__r0", f"{MODEL}__r1")
CONSECUTIVE_FAILURES = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis, pool):
    tmp = tmp_path_factory.mktemp("replica-routing")
    spec = deployment("/models/test-double", "cpu")
    spec["models"][0].update(instances=2, placement={})
    spec["router"] = {
        "default": [MODEL],
        "rules": [
            {"name": "rr", "match": {"hint": "rr"}, "backends": [MODEL], "policy": "round_robin"}
        ],
        "breaker": {"consecutive_failures": CONSECUTIVE_FAILURES, "cooldown_s": 600},
    }
    spec["tenants"] = {
        "default": {"requests_per_minute": 100000},
        "limits": {"alice": {}, "bob": {}},
        "redis": redis.url,  # replicas with tenants need shared counters
    }
    repo = render(spec, tmp / "repo")
    for replica in REPLICAS:
        (repo / replica / "1" / "sglang.py").write_text(SHIM)
    with pool.serving("replica-routing", repo, timeout_s=120) as started:
        yield started


def ask(server, messages, max_tokens=8, hints=None, timeout_s=60) -> Stream:
    stream = Stream(
        server, raw_inputs=build_inputs(None, messages, max_tokens, True, {"temperature": 0}, hints)
    )
    try:
        assert stream.pump(timeout_s), "no final response"
        return stream
    finally:
        stream.close()


def served(stream) -> str:
    assert not stream.errors, stream.errors
    (name,) = stream.served_by
    return name


def system(topic: str) -> str:
    return f"You are the {topic} desk of a hardware shop; answer briefly and exactly. " * 8


def chat(topic: str, conversation: int, turns: int, replies: list[str]) -> list[dict]:
    """A conversation's messages up to its `turns`-th question, its history resent."""
    messages = [{"role": "system", "content": system(topic)}]
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": f"Customer {conversation} asks question {t} about order {t}. " * 10,
            }
        )
        if t < turns - 1:
            messages.append({"role": "assistant", "content": replies[t]})
    return messages


def replica_metric(server, name, replica, **labels) -> float:
    return metric_value(server.metrics_url, name, model=replica, **labels)


def routed(server, reason, policy="prefix_aware") -> float:
    return sum(
        metric_value(
            server.metrics_url,
            "trident_router_replica_requests_total",
            router="router",
            backend=MODEL,
            replica=replica,
            policy=policy,
            reason=reason,
        )
        for replica in REPLICAS
    )


def conversations(server, topic, hints, count=3, turns=3):
    """`count` conversations, interleaved turn by turn (an odd count: round_robin then
    sends each conversation's next turn to the other replica); `hints(n)`: the routing
    hints of conversation n. Returns the replicas each met, and the engines' cached /
    prompt tokens over turns 2..turns."""
    replies = {n: [] for n in range(count)}
    homes = {n: [] for n in range(count)}

    def counted(name):
        return sum(replica_metric(server, name, r) for r in REPLICAS)

    before = None
    for t in range(1, turns + 1):
        if t == 2:
            before = (
                counted("trident_prefix_cached_tokens_total"),
                counted("trident_prompt_tokens_total"),
            )
        for n in range(count):
            stream = ask(server, chat(topic, n, t, replies[n]), max_tokens=12, hints=hints(n))
            replies[n].append("".join(stream.texts))
            homes[n].append(served(stream))
    cached = counted("trident_prefix_cached_tokens_total") - before[0]
    prompt = counted("trident_prompt_tokens_total") - before[1]
    return homes, cached / prompt


def test_conversations_stay_with_their_cache(server):
    """By prefix alone (no conversation_id) each turn goes where its history is."""
    homes, hit_rate = conversations(server, "returns", lambda n: None)
    assert all(len(set(seen)) == 1 for seen in homes.values()), homes
    assert {seen[0] for seen in homes.values()} <= set(REPLICAS)
    # The same workload pinned by conversation_id (the oracle: every turn on the
    # replica of its first), and scattered by round_robin (the rule `rr`).
    _, pinned = conversations(server, "invoices", lambda n: {"conversation_id": f"i{n}"})
    _, blind = conversations(server, "refunds", lambda n: {"route": "rr"})
    print(
        f"engine prefix-cache hit rate, turns 2-3: prefix_aware {hit_rate:.2f}, "
        f"pinned {pinned:.2f}, round_robin {blind:.2f}"
    )
    assert abs(hit_rate - pinned) <= 0.05 and hit_rate - blind >= 0.15, (hit_rate, pinned, blind)


def test_a_hot_prefix_spills_past_the_balance_bound(server):
    """Streams of one prompt held open, each started once the one before has its first
    token: the replica holding the prompt takes them until its load passes the other's
    by more than 4 requests (and 1.5x), then one spills to the other."""
    prompt = [{"role": "user", "content": system("warranty") + "What is covered?"}]
    spills = routed(server, "spill")
    streams = []
    try:
        for _ in range(6):
            stream = Stream(
                server, raw_inputs=build_inputs(None, prompt, 300, True, {"temperature": 0})
            )
            streams.append(stream)
            stream.wait_first_text(30)
        names = [served(s) for s in streams]
        for stream in streams:
            assert stream.pump(60)
    finally:
        for stream in streams:
            stream.close()
    assert names[:5] == [names[0]] * 5 and names[5] != names[0], names
    wait_for(lambda: routed(server, "spill") - spills == 1, timeout_s=10)


def test_salted_tenants_never_share_a_route_by_prefix(server):
    prompt = [{"role": "user", "content": system("billing") + "Where is my invoice?"}]
    by_prefix = routed(server, "prefix")
    home = served(ask(server, prompt, hints={"tenant": "alice"}))
    served(ask(server, prompt, hints={"tenant": "bob"}))  # same text, bob's own salt
    wait_for(lambda: sum(routed(server, r) for r in ("load", "prefix", "spill")) > 0)
    assert routed(server, "prefix") == by_prefix
    assert served(ask(server, prompt, hints={"tenant": "alice"})) == home
    wait_for(lambda: routed(server, "prefix") == by_prefix + 1, timeout_s=10)


def test_round_robin_alternates(server):
    prompt = [{"role": "user", "content": system("delivery") + "When does it arrive?"}]
    names = [served(ask(server, prompt, hints={"route": "rr"})) for _ in range(4)]
    assert (
        names[0] != names[1] and names[0::2] == [names[0]] * 2 and names[1::2] == [names[1]] * 2
    ), names


def stub_pid(server, instance: str) -> int:
    """The pid of this server's Python-backend stub running `instance`."""
    for stub in stub_processes(server.process.pid).values():
        if stub.instance == instance:
            return stub.pid
    raise AssertionError(f"no stub runs {instance}")


def test_a_killed_replicas_conversations_move_and_succeed(server):
    ids = [f"support-{n}" for n in range(8)]
    prompt = [{"role": "user", "content": "Hello again"}]
    homes = {c: served(ask(server, prompt, hints={"conversation_id": c})) for c in ids}
    dead, live = REPLICAS
    assert set(homes.values()) == set(REPLICAS), homes  # rendezvous spreads them
    for c in ids:  # every turn meets its own replica
        assert served(ask(server, prompt, hints={"conversation_id": c})) == homes[c]
    os.kill(stub_pid(server, f"{dead}_0_0"), signal.SIGKILL)
    for _ in range(2):  # before and after the dead replica's breaker opens
        for c in ids:
            assert served(ask(server, prompt, hints={"conversation_id": c})) == live
    wait_for(
        lambda: (
            metric_value(
                server.metrics_url, "trident_router_breaker_state", router="router", backend=dead
            )
            == 2
        ),
        timeout_s=10,
    )
    failed = metric_value(
        server.metrics_url, "trident_router_fallbacks_total", router="router", backend=dead
    )
    assert failed == CONSECUTIVE_FAILURES  # then its conversations go to `live` first
