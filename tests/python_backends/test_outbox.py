"""The engine models' sender thread (trident_common/outbox.py) and delta coalescing
(trident_common/deltas.py), with a sender that records and can block like Triton's."""

from __future__ import annotations

import threading

from tests.helpers import wait_for
from trident_common.deltas import Delta, batches, merge
from trident_common.outbox import Outbox, Outlet

FINAL = 1


def delta(text, tokens, finish=None, logprobs=None, cumulative=None) -> Delta:
    return Delta(text, finish, 7, tokens, logprobs, cumulative)


class Sender:
    """Records (response, flags); `gate` (when set) holds each send until it is opened,
    as a send waits for a busy server; `cancelled` and `fail` are what a test sets."""

    def __init__(self):
        self.sent: list = []
        self.gate: threading.Event | None = None
        self.entered = threading.Semaphore(0)  # released as each send starts
        self.cancelled, self.fail, self.checks = False, None, 0

    def send(self, response=None, flags=0):
        self.entered.release()
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        self.sent.append((response, flags))

    def is_cancelled(self):
        self.checks += 1
        return self.cancelled

    def finals(self) -> int:
        return sum(1 for _, flags in self.sent if flags == FINAL)


class Box:
    """An Outbox whose stopped streams are recorded; one outlet per `outlet()`."""

    def __init__(self, check_every_s=1000.0):
        self.stopped: list = []
        self.outbox = Outbox("test-send", lambda owner, error: self.stopped.append((owner, error)))
        self.check_every_s = check_every_s

    def outlet(self, sender, owner="stream"):
        # The response is the merged delta itself: what was sent is what was merged.
        return Outlet(sender, lambda d: d, FINAL, 0.0, self.check_every_s, owner)

    def close(self):
        assert self.outbox.close(5)


# -- pure: merging -----------------------------------------------------------------------


def test_merged_deltas_carry_every_tokens_text_and_logprobs_and_the_last_counts():
    merged = merge(
        [
            delta(" a", 1, logprobs=[{"1": 0}], cumulative=-0.5),
            delta(" b", 2),
            delta(" c", 4, "length", logprobs=[{"2": 0}, {"3": 0}], cumulative=-2.0),
        ]
    )
    assert merged == Delta(" a b c", "length", 7, 4, [{"1": 0}, {"2": 0}, {"3": 0}], -2.0)
    assert merge([delta(" a", 1), delta(" b", 2)]).logprobs is None
    one = delta(" x", 1)
    assert merge([one]) is one


def test_batches_merge_runs_of_deltas_but_never_across_a_callable():
    def marker():
        return None

    out = batches([delta(" a", 1), delta(" b", 2), marker, delta(" c", 3), delta(" d", 4)])
    assert [getattr(item, "text", item) for item in out] == [" a b", marker, " c d"]
    assert batches([]) == []


# -- the thread --------------------------------------------------------------------------


def test_deltas_pending_while_a_send_waits_leave_as_one_response():
    box, sender = Box(), Sender()
    sender.gate = threading.Event()
    outlet = box.outlet(sender)
    box.outbox.push(outlet, delta(" w0", 1))
    assert sender.entered.acquire(timeout=5)  # that send is waiting on the server
    for i in range(1, 5):
        box.outbox.push(outlet, delta(f" w{i}", i + 1, "length" if i == 4 else None))
    sender.gate.set()
    wait_for(lambda: sender.finals() == 1, timeout_s=5)
    box.close()
    assert [(d.text, d.output_tokens, flags) for d, flags in sender.sent] == [
        (" w0", 1, 0),
        (" w1 w2 w3 w4", 5, FINAL),
    ]


def test_an_idle_outbox_sends_a_lone_delta_at_once():
    box, sender = Box(), Sender()
    outlet = box.outlet(sender)
    box.outbox.push(outlet, delta(" w0", 1))
    wait_for(lambda: sender.sent, timeout_s=5)  # nothing else was pushed after it
    box.outbox.push(outlet, delta(" w1", 2))
    wait_for(lambda: len(sender.sent) == 2, timeout_s=5)
    box.close()
    assert [d.text for d, _ in sender.sent] == [" w0", " w1"]


def test_callables_run_in_their_place_between_responses():
    box, sender = Box(), Sender()
    outlet, seen = box.outlet(sender), []
    box.outbox.push(outlet, delta(" a", 1))
    box.outbox.push(outlet, lambda: seen.append(len(sender.sent)))
    box.outbox.push(outlet, delta(" b", 2, "stop"))
    box.close()  # sends what is queued first
    assert seen == [1] and [d.text for d, _ in sender.sent] == [" a", " b"]
    assert sender.finals() == 1


def test_a_client_found_gone_gets_no_more_data_and_one_final_flag():
    box, sender = Box(check_every_s=0.0), Sender()
    sender.gate = threading.Event()
    outlet = box.outlet(sender, owner="s1")
    box.outbox.push(outlet, delta(" a", 1))
    assert sender.entered.acquire(timeout=5)  # checked, then sent: waiting
    sender.cancelled = True
    box.outbox.push(outlet, delta(" b", 2))
    sender.gate.set()
    wait_for(lambda: box.stopped, timeout_s=5)  # found gone before sending " b"
    box.outbox.push(outlet, delta(" c", 3, "stop"))  # the loop had got there first
    box.close()
    assert box.stopped == [("s1", None)]
    assert sender.sent[0][0].text == " a" and sender.sent[1:] == [(None, FINAL)]


def test_cancellation_is_checked_at_most_every_interval():
    box, sender = Box(check_every_s=1000.0), Sender()
    outlet = box.outlet(sender)  # first check due at once
    for i in range(5):
        box.outbox.push(outlet, delta(" w", i + 1))
        wait_for(lambda n=i + 1: len(sender.sent) == n, timeout_s=5)
    box.outbox.push(outlet, delta(" end", 6, "stop"))
    box.close()
    assert sender.checks == 1 and sender.finals() == 1


def test_a_failed_send_stops_the_streams_data_and_says_why():
    box, sender = Box(), Sender()
    outlet = box.outlet(sender, owner="s2")
    error = RuntimeError("stream closed")
    sender.fail = error
    box.outbox.push(outlet, delta(" a", 1))
    wait_for(lambda: box.stopped, timeout_s=5)
    sender.fail = None
    box.outbox.push(outlet, delta(" b", 2))
    box.close()
    assert box.stopped == [("s2", error)] and sender.sent == []


def test_streams_do_not_wait_for_each_other_to_finish():
    """One stream's pending deltas go out in its turn, not after another stream ends."""
    box, first, second = Box(), Sender(), Sender()
    a, b = box.outlet(first, "a"), box.outlet(second, "b")
    box.outbox.push(a, delta(" a0", 1))
    box.outbox.push(b, delta(" b0", 1))
    box.outbox.push(a, delta(" a1", 2))
    wait_for(lambda: first.sent and second.sent, timeout_s=5)
    box.close()
    assert [d.text for d, _ in first.sent] in ([" a0 a1"], [" a0", " a1"])
    assert [d.text for d, _ in second.sent] == [" b0"]


# -- deferred writes (Outbox.defer) ---------------------------------------------------


def test_a_deferred_write_runs_after_the_next_data_response_not_before_it():
    """The first token leaves before its time-to-first-token write, which still runs
    before the stream's next callable."""
    box, sender = Box(), Sender()
    sender.gate = threading.Event()
    outlet, seen = box.outlet(sender), []
    box.outbox.push(outlet, delta(" hold", 1))
    assert sender.entered.acquire(timeout=5)  # the thread is busy sending
    box.outbox.push(outlet, delta(" a", 2))
    box.outbox.defer(outlet, lambda: seen.append(("ttft", len(sender.sent))))
    box.outbox.push(outlet, lambda: seen.append(("count", len(sender.sent))))
    box.outbox.push(outlet, delta(" b", 3, "stop"))
    sender.gate.set()
    box.close()
    assert seen == [("ttft", 2), ("count", 2)]
    assert [d.text for d, _ in sender.sent] == [" hold", " a", " b"]


def test_a_deferred_write_runs_before_the_last_response():
    """A client that has its last response finds the write made."""
    box, sender = Box(), Sender()
    sender.gate = threading.Event()
    outlet, seen = box.outlet(sender), []
    box.outbox.push(outlet, delta(" hold", 1))
    assert sender.entered.acquire(timeout=5)
    box.outbox.defer(outlet, lambda: seen.append(len(sender.sent)))
    box.outbox.push(outlet, delta(" end", 2, "stop"))
    sender.gate.set()
    box.close()
    assert seen == [1] and sender.finals() == 1


def test_deltas_on_either_side_of_a_deferred_write_still_merge():
    box, sender = Box(), Sender()
    sender.gate = threading.Event()
    outlet, seen = box.outlet(sender), []
    box.outbox.push(outlet, delta(" hold", 1))
    assert sender.entered.acquire(timeout=5)
    box.outbox.push(outlet, delta(" a", 2))
    box.outbox.defer(outlet, lambda: seen.append(len(sender.sent)))
    box.outbox.push(outlet, delta(" b", 3))
    sender.gate.set()
    wait_for(lambda: seen, timeout_s=5)
    box.close()
    assert [d.text for d, _ in sender.sent] == [" hold", " a b"] and seen == [2]


def test_a_deferred_write_alone_does_not_wake_the_thread():
    """It waits for the stream's next item (every stream ends with one)."""
    box, sender = Box(), Sender()
    outlet, seen = box.outlet(sender), []
    box.outbox.defer(outlet, lambda: seen.append("ttft"))
    box.outbox.call(lambda: seen.append("other"))  # the thread ran something after it
    wait_for(lambda: seen, timeout_s=5)
    assert seen == ["other"]
    box.outbox.push(outlet, lambda: seen.append("end"))
    box.close()
    assert seen == ["other", "ttft", "end"]
