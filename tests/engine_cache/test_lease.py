"""The build lease's rules, against an in-memory store with S3's conditional semantics."""

from __future__ import annotations

import itertools

from engine_cache.lease import Lease, LeaseRecord, parse_lease
from tests.helpers.engine_cache import FakeClock


class ConditionalStore:
    """If-None-Match / If-Match on one object per key, as S3 (and SeaweedFS) do them."""

    def __init__(self):
        self.objects: dict[str, tuple[bytes, str]] = {}
        self._etags = (f"etag-{n}" for n in itertools.count())

    def create_lease(self, key, body):
        if key in self.objects:
            return None
        self.objects[key] = (body, next(self._etags))
        return self.objects[key][1]

    def replace_lease(self, key, body, etag):
        if key not in self.objects or self.objects[key][1] != etag:
            return None
        self.objects[key] = (body, next(self._etags))
        return self.objects[key][1]

    def read_lease(self, key):
        return self.objects.get(key)

    def delete_lease(self, key, etag):
        if key in self.objects and self.objects[key][1] == etag:
            del self.objects[key]


def test_one_holder_at_a_time_until_release():
    store, clock = ConditionalStore(), FakeClock()
    first, second = Lease(store, "k", 60, clock), Lease(store, "k", 60, clock)
    assert first.acquire() and not second.acquire()
    assert second.holder == first.owner
    first.release()
    assert "k" not in store.objects and second.acquire()


def test_expired_lease_is_taken_over_by_exactly_one_waiter():
    store, clock = ConditionalStore(), FakeClock()
    dead = Lease(store, "k", 60, clock)
    assert dead.acquire()
    clock.now += 61
    waiters = [Lease(store, "k", 60, clock) for _ in range(3)]
    assert [w.acquire() for w in waiters] == [True, False, False]


def test_renewal_keeps_a_lease_alive_and_a_late_holder_loses_it():
    store, clock = ConditionalStore(), FakeClock()
    holder, waiter = Lease(store, "k", 60, clock), Lease(store, "k", 60, clock)
    assert holder.acquire()
    clock.now += 50
    assert holder.renew()
    clock.now += 50  # 100 s after start, 50 s after the renewal
    assert not waiter.acquire()
    clock.now += 11
    assert waiter.acquire()  # expired: taken over
    assert not holder.renew()  # the old holder notices it lost the lease
    holder.release()  # and must not delete the new holder's lease
    assert parse_lease(store.objects["k"][0]).owner == waiter.owner


def test_unreadable_lease_counts_as_expired():
    store, clock = ConditionalStore(), FakeClock()
    store.objects["k"] = (b"not json", "etag-x")
    assert parse_lease(b"not json") is None
    assert Lease(store, "k", 60, clock).acquire()
    assert LeaseRecord("a", 10.0).expired(10.0) and not LeaseRecord("a", 10.0).expired(9.9)
