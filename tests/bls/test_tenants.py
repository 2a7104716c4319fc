"""The tenants' limiter: its algorithm in this process, the router refusing a tenant
before any backend, and the tier a tenant routes as (bls/tenants.py, bls/tenant_store.py;
the Redis store against a real redis-server: test_tenant_redis.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest

from bls.router_config import TenantLimitsConfig
from bls.tenant_store import CHOICE_ARRIVAL_MS, CHOICE_TAKEN, FanOut, Limits, LocalStore
from tests.bls.conftest import TENANTS
from tests.bls.test_model import (
    ClientRequest,
    FakeBackend,
    run,
    string_tensor,
)
from tests.fakes import fake_pb_utils as pb

LEASE_MS = 60_000


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def admit_all(store, tenant, limits, n):
    async def go():
        return [await store.admit(tenant, limits, f"lease{i}", LEASE_MS) for i in range(n)]

    return asyncio.run(go())


# -- the algorithm, in this process (clock injected) ------------------------------------


def test_local_requests_per_minute_burst_then_refill():
    clock = Clock()
    store = LocalStore(clock)
    limits = Limits(rpm=3)
    assert admit_all(store, "alice", limits, 5) == [
        "",
        "",
        "",
        "requests_per_minute",
        "requests_per_minute",
    ]
    assert admit_all(store, "bob", limits, 1) == [""]  # another tenant untouched
    clock.now += 19.9
    assert admit_all(store, "alice", limits, 1) == ["requests_per_minute"]
    clock.now += 0.2  # 60 s / 3 earns one back
    assert admit_all(store, "alice", limits, 2) == ["", "requests_per_minute"]


def test_local_tokens_are_charged_after_and_refuse_while_in_debt():
    clock = Clock()
    store = LocalStore(clock)
    limits = Limits(tpm=100)

    async def go():
        assert await store.admit("t", limits, "a", LEASE_MS) == ""
        await store.finish("t", limits, "a", 150)  # 50 tokens of debt
        assert await store.admit("t", limits, "b", LEASE_MS) == "tokens_per_minute"
        clock.now += 29.0  # 100 tokens/min: 48 back
        assert await store.admit("t", limits, "b", LEASE_MS) == "tokens_per_minute"
        clock.now += 2.0
        assert await store.admit("t", limits, "b", LEASE_MS) == ""

    asyncio.run(go())


def test_local_concurrency_leases_return_on_finish_and_expire():
    clock = Clock()
    store = LocalStore(clock)
    limits = Limits(max_concurrent=2)

    async def go():
        assert [await store.admit("t", limits, i, 5000) for i in "abc"] == [
            "",
            "",
            "max_concurrent",
        ]
        await store.finish("t", limits, "a", 0)
        assert await store.admit("t", limits, "c", 5000) == ""
        clock.now += 5.1  # a dead router's leases expire
        assert await store.admit("t", limits, "d", 5000) == ""

    asyncio.run(go())


# -- the router: refusals before any backend --------------------------------------------


def rejected(tenant, reason):
    metric = pb.metric(
        "trident_tenant_rejected_total", router="router", tenant=tenant, reason=reason
    )
    return 0 if metric is None else metric.value()


def test_over_the_limit_never_reaches_a_backend(tenant_router):
    backend = FakeBackend("primary")
    seen = backend.seen_inputs
    model = tenant_router([backend])
    before = rejected("alice", "requests_per_minute")
    requests = [ClientRequest(hints={"tenant": "alice"}) for _ in range(3)]
    for request in requests:
        run(model, request)
    assert [r.errors() for r in requests[:2]] == [[], []]
    assert requests[2].errors() == ["rate limit: tenant 'alice' is over 2 requests per minute"]
    assert requests[2].sender.final_flags() == 1
    assert backend.calls == 2 and model.breakers["primary"].state == "closed"
    assert rejected("alice", "requests_per_minute") == before + 1
    # The tier and salt travel as inputs; bob shares the prefix cache (no salt).
    assert seen[0]["priority"] == 0 and len(seen[0]["cache_salt"]) == 32
    run(model, ClientRequest(hints={"tenant": "bob"}))
    assert seen[2]["priority"] == 1 and "cache_salt" not in seen[2]


def test_unload_writes_what_the_outbox_still_holds_through_the_routers_running_loop(
    tenant_router,
):
    """finalize flushes the tenant writes in flight on the router's own loop, which runs
    until it has (python_backend stops its loop before finalize: a router on that loop
    found it stopped, waited out the flush's timeout and lost them)."""
    model = tenant_router([FakeBackend("primary")])
    request = ClientRequest(hints={"tenant": "alice"})
    model.execute([request])  # as the stub calls it: the router's loop starts
    request.sender.wait_closed(5)
    written, taken = [], threading.Event()
    store = model.tenants.outbox.store

    async def slow_finish(tenant, limits, lease_id, tokens):
        taken.set()
        await asyncio.sleep(0.2)  # still being written when finalize starts
        written.append(lease_id)
        await LocalStore.finish(store, tenant, limits, lease_id, tokens)

    store.finish = slow_finish
    limits = Limits(rpm=2)
    model.serving_loop.call_soon_threadsafe(model.tenants.outbox.put, "alice", limits, "late", 7)
    assert taken.wait(5)
    model.finalize()
    # (the request's own release may be among them: it is queued after its final flag)
    assert "late" in written and model.tenants.outbox.pending() == 0


def test_unknown_and_missing_tenants_are_refused_with_reject(tenant_router):
    model = tenant_router([FakeBackend("primary")])
    nobody, stranger = ClientRequest(), ClientRequest(parameters={"tenant": "zed"})
    run(model, nobody, stranger)
    assert "names no tenant" in nobody.errors()[0]
    # Permanent: 403 (issue 35), not the 429 the openai SDK retries.
    assert stranger.errors() == ["forbidden: tenant 'zed' is not known"]
    assert stranger.sender.responses()[0].error().code() == pb.TritonError.INVALID_ARG


def test_a_concurrency_slot_returns_after_a_cancel(tenant_router):
    backend = FakeBackend("primary", chunks=["x"] * 50, delay_s=0.02)
    model = tenant_router([backend])
    first, second = (ClientRequest(hints={"tenant": "bob"}) for _ in range(2))

    async def cancel_first_then_send():
        await asyncio.sleep(0.1)
        second_refused = ClientRequest(hints={"tenant": "bob"})
        await model.handle_batch([second_refused])
        assert "1 concurrent requests" in second_refused.errors()[0]
        first.sender.cancelled = True

    run(model, first, during=cancel_first_then_send)
    run(model, second)  # the slot came back
    assert second.errors() == [] and second.texts()


class CountingBackend(FakeBackend):
    """Reports token counts as trident's engine models do (trident_common/returns.py):
    running totals; or, when the request carries return_* flags, each response's own
    output tokens, and only the counts whose flag is set."""

    PROMPT_TOKENS = 5

    def _stream(self, stop):
        flags = {
            name[len("return_") :]: value
            for name, value in self.seen_inputs[-1].items()
            if name.startswith("return_")
        }
        for i, text in enumerate(self.chunks, start=1):
            tensors = [
                string_tensor("text_output", text),
                string_tensor("error", ""),
                string_tensor("served_by", self.name),
            ]
            counts = {
                "num_input_tokens": self.PROMPT_TOKENS,
                "num_output_tokens": 1 if flags else i,
            }
            tensors += [
                pb.Tensor(name, np.array([value], dtype=np.int32))
                for name, value in counts.items()
                if not flags or flags.get(name)
            ]
            yield pb.InferenceResponse(output_tensors=tensors), i == len(self.chunks)


def charged(tenant):
    values = [
        pb.metric("trident_tenant_tokens_total", router="router", tenant=tenant, kind=kind)
        for kind in ("prompt", "completion")
    ]
    return tuple(0 if metric is None else metric.value() for metric in values)


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"return_finish_reason": True},
        {"return_num_output_tokens": True},
        {"return_num_input_tokens": False},
    ],
)
def test_tokens_are_charged_in_full_whatever_return_flags_the_client_sends(tenant_router, flags):
    backend = CountingBackend("primary", chunks=["a", "b", "c"])
    model = tenant_router([backend])
    request = ClientRequest(hints={"tenant": "bob"})
    for name, value in flags.items():
        request.inputs[name] = pb.Tensor(name, np.array([value]))
    run(model, request)
    assert request.texts() == ["a", "b", "c"]
    assert charged("bob") == (5, 3)  # this router's own counters
    # The client sees exactly the counts it asked for, as the engine would send them.
    sent = [r for r in request.sender.responses() if r.output_tensors()]
    if not flags:
        assert [r.value("num_output_tokens") for r in sent] == [1, 2, 3]
    else:
        assert backend.seen_inputs[-1]["return_num_input_tokens"] is True
        wanted = {name for name, value in flags.items() if value}
        for name in ("num_input_tokens", "num_output_tokens"):
            values = [r.value(name) for r in sent]
            expected = [1, 1, 1] if name == "num_output_tokens" else [5, 5, 5]
            assert values == (expected if f"return_{name}" in wanted else [None] * 3)


def test_the_tier_a_rule_matches_is_the_tenants_not_the_clients_hint(tenant_router):
    """A policy rule on `tier` sees the tier the spec gives the tenant: bob (standard)
    claiming premium does not reach the premium backend; alice (premium) does without
    claiming it."""
    primary, solo = FakeBackend("primary"), FakeBackend("solo")
    model = tenant_router(
        [primary, solo],
        rules=[{"name": "premium", "match": {"tier": "premium"}, "backends": ["solo"]}],
    )
    bob = ClientRequest(hints={"tenant": "bob", "tier": "premium"})
    alice = ClientRequest(hints={"tenant": "alice"})
    run(model, bob, alice)
    assert bob.served_by() == {"primary"} and alice.served_by() == {"solo"}
    assert (primary.calls, solo.calls) == (1, 1)


def test_a_redis_outage_under_deny_is_a_503_that_does_not_show_where_redis_is(
    tenant_router, caplog
):
    """Issue 34: the refusal quoted redis-py's error, Redis's address and port with it.
    Not the client's limit either: 503 (retry later), not 429."""
    tenants = {**TENANTS, "redis": "redis://127.0.0.1:1", "on_redis_error": "deny"}
    backend = FakeBackend("primary")
    model = tenant_router([backend], tenants=tenants)
    request = ClientRequest(hints={"tenant": "alice"})
    run(model, request)
    (error,) = request.errors()
    assert error == (
        "unavailable: cannot check the limits of tenant 'alice' now (the tenant store is "
        "unavailable); refused (on_redis_error: deny)"
    )
    assert request.sender.responses()[0].error().code() == pb.TritonError.UNAVAILABLE
    assert backend.calls == 0
    # The operator reads the store's own words in the router's log, once.
    with caplog.at_level(logging.WARNING, logger="trident"):
        run(model, ClientRequest(hints={"tenant": "alice"}))
    said = [r.getMessage() for r in caplog.records if "tenant store:" in r.getMessage()]
    assert len(said) == 1 and "127.0.0.1:1" in said[0], said


# -- a fan-out (an OpenAI request's n choices) admitted as one unit -------------------------
# Issue 34: a 5-per-minute tenant sending n=6 was charged 5 and got a 429 and nothing else;
# a max_concurrent: 2 tenant could never succeed with n=3, and was told it was "over 2
# concurrent requests" while nothing of its ran. The scenarios take the stores the calls
# go to in turn: one LocalStore here, two routers' RedisStores in test_tenant_redis.py.


async def fan_out(stores, tenant, limits, group, n, indexes=None):
    """Each call of fan-out `group` (n choices), sent to the stores in turn."""
    return [
        await stores[i % len(stores)].admit(
            tenant, limits, f"{group}:{i}", LEASE_MS, FanOut(group, n, i)
        )
        for i in (range(n) if indexes is None else indexes)
    ]


async def fan_out_rate_scenario(stores):
    """5 requests per minute: n=3 admitted whole; the next n=3 refused whole, and
    charged nothing: two single requests still fit, a third does not."""
    limits = Limits(rpm=5)
    assert await fan_out(stores, "t", limits, "g1", 3) == ["", "", ""]
    assert await fan_out(stores, "t", limits, "g2", 3) == ["requests_per_minute"] * 3
    singles = [await stores[0].admit("t", limits, f"s{i}", LEASE_MS) for i in range(3)]
    assert singles == ["", "", "requests_per_minute"]


async def fan_out_concurrency_scenario(stores):
    """max_concurrent 3, one request running: n=3 refused whole (no lease taken), n=2
    admitted whole (both leases taken at its first call); a choice's lease returns when
    that choice ends; a choice admitted twice is refused the second time."""
    limits = Limits(max_concurrent=3)
    assert await stores[0].admit("t", limits, "running", LEASE_MS) == ""
    assert await fan_out(stores, "t", limits, "g3", 3) == ["max_concurrent"] * 3
    assert await fan_out(stores, "t", limits, "g4", 2, indexes=[0]) == [""]
    # g4's second lease is held for its second call, which has not come yet:
    assert await stores[-1].admit("t", limits, "single", LEASE_MS) == "max_concurrent"
    assert await fan_out(stores, "t", limits, "g4", 2, indexes=[1, 1]) == ["", CHOICE_TAKEN]
    await stores[0].finish("t", limits, "g4:0", 0)
    assert await stores[-1].admit("t", limits, "single", LEASE_MS) == ""


async def fan_out_arrival_scenario(stores, wait):
    """max_concurrent 2: n=2 admitted at its first call; its second choice never
    arrives (the frontend cancelled it before the router saw it). That choice's lease
    expires after the arrival window (`wait` passes it), not the deadline; the choice
    that arrived keeps its own lease, and a late call of the group takes its lease again."""
    limits = Limits(max_concurrent=2)
    assert await fan_out(stores, "t", limits, "g", 2, indexes=[0]) == [""]
    assert await stores[-1].admit("t", limits, "early", LEASE_MS) == "max_concurrent"
    await wait()
    assert await stores[-1].admit("t", limits, "single", LEASE_MS) == ""
    assert await stores[0].admit("t", limits, "third", LEASE_MS) == "max_concurrent"
    await stores[0].finish("t", limits, "single", 0)
    assert await fan_out(stores, "t", limits, "g", 2, indexes=[1]) == [""]
    assert await stores[0].admit("t", limits, "fourth", LEASE_MS) == "max_concurrent"


def test_local_fan_out_choice_that_never_arrives_frees_its_lease_after_the_window():
    """Issue 34: a choice the frontend cancelled before the router saw it held its
    tenant's lease until the deadline (LEASE_MS here) on today's code."""
    clock = Clock()
    store = LocalStore(clock)

    async def wait():
        clock.now += CHOICE_ARRIVAL_MS / 1000 + 0.001

    asyncio.run(fan_out_arrival_scenario([store], wait))


def test_local_fan_out_is_admitted_whole_and_a_refused_one_is_not_charged():
    store = LocalStore(Clock())
    asyncio.run(fan_out_rate_scenario([store]))


def test_local_fan_out_takes_its_n_leases_at_once():
    store = LocalStore(Clock())
    asyncio.run(fan_out_concurrency_scenario([store]))


def test_local_fan_out_verdict_expires_with_the_lease():
    clock = Clock()
    store = LocalStore(clock)
    limits = Limits(max_concurrent=2)

    async def go():
        assert await fan_out([store], "t", limits, "g", 2, indexes=[0]) == [""]
        clock.now += LEASE_MS / 1000 + 1  # its leases and its verdict are gone
        assert await fan_out([store], "t", limits, "other", 2) == ["", ""]

    asyncio.run(go())


@pytest.mark.parametrize(
    ("limits", "most"),
    [
        ({"requests_per_minute": 5}, (5, "requests_per_minute")),
        ({"max_concurrent": 2, "requests_per_minute": 5}, (2, "max_concurrent")),
        ({"tokens_per_minute": 10}, None),  # charged after the answers: no count bound
        ({}, None),
    ],
)
def test_the_most_a_tenant_can_have_at_once(limits, most):
    entry = TenantLimitsConfig(tier="standard", priority=0, **limits)
    assert tenants_module().Tenant("t", "t", entry, shared=True).most_at_once() == most


def tenants_module():
    from bls import tenants

    return tenants


@pytest.mark.parametrize(
    ("parameters", "wrong"),
    [
        ({"fan_out_group": "g", "fan_out_n": 2}, "fan_out_index"),
        ({"fan_out_n": 2, "fan_out_index": 0}, "fan_out_group"),
        ({"fan_out_group": "g" * 65, "fan_out_n": 2, "fan_out_index": 0}, "fan_out_group"),
        ({"fan_out_group": "g", "fan_out_n": 0, "fan_out_index": 0}, "fan_out_n"),
        ({"fan_out_group": "g", "fan_out_n": True, "fan_out_index": 0}, "fan_out_n"),
        ({"fan_out_group": "g", "fan_out_n": 2, "fan_out_index": 2}, "fan_out_index"),
        ({"fan_out_group": "g", "fan_out_n": 2, "fan_out_index": "0"}, "fan_out_index"),
    ],
)
def test_a_malformed_fan_out_names_its_parameter(parameters, wrong):
    tenants = tenants_module()
    with pytest.raises(ValueError) as refused:
        tenants.fan_out_of(parameters)
    assert refused.value.param == wrong and wrong in str(refused.value)


def test_no_fan_out_parameters_is_no_fan_out():
    tenants = tenants_module()
    assert tenants.fan_out_of(None) is None and tenants.fan_out_of({"tenant": "a"}) is None
    found = tenants.fan_out_of({"fan_out_group": "g", "fan_out_n": 3, "fan_out_index": 2})
    assert (found.group, found.n, found.index) == ("g", 3, 2)


def fan_out_requests(tenant, n, group="grp", **hints):
    return [
        ClientRequest(
            hints={"tenant": tenant, **hints},
            parameters={"fan_out_group": group, "fan_out_n": n, "fan_out_index": i},
        )
        for i in range(n)
    ]


FAN_OUT_TENANTS = {
    "default": {"requests_per_minute": 100},
    "limits": {
        "alice": {"requests_per_minute": 2},
        "bob": {"max_concurrent": 1},
        "cara": {"max_concurrent": 2},
    },
    "unknown": "reject",
}


def test_a_fan_out_over_what_the_tenant_can_ever_have_is_a_400_naming_n(tenant_router):
    backend = FakeBackend("primary")
    model = tenant_router([backend], tenants=FAN_OUT_TENANTS)
    before = rejected("alice", "too_many_choices")
    over_rate = fan_out_requests("alice", 3)  # alice: 2 requests per minute
    over_concurrency = fan_out_requests("bob", 2, "other")  # bob: max_concurrent 1
    run(model, *over_rate, *over_concurrency)
    for request in over_rate:
        assert request.errors() == [
            "invalid request: [n] n is 3, and each choice is a request of its own: tenant "
            "'alice' may never have more than 2 at once (its requests_per_minute is 2); ask "
            "for n of 2 or fewer"
        ]
        assert request.sender.responses()[0].error().code() == pb.TritonError.INVALID_ARG
    for request in over_concurrency:
        assert "more than 1 at once (its max_concurrent is 1)" in request.errors()[0]
    assert backend.calls == 0 and rejected("alice", "too_many_choices") == before + 3
    # Nothing was charged: alice's two requests of the minute are still hers.
    singles = [ClientRequest(hints={"tenant": "alice"}) for _ in range(2)]
    run(model, *singles)
    assert [r.errors() for r in singles] == [[], []] and backend.calls == 2


def test_a_fan_out_is_admitted_whole_and_its_parameters_go_no_further(tenant_router):
    backend = FakeBackend("primary")
    model = tenant_router([backend], tenants=FAN_OUT_TENANTS)
    whole = fan_out_requests("alice", 2)
    run(model, *whole)
    assert [r.errors() for r in whole] == [[], []] and backend.calls == 2
    assert all(not any(k.startswith("fan_out") for k in (p or {})) for p in backend.parameters)
    # Its minute is spent: the next fan-out of two is refused whole, as a limit (429).
    refused = fan_out_requests("alice", 2, "next")
    run(model, *refused)
    for request in refused:
        assert request.errors() == [
            "rate limit: tenant 'alice' is over 2 requests per minute with 2 choices (n), "
            "admitted together or not at all"
        ]
    assert backend.calls == 2


def test_a_malformed_fan_out_is_refused_before_any_backend(tenant_router):
    backend = FakeBackend("primary")
    model = tenant_router([backend])
    request = ClientRequest(
        hints={"tenant": "alice"},
        parameters={"fan_out_group": "g", "fan_out_n": 2, "fan_out_index": 5},
    )
    run(model, request)
    assert request.errors()[0].startswith("invalid request: [fan_out_index] fan_out_index must")
    assert backend.calls == 0


def test_a_choice_refused_as_overloaded_gives_back_the_lease_its_group_reserved(tenant_router):
    """The group's first call reserves n leases; a choice the router then cannot route
    (its backend full) must not hold its lease until it expires (deadline_s + 5 s)."""
    backend = FakeBackend("solo", chunks=["x"] * 5, delay_s=0.02)
    model = tenant_router([backend], tenants=FAN_OUT_TENANTS, max_inflight_per_backend=1)
    first, second = fan_out_requests("cara", 2, route="alone")
    run(model, first, second)
    assert first.errors() == [] and second.errors()[0].startswith("overloaded: ")
    assert model.tenants.outbox.pending() == 0
    assert model.tenants.store.leases["cara"] == {}  # both choices' leases are back
