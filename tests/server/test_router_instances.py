"""`router.instances: 2` in a real tritonserver: two router stubs in front of two SGLang
models (trident's SGLang model on the SGLang double), tenants on a real Redis.

What docs/router.md ("Router instances") promises, checked here: Triton hands requests to
both instances; streams complete through either; the counters of both instances add up
in one series (nothing counted twice or lost) while each instance's gauges carry its
instance name; a tenant limit on the shared Redis store
holds across the instances; and when the primary backend dies, requests fall back, each
instance's breaker opening after its own `consecutive_failures` failures (so N x
consecutive_failures fallbacks in all, then none). The tests run in file order: the last
one kills the primary's stub.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from builder.serve.watch import stub_processes
from support.sglang_double import MODEL, SHIM, deployment
from tests.helpers import metric_value, metrics_text, wait_for
from tests.helpers.servers import render
from tests.helpers.streams import Stream

pytestmark = pytest.mark.server

INSTANCES = 2
CONSECUTIVE_FAILURES = 2
BACKUP = "backup"


@pytest.fixture(scope="module")
def server(redis, tmp_path_factory, pool):
    tmp = tmp_path_factory.mktemp("router-instances")
    spec = deployment("/models/test-double", "cpu")
    spec["models"].append({**spec["models"][0], "name": BACKUP})
    spec["router"] = {
        "default": [MODEL],
        "fallback": {MODEL: [BACKUP]},
        "instances": INSTANCES,
        "breaker": {"consecutive_failures": CONSECUTIVE_FAILURES, "cooldown_s": 600},
    }
    spec["tenants"] = {
        "redis": redis.url,
        "default": {"requests_per_minute": 10000},
        "limits": {"alice": {"requests_per_minute": 3}},
    }
    repo = render(spec, tmp / "repo")
    for model in (MODEL, BACKUP):
        (repo / model / "1" / "sglang.py").write_text(SHIM)
    with pool.serving("router-instances", repo, timeout_s=120) as started:
        yield started


def stubs(server) -> dict[str, int]:
    """Instance name -> pid of this server's Python-backend stubs."""
    return {s.instance: s.pid for s in stub_processes(server.process.pid).values()}


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def ask(server, tenant="bob", max_tokens=4, timeout_s=30) -> Stream:
    stream = Stream(server, hints={"tenant": tenant}, max_tokens=max_tokens)
    try:
        assert stream.pump(timeout_s), "no final response"
        return stream
    finally:
        stream.close()


def series(server, *names) -> list[str]:
    """Every sample of these metric families (a failure's evidence)."""
    return [
        line for line in metrics_text(server.metrics_url).splitlines() if line.startswith(names)
    ]


def metric(server, name, **labels) -> float:
    return metric_value(server.metrics_url, name, router="router", **labels)


def test_two_router_stubs_share_the_streams(server):
    routers = {k: v for k, v in stubs(server).items() if k.startswith("router_")}
    assert sorted(routers) == ["router_0_0", "router_0_1"]
    before = {name: cpu_ticks(pid) for name, pid in routers.items()}
    with ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(lambda _: ask(server, max_tokens=32), range(32)))
    for stream in streams:
        assert not stream.errors and stream.text and stream.finals == 1
        assert stream.served_by == {MODEL}
    # An idle stub uses no CPU: both used some, so Triton gave both of them streams.
    used = {name: cpu_ticks(pid) - before[name] for name, pid in routers.items()}
    assert all(ticks > 0 for ticks in used.values()), used


def test_counters_of_both_instances_add_up(server):
    # Triton gives every stub the same series for a name and labels: each request is
    # counted once, whichever instance served it.
    requests = lambda: metric(  # noqa: E731
        server,
        "trident_router_requests_total",
        route="default",
        served_by=MODEL,
    )
    latency = lambda: metric(server, "trident_router_added_latency_seconds_count")  # noqa: E731
    before = requests(), latency()
    for _ in range(10):
        assert not ask(server).errors
    wait_for(lambda: requests() - before[0] >= 10, timeout_s=10)
    time.sleep(0.3)  # metric writes are queued: a late double count would show by now
    assert (requests() - before[0], latency() - before[1]) == (10, 10)


def test_a_tenant_limit_holds_across_instances(server):
    # Consecutive requests alternate between the instances (the next test relies on
    # that too); Redis counts for both. Counters as deltas: the pool's process may have
    # served another router of this name (tests/helpers/pool.py).
    admitted = lambda: metric(server, "trident_tenant_admitted_total", tenant="alice")  # noqa: E731
    rejected = lambda: metric(  # noqa: E731
        server, "trident_tenant_rejected_total", tenant="alice", reason="requests_per_minute"
    )
    before = admitted(), rejected()
    answers = [ask(server, "alice") for _ in range(6)]
    assert [bool(a.errors) for a in answers].count(False) == 3
    refused = [a.errors for a in answers if a.errors]
    assert refused == [["rate limit: tenant 'alice' is over 3 requests per minute"]] * 3
    assert all(a.finals == 1 for a in answers)
    assert (admitted() - before[0], rejected() - before[1]) == (3, 3)


def test_fallback_works_and_each_instance_trips_its_own_breaker(server):
    fallbacks = lambda: metric(  # noqa: E731
        server,
        "trident_router_fallbacks_total",
        backend=MODEL,
    )
    breaker = lambda backend, instance: metric(  # noqa: E731
        server, "trident_router_breaker_state", backend=backend, router_instance=instance
    )
    instances = ("router_0_0", "router_0_1")
    # A success on the primary resets a breaker's count of consecutive failures: after
    # these (consecutive requests alternate between the instances), neither instance
    # starts the kill with a failure left from an earlier test, and each opens after
    # exactly its own two.
    for _ in range(4 * INSTANCES):
        assert ask(server).served_by == {MODEL}
    before = fallbacks()
    os.kill(stubs(server)[f"{MODEL}_0_0"], signal.SIGKILL)
    # Triton hands a request to whichever instance's thread takes it first: on a loaded
    # box one instance may take several in a row, so ask until both breakers are open
    # (the gauge is each instance's own series: a gauge is set, not added up).
    served = []
    for _ in range(60):
        stream = ask(server)
        assert not stream.errors and stream.text and stream.finals == 1
        served.append(stream.served_by)
        if all(breaker(MODEL, instance) == 2 for instance in instances):
            break
    assert all(breaker(MODEL, instance) == 2 for instance in instances), served
    assert served == [{BACKUP}] * len(served)
    # Each instance tried the dead primary until its own breaker opened: 2 x 2 attempts,
    # then none, though the two instances kept taking requests.
    try:
        wait_for(lambda: fallbacks() - before >= INSTANCES * CONSECUTIVE_FAILURES, timeout_s=10)
    except AssertionError:
        raise AssertionError(
            f"{fallbacks() - before} fallbacks after {len(served)} asks (counted from "
            f"{before}); the series: "
            f"{series(server, 'trident_router_fallbacks_total', 'trident_router_breaker_state')}"
        ) from None
    for _ in range(6):
        assert ask(server).served_by == {BACKUP}
    time.sleep(0.3)
    assert fallbacks() - before == INSTANCES * CONSECUTIVE_FAILURES
    assert all(breaker(BACKUP, instance) == 0 for instance in instances)
