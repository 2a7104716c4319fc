"""The router's backend request ids (bls/job.py, RequestIds): unique within a router and
across its instances, unguessable without the instance's key, and made without a system
call per id (os.urandom releases the GIL: the event loop then waits behind the relays)."""

from __future__ import annotations

import os
import re

import pytest

from bls.job import RequestIds


def test_ids_are_the_routers_name_and_32_hex_digits_never_repeated():
    ids = RequestIds("router")
    drawn = [ids.new() for _ in range(10_000)]
    assert all(re.fullmatch(r"router-[0-9a-f]{32}", i) for i in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_instances_of_one_router_never_draw_the_same_id():
    """Each draws its own key: the same counter gives different ids."""
    first, second = RequestIds("router"), RequestIds("router")
    assert not {first.new() for _ in range(1_000)} & {second.new() for _ in range(1_000)}


def test_an_id_costs_no_system_call(monkeypatch):
    ids = RequestIds("router")

    def no_urandom(n: int) -> bytes:
        raise AssertionError("os.urandom per id")

    monkeypatch.setattr(os, "urandom", no_urandom)
    assert ids.new() != ids.new()
    with pytest.raises(AssertionError):
        RequestIds("router")  # the key alone is drawn from the system
