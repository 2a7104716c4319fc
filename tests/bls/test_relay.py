"""The router's relay (bls/relay.py) alone: when a BLS call slot is handed back and the
loop told the first response's outcome, against the stub's fake pb_utils."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import fake_pb_utils as pb

ROOT = Path(__file__).resolve().parents[2]
FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@pytest.fixture
def relay():
    """bls.relay, under the pb_utils test double (tests/conftest.py)."""
    from bls import relay

    return relay


class GatedSender(pb.ResponseSender):
    """Each send waits for `gate`, as a send waits for a busy server."""

    def __init__(self):
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()

    def send(self, response=None, flags=0):
        self.entered.set()
        assert self.gate.wait(5)
        super().send(response, flags)


class Adapter:
    """The engine models' dialect, reduced: every response is relayed as it is."""

    @staticmethod
    def split(response):
        return None, response, response.value("finish_reason") != ""


class Child:
    """A BLS request whose call returns with its one (final) response, or raises."""

    def __init__(self, error=None):
        self.error = error

    def exec(self, decoupled=False):
        if self.error is not None:
            raise pb.TritonModelException(self.error)
        text = pb.Tensor("text_output", np.array([b"x"], dtype=np.object_))
        finish = pb.Tensor("finish_reason", np.array([b"stop"], dtype=np.object_))
        return iter([pb.InferenceResponse(output_tensors=[text, finish])])


def start(relay, sender, child):
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(max_workers=2)
    slots = relay.CallSlots(1, pool, loop)
    attempt = relay.Relay(sender, Adapter(), "primary", loop, False, relay.Retired())
    slots.start(attempt, child)
    return loop, pool, slots, attempt


def test_the_call_slot_is_handed_back_after_the_first_response_went_out(relay):
    """Not while the relay thread is still sending it: a wake-up of the loop then takes
    the GIL from the first-token path (and hands the slot to a waiting call early)."""
    sender = GatedSender()
    loop, pool, slots, attempt = start(relay, sender, Child())
    try:
        assert sender.entered.wait(5)  # the first send is under way
        loop.run_until_complete(asyncio.sleep(0.05))  # whatever the thread posted runs
        assert slots.free == 0 and not attempt.first.done()
        sender.gate.set()
        assert loop.run_until_complete(asyncio.wait_for(attempt.first, 5)) is None
        assert slots.free == 1
        assert loop.run_until_complete(asyncio.wait_for(attempt.done, 5)) is True
        assert [flags for _, flags in sender.sent] == [FINAL]
    finally:
        sender.gate.set()
        pool.shutdown(wait=True)
        loop.close()


def test_a_failed_call_hands_its_slot_back_with_the_failure(relay):
    sender = GatedSender()
    loop, pool, slots, attempt = start(relay, sender, Child("Stub process is not healthy"))
    try:
        outcome = loop.run_until_complete(asyncio.wait_for(attempt.first, 5))
        assert outcome == "Stub process is not healthy" and slots.free == 1
        assert sender.sent == []  # the router falls back, not this
    finally:
        pool.shutdown(wait=True)
        loop.close()


def test_a_cancel_check_does_not_wait_for_a_send_in_progress(relay):
    """The event loop asks for a client's cancel (the router's watch) and serves every
    request: while the relay thread holds the lock for a send that waits on the server,
    the check answers "not yet" at once, MAX_SKIPPED times in a row; the next one waits
    for the send, so a cancel is still seen on a stream that sends back to back."""
    sender = GatedSender()
    sender.cancelled = True
    loop, pool, slots, attempt = start(relay, sender, Child())
    try:
        assert sender.entered.wait(5)  # the first send holds the lock, waiting on the gate
        skipped = [attempt.client_cancelled() for _ in range(relay.MAX_SKIPPED)]
        assert skipped == [False] * relay.MAX_SKIPPED
        waiting = pool.submit(attempt.client_cancelled)  # the next check waits for the send
        assert not waiting.done()
        sender.gate.set()
        # The send was the answer's last: the stream is closed, nothing is asked after it.
        assert waiting.result(5) is False and attempt.closed
        assert attempt.cancel_checks_skipped == 0
    finally:
        sender.gate.set()
        pool.shutdown(wait=True)
        loop.close()


def test_a_cancel_check_on_an_open_stream_asks_the_sender(relay):
    sender, loop = pb.ResponseSender(), asyncio.new_event_loop()
    try:
        attempt = relay.Relay(sender, Adapter(), "primary", loop, False, relay.Retired())
        assert attempt.client_cancelled() is False
        sender.cancelled = True
        assert attempt.client_cancelled() is True
    finally:
        loop.close()
