"""The router's backend request ids (bls/job.py, RequestIds): unique within a router and
across its instances, unguessable without the instance's key, made without a system
call per id (os.urandom releases the GIL: the event loop then waits behind the relays),
and made ahead with their request_id tensor and the router's proof."""

from __future__ import annotations

import os
import re

import pytest

from bls.job import READY_IDS, RequestIds
from trident_common import trust
from trident_common.interface import REQUEST_ID, ROUTER_PROOF

KEY = b"k" * 32


def test_ids_are_the_routers_name_and_32_hex_digits_never_repeated():
    ids = RequestIds("router")
    drawn = [ids.new().text for _ in range(10_000)]
    assert all(re.fullmatch(r"router-[0-9a-f]{32}", i) for i in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_instances_of_one_router_never_draw_the_same_id():
    """Each draws its own key: the same counter gives different ids."""
    first, second = RequestIds("router"), RequestIds("router")
    assert not {first.new().text for _ in range(1_000)} & {second.new().text for _ in range(1_000)}


def test_an_id_costs_no_system_call(monkeypatch):
    ids = RequestIds("router")

    def no_urandom(n: int) -> bytes:
        raise AssertionError("os.urandom per id")

    monkeypatch.setattr(os, "urandom", no_urandom)
    assert ids.new().text != ids.new().text
    with pytest.raises(AssertionError):
        RequestIds("router")  # the key alone is drawn from the system


def test_an_id_comes_with_its_tensor_and_the_proof_an_engine_model_accepts():
    made = RequestIds("router", KEY).new()
    assert made.tensor.name() == REQUEST_ID
    assert made.tensor.as_numpy().tolist() == [made.text.encode()]
    parameters = {ROUTER_PROOF: made.plain_proof}
    assert trust.proves_generate(KEY, parameters, made.text, None, None)
    assert not trust.proves_generate(KEY, parameters, made.text, 1, None)  # a priority: its own
    assert RequestIds("router").new().plain_proof is None  # no key, no proof


def test_ids_made_ahead_are_handed_out_first_and_each_once():
    ids = RequestIds("router", KEY)
    ids.restock()
    ready = [made.text for made in ids.ready]
    assert len(ready) == READY_IDS
    assert [ids.new().text for _ in range(READY_IDS + 2)][:READY_IDS] == ready
    ids.restock()
    assert not {made.text for made in ids.ready} & set(ready)
