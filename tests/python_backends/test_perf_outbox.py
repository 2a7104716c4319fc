"""triton_io.Outbox: responses sent from a thread of its own, so the engine's event loop
never waits on the IPC round trip of a send (issue 16: per-token cost of the vLLM model)."""
from __future__ import annotations

import importlib
import sys
import threading

import pytest

from tests.fakes import fake_pb_utils as pb

FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@pytest.fixture
def triton_io():
    saved = {name: sys.modules.get(name) for name in
             ("triton_python_backend_utils", "trident_common.triton_io")}
    sys.modules["triton_python_backend_utils"] = pb
    sys.modules.pop("trident_common.triton_io", None)
    try:
        yield importlib.import_module("trident_common.triton_io")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class SlowSender(pb.ResponseSender):
    """A sender whose sends wait until the test lets them through."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.threads: set[str] = set()

    def send(self, response=None, flags: int = 0) -> None:
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(5), "the test never opened the gate"
        super().send(response, flags)


def test_a_send_does_not_wait_for_the_server_and_keeps_the_order(triton_io):
    problems = []
    outbox = triton_io.Outbox("m", lambda *p: problems.append(p))
    sender = SlowSender()
    for i in range(3):
        outbox.send(sender, f"r{i}", 0, key="k")     # returns while the send is blocked
    outbox.send(sender, None, FINAL, key="k")
    assert sender.sent == []
    sender.gate.set()
    sender.wait_closed()
    outbox.close()
    assert sender.sent == [("r0", 0), ("r1", 0), ("r2", 0), (None, FINAL)]
    assert sender.threads == {"m-outbox"} and problems == []


def test_a_failed_send_is_reported_once_and_later_data_is_dropped(triton_io):
    problems = []
    outbox = triton_io.Outbox("m", lambda *p: problems.append(p))
    sender = pb.ResponseSender()
    sender.closed.set()                     # every send now raises
    outbox.send(sender, "a", 0, key="k")
    outbox.send(sender, "b", 0, key="k")
    outbox.quiet(sender).send(None, FINAL)   # still tried (and fails quietly)
    outbox.close()
    assert [key for key, _ in problems] == ["k"]
    assert isinstance(problems[0][1], pb.TritonModelException)


def test_cancellation_is_answered_after_the_sends_before_it(triton_io):
    outbox = triton_io.Outbox("m", lambda *p: None)
    sender = SlowSender()
    outbox.send(sender, "r0", 0, key="k")
    answer = outbox.check_cancelled(sender)
    sender.cancelled = True
    assert not answer.done()                # the send before it has not been made yet
    sender.gate.set()
    assert answer.result(5) is True and sender.sent == [("r0", 0)]
    outbox.close()


def test_a_sender_that_cannot_say_counts_as_cancelled(triton_io):
    class Broken(pb.ResponseSender):
        def is_cancelled(self):
            raise RuntimeError("stub gone")

    outbox = triton_io.Outbox("m", lambda *p: None)
    assert outbox.check_cancelled(Broken()).result(5) is True
    assert outbox.check_cancelled(pb.ResponseSender()).result(5) is False
    outbox.close()
