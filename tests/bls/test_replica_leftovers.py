"""Two costs and one blind spot of replica routing in the router (bls/model.py):
- the prompt's key (prefix_index.prompt_key) is made only for a route with replicas, not
  for every request once any backend has them;
- every replica's prefix-index gauges exist from the router's load, so a replica never
  routed to ages like a stale one (the TridentReplicaRoutingStale alert reads the age;
  a missing series never fires).
The router's real code against the doubles of tests/bls/test_model.py."""

from __future__ import annotations

import time

from tests.bls.test_model import (  # noqa: F401  (router: the fixture used below)
    ClientRequest,
    FakeBackend,
    router,
    run,
)
from tests.fakes import fake_pb_utils as pb

REPLICAS = {"primary": ["primary__r0", "primary__r1"]}


def backends():
    return [
        FakeBackend("primary__r0"),
        FakeBackend("primary__r1"),
        FakeBackend("backup"),
        FakeBackend("solo"),
    ]


def test_the_prompt_key_is_made_only_for_a_route_with_replicas(router, monkeypatch):  # noqa: F811
    model = router(backends=backends(), replicas=REPLICAS)
    from bls import replicas as replicas_module

    made = []
    real = replicas_module.prompt_key

    def counted(text, messages):
        made.append(text)
        return real(text, messages)

    monkeypatch.setattr(replicas_module, "prompt_key", counted)
    alone = ClientRequest(prompt="to solo", hints={"route": "alone"})  # solo: no replicas
    run(model, alone)
    assert alone.served_by() == {"solo"} and not alone.errors()
    assert made == []  # the old router made the key for every request
    routed = ClientRequest(prompt="to primary")  # the default route: primary's replicas
    run(model, routed)
    assert routed.served_by() <= set(REPLICAS["primary"]) and not routed.errors()
    assert made == ["to primary"]


def test_every_replica_has_its_index_gauges_from_load(router):  # noqa: F811
    before = time.time()
    model = router(backends=backends(), replicas=REPLICAS)
    after = time.time()
    model.metrics.writes.flush()  # the router writes its metrics from a thread
    for replica in REPLICAS["primary"]:
        labels = {"router": "router", "backend": "primary", "replica": replica}
        updated = pb.metric("trident_router_replica_index_updated_timestamp_seconds", **labels)
        blocks = pb.metric("trident_router_replica_index_blocks", **labels)
        # Before any request: an empty record as old as the router (no series before).
        assert updated is not None and before <= updated.value() <= after, replica
        assert blocks is not None and blocks.value() == 0, replica
