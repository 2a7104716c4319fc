"""Coalescing in the router's relay: chunks already waiting when a relay that fell behind
reads them go to the client as one response (bls/coalesce.py's merge, bls/relay.py).

The merge is pure (numpy in, numpy out). Through the router, a relay is made to count as
behind on every read (BEHIND_S), the way a loaded machine makes it: then its client gets
fewer responses carrying the same text, the same counts and one final flag."""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from bls.coalesce import merge
from tests.bls.test_model import (
    FINAL,
    ClientRequest,
    FakeBackend,
    router,  # noqa: F401  (the fixture)
    run,
)
from tests.bls.test_tenants import CountingBackend
from tests.fakes import fake_pb_utils as pb


def text(value):
    return np.array([value.encode()], dtype=np.object_)


def count(value):
    return np.array([value], dtype=np.uint32)


def chunk(words, output_tokens, finish=""):
    return [("text_output", text(words)), ("finish_reason", text(finish)),
            ("num_input_tokens", count(5)), ("num_output_tokens", count(output_tokens)),
            ("served_by", text("primary")), ("error", text(""))]


def as_dict(merged):
    return {name: array.reshape(-1)[0] for name, array in merged}


def test_running_counts_keep_the_last_and_texts_join_in_order():
    merged = as_dict(merge([chunk(" w1", 1), chunk(" w2", 2), chunk(" w3", 3, "length")],
                           counts_per_response=False))
    assert merged == {"text_output": b" w1 w2 w3", "finish_reason": b"length",
                      "num_input_tokens": 5, "num_output_tokens": 3,
                      "served_by": b"primary", "error": b""}


def test_per_response_counts_add_up_and_keep_their_dtype():
    merged = merge([chunk("a", 1), chunk("b", 2)], counts_per_response=True)
    counts = dict(merged)["num_output_tokens"]
    assert counts.dtype == np.uint32 and counts.tolist() == [3]


@pytest.mark.parametrize("chunks", [
    [chunk("a", 1)],                                                   # nothing to merge
    [chunk("a", 1), chunk("b", 2)[:-1]],                               # outputs differ
    [chunk("a", 1) + [("logprobs", text("[]"))]] * 2,                  # JSON lists
    [[("text_output", np.array([b"a", b"b"], dtype=np.object_))]] * 2,  # two elements
    [[("mystery", count(1))]] * 2,                                     # unknown output
])
def test_what_the_merge_does_not_understand_is_left_alone(chunks):
    assert merge(chunks, counts_per_response=False) is None


def behind(router):  # noqa: F811
    """A router whose relays count as behind on every read (as on a loaded machine)."""
    sys.modules["relay"].BEHIND_S = 3600.0
    return router


class SlowSender(pb.ResponseSender):
    """A send that takes SEND_S (a busy server): the backend's chunks arrive meanwhile."""

    SEND_S = 0.05

    def send(self, response=None, flags=0):
        time.sleep(self.SEND_S)
        super().send(response, flags)


def slow_client(**kwargs):
    request = ClientRequest(**kwargs)
    request.sender = SlowSender()
    return request


def test_a_relay_that_is_behind_sends_the_waiting_chunks_as_one(router):  # noqa: F811
    model = behind(router)(backends=[FakeBackend("primary", chunks=list("abcdef"))])
    request = slow_client()
    run(model, request)
    texts = request.texts()
    assert "".join(texts) == "abcdef"
    assert texts[0] == "a"                 # the first response is never held back
    assert len(texts) < 6, texts           # before: one response per chunk
    assert request.sender.final_flags() == 1 and request.sender.sent[-1][1] & FINAL
    assert request.served_by() == {"primary"}


def test_coalesced_chunks_count_every_token(router):  # noqa: F811
    # The client asked for per-response counts (return_num_output_tokens): a merged
    # response carries the sum of its chunks'; the tenant is charged each token.
    model = behind(router)(backends=[CountingBackend("primary", chunks=list("abcd"))])
    request = slow_client()
    request.inputs["return_num_output_tokens"] = pb.Tensor("return_num_output_tokens",
                                                           np.array([True]))
    run(model, request)
    sent = [r for r in request.sender.responses() if r.output_tensors()]
    assert len(sent) < 4
    assert sum(int(r.value("num_output_tokens")) for r in sent) == 4
    assert "".join(request.texts()) == "abcd" and request.sender.final_flags() == 1


def test_an_error_after_coalesced_chunks_still_ends_the_stream_once(router):  # noqa: F811
    backend = FakeBackend("primary", chunks=list("abcdef"), fail_after=4)
    model = behind(router)(backends=[backend])
    request = slow_client()
    run(model, request)
    assert "".join(request.texts()) == "abcd"
    assert len(request.texts()) < 4
    assert request.errors() == ["primary failed mid-stream: engine exploded"]
    assert request.sender.final_flags() == 1 and request.sender.sent[-1] == (None, FINAL)
    assert model.breakers["primary"].state == "closed"   # one failure, under threshold
