"""Tenants' limits in two real tritonservers sharing one real Redis.

One rendered repository (the SGLang model with its engine double, behind the router),
served twice: server `allow` as rendered, server `deny` from a copy whose router.json says
on_redis_error: deny. Both count in the same Redis keys, so a tenant's limit holds across
them. Redis is killed mid-run and brought back on the same port.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.sglang_double import SHIM
from tests.bls.test_tenant_redis import busy
from tests.gpu import check_sglang
from tests.helpers import metric_value, wait_for
from tests.helpers.servers import render
from tests.helpers.streams import Stream

pytestmark = pytest.mark.server

TENANTS = {
    "default": {"requests_per_minute": 1000},
    "limits": {
        "alice": {"tier": "premium", "requests_per_minute": 3},
        "bob": {},
        "carol": {"max_concurrent": 1},
        "dave": {"tokens_per_minute": 20},
        "eve": {"requests_per_minute": 5},
        "frank": {"requests_per_minute": 5},
        "gina": {"max_concurrent": 2},
    },
}


@pytest.fixture(scope="module")
def servers(redis, tmp_path_factory, pool):
    tmp = tmp_path_factory.mktemp("tenants")
    spec = check_sglang.deployment("/models/test-double", "cpu")
    spec["tenants"] = {**TENANTS, "redis": redis.url}
    allow_repo = render(spec, tmp / "repo")
    (allow_repo / check_sglang.MODEL / "1" / "sglang.py").write_text(SHIM)
    deny_repo = tmp / "repo-deny"
    shutil.copytree(allow_repo, deny_repo)
    config_path = deny_repo / "router" / "1" / "router.json"
    config = json.loads(config_path.read_text())
    config["tenants"]["on_redis_error"] = "deny"
    config_path.write_text(json.dumps(config))
    # Two tritonservers, as two pods would be: the second is a process of its own.
    with (
        pool.serving("tenants-allow", allow_repo, timeout_s=90) as allow,
        pool.serving("tenants-deny", deny_repo, timeout_s=90) as deny,
    ):
        yield {"allow": allow, "deny": deny}


def ask(server, tenant, max_tokens=2, timeout_s=30, parameters=None):
    stream = Stream(server, hints={"tenant": tenant}, max_tokens=max_tokens, parameters=parameters)
    try:
        assert stream.pump(timeout_s), "no final response"
        return stream
    finally:
        stream.close()


def total(servers, name, **labels):
    return sum(
        metric_value(s.metrics_url, name, router="router", **labels) for s in servers.values()
    )


def test_three_requests_per_minute_hold_across_two_servers(servers):
    pair = [servers["allow"], servers["deny"]]
    # Counters as deltas: the pool's process may have served another router of this name.
    admitted = lambda: total(servers, "trident_tenant_admitted_total", tenant="alice")  # noqa: E731
    rejected = lambda: total(  # noqa: E731
        servers, "trident_tenant_rejected_total", tenant="alice", reason="requests_per_minute"
    )
    before = admitted(), rejected()
    answers = [ask(pair[i % 2], "alice") for i in range(6)]
    passed = [a for a in answers if not a.errors]
    assert len(passed) == 3 and all(a.text for a in passed)
    refused = [a.errors for a in answers if a.errors]
    assert refused == [["rate limit: tenant 'alice' is over 3 requests per minute"]] * 3
    assert all(a.finals == 1 for a in answers)
    assert (admitted() - before[0], rejected() - before[1]) == (3, 3)
    # Another tenant is untouched, and no refusal counted against the backend.
    assert not ask(pair[0], "bob").errors and not ask(pair[1], "bob").errors
    # This router's one instance: a router of the same name that the pool's process
    # served before (two instances) left its own series behind.
    breaker = total(
        servers,
        "trident_router_breaker_state",
        backend=check_sglang.MODEL,
        router_instance="router_0_0",
    )
    assert breaker == 0


def fan_out(servers, tenant, n, group):
    """The n calls of one fan-out as the OpenAI frontend sends them (one per choice, its
    request parameters naming the group), at once, alternating between the servers."""
    pair = [servers["allow"], servers["deny"]]
    with ThreadPoolExecutor(n) as pool:
        calls = [
            pool.submit(
                ask,
                pair[i % 2],
                tenant,
                parameters={"fan_out_group": group, "fan_out_n": n, "fan_out_index": i},
            )
            for i in range(n)
        ]
        return [call.result() for call in calls]


def test_a_fan_out_is_admitted_whole_across_two_servers_and_refused_whole(servers):
    """Issue 34: a 5-per-minute tenant sending n=6 was charged 5 and got a 429 and
    nothing else; a max_concurrent: 2 tenant could never succeed with n=3 and was told
    it was over 2 concurrent requests."""
    never = fan_out(servers, "frank", 6, "never-rate")
    assert [a.errors for a in never] == [
        [
            "invalid request: [n] n is 6, and each choice is a request of its own: tenant "
            "'frank' may never have more than 5 at once (its requests_per_minute is 5); "
            "ask for n of 5 or fewer"
        ]
    ] * 6
    too_wide = fan_out(servers, "gina", 3, "never-concurrent")
    assert all("(its max_concurrent is 2)" in a.errors[0] for a in too_wide)
    whole = fan_out(servers, "frank", 3, "whole")
    assert [a.errors for a in whole] == [[]] * 3 and all(a.text for a in whole)
    refused = fan_out(servers, "frank", 3, "refused")  # 2 of the minute's 5 are left
    assert [a.errors for a in refused] == [
        [
            "rate limit: tenant 'frank' is over 5 requests per minute with 3 choices (n), "
            "admitted together or not at all"
        ]
    ] * 3
    # Nothing of the refused ones was charged: the last two of the minute are frank's.
    assert [ask(servers["deny"], "frank").errors for _ in range(2)] == [[], []]
    assert ask(servers["allow"], "frank").errors  # and then the minute is spent
    assert [a.errors for a in fan_out(servers, "gina", 2, "two")] == [[], []]


def test_tokens_are_charged_after_the_response(servers):
    first = ask(servers["allow"], "dave", max_tokens=30)
    assert not first.errors
    wait_for(
        lambda: (
            metric_value(
                servers["allow"].metrics_url,
                "trident_tenant_tokens_total",
                tenant="dave",
                kind="completion",
            )
            >= 1
        ),
        timeout_s=10,
    )
    time.sleep(0.2)  # the charge is written to Redis off the request's path
    second = ask(servers["deny"], "dave")
    assert second.errors == ["rate limit: tenant 'dave' is over 20 tokens per minute"]


def test_a_concurrency_slot_returns_after_a_cancel(servers):
    server = servers["allow"]
    long = Stream(server, hints={"tenant": "carol"}, max_tokens=300)
    try:
        long.wait_first_text(30)
        assert metric_value(server.metrics_url, "trident_tenant_inflight", tenant="carol") == 1
        blocked = ask(servers["deny"], "carol")
        assert blocked.errors == [
            "rate limit: tenant 'carol' is over 1 concurrent requests (max_concurrent)"
        ]
    finally:
        long.close(cancel=True)
    wait_for(
        lambda: metric_value(server.metrics_url, "trident_tenant_inflight", tenant="carol") == 0,
        timeout_s=15,
    )
    wait_for(lambda: not ask(servers["deny"], "carol").errors, timeout_s=15)


def test_the_limit_holds_exactly_on_a_cpu_loaded_machine_in_both_modes(servers):
    """16 streams of other traffic through both routers and 16 CPU burners; 15
    requests at once for a 5-per-minute tenant, spread over the `allow` and the `deny`
    router: exactly 5 admitted, 10 refused for the rate, none decided by
    on_redis_error (with the 50 ms budget: 11 of 15 admitted by `allow`, `deny`
    refusing while Redis was up)."""

    def failures():
        return {
            d: total(servers, "trident_tenant_redis_failures_total", decision=d)
            for d in ("allow", "deny")
        }

    pair = [servers["allow"], servers["deny"]]
    before = failures()
    stop = threading.Event()

    def other_traffic(i):
        while not stop.is_set():
            ask(pair[i % 2], "bob", max_tokens=100, timeout_s=60)

    with (
        busy(processes=16, threads=0),
        ThreadPoolExecutor(16) as others,
        ThreadPoolExecutor(15) as pool,
    ):
        streams = [others.submit(other_traffic, i) for i in range(16)]
        try:
            time.sleep(1.0)
            started = time.monotonic()
            answers = list(pool.map(lambda i: ask(pair[i % 2], "eve", timeout_s=50), range(15)))
            took = time.monotonic() - started
        finally:
            stop.set()
        for stream in streams:
            stream.result(timeout=90)
    assert took < 12, took  # within one refill interval of the 5-per-minute bucket
    refused = [a.errors for a in answers if a.errors]
    assert len(refused) == 10 and all(
        e == ["rate limit: tenant 'eve' is over 5 requests per minute"] for e in refused
    )
    assert all(a.text for a in answers if not a.errors)
    assert failures() == before


def test_redis_killed_allow_passes_deny_fails_fast_then_limits_resume(servers, redis):
    redis.kill()
    try:
        started = time.monotonic()
        passed = ask(servers["allow"], "alice")  # over its limit, but unchecked
        assert not passed.errors
        assert time.monotonic() - started < 10  # bounded: never a hang
        started = time.monotonic()
        denied = ask(servers["deny"], "bob")
        took = time.monotonic() - started
        assert len(denied.errors) == 1 and "on_redis_error: deny" in denied.errors[0]
        assert took < 5, took
        assert total(servers, "trident_tenant_redis_failures_total", decision="allow") >= 1
        assert total(servers, "trident_tenant_redis_failures_total", decision="deny") >= 1
    finally:
        redis.start()
    # Both routers reconnect by themselves; the fresh Redis counts from zero.
    wait_for(lambda: not ask(servers["deny"], "bob").errors, timeout_s=15, interval_s=0.3)
    time.sleep(1.0)  # past the allow router's retry pause too
    pair = [servers["allow"], servers["deny"]]
    answers = [ask(pair[i % 2], "alice") for i in range(4)]
    assert [bool(a.errors) for a in answers].count(False) == 3
