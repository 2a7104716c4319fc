"""The router in a draining server (trident_common/drain.py, bls/model.py), against the
stub doubles of tests/bls/test_model.py: a new request is refused in words with the
drain's class, one admitted before the drain finishes (keeping its fallback), the busy
count reaches 0 after the last stream, and a backend's SHUTDOWN refusal (the drain's
timeout, at every backend) reaches the client unchanged: no fallback, no breaker."""

from __future__ import annotations

import asyncio

from tests.bls import test_model
from tests.bls.test_model import ClientRequest, FakeBackend, gauge, run
from tests.fakes import fake_pb_utils as pb
from trident_common import drain
from trident_common.error_classes import DRAINING, SHUTDOWN, classify

router = test_model.router  # the fixture: the real router with the stub's doubles
STOPPING = SHUTDOWN.mark("qwen: the server is stopping and its drain timeout ended this answer")


def enter(model, folder):
    (folder / drain.DRAINING).touch()
    model.drain.check()  # the watch's step now, not within POLL_S


def busy(folder) -> list[str]:
    return [p.read_text() for p in folder.glob(drain.BUSY_PREFIX + "*") if p.suffix != ".tmp"]


def test_a_new_request_is_refused_in_words(router, drain_folder):
    primary = FakeBackend("primary")
    model = router(backends=[primary])
    enter(model, drain_folder)
    request = ClientRequest()
    run(model, request)
    (error,) = request.errors()
    assert classify(error) is DRAINING and "retry on another" in error
    assert request.sender.responses()[0].error().code() == pb.TritonError.UNAVAILABLE
    assert request.sender.final_flags() == 1 and primary.calls == 0
    assert pb.metric("trident_router_errors_total", router="router", reason="draining").value() >= 1


def test_a_stream_admitted_before_the_drain_finishes_whole(router, drain_folder):
    model = router(backends=[FakeBackend("primary", chunks=list("abcdef"), delay_s=0.02)])
    admitted, late = ClientRequest(), ClientRequest()

    async def drain_then_ask():
        while not admitted.texts():
            await asyncio.sleep(0.002)
        enter(model, drain_folder)
        assert busy(drain_folder) == ["1"]
        await model.handle_batch([late])

    run(model, admitted, during=drain_then_ask)
    assert admitted.texts() == list("abcdef") and not admitted.errors()
    assert classify(late.errors()[0]) is DRAINING
    model.drain.check()
    assert busy(drain_folder) == ["0"]


def test_an_admitted_request_keeps_its_fallback(router, drain_folder):
    # The primary goes silent before its first token; the drain starts meanwhile: the
    # first-token timeout still falls back to the backup.
    primary, backup = FakeBackend("primary", die_after=0), FakeBackend("backup")
    model = router(backends=[primary, backup], first_token_timeout_s=0.3)
    request = ClientRequest()

    async def drain_meanwhile():
        await asyncio.sleep(0.05)
        enter(model, drain_folder)

    run(model, request, during=drain_meanwhile)
    assert request.served_by() == {"backup"} and not request.errors()


def test_a_shutdown_refusal_reaches_the_client_unchanged_without_fallback(router):
    primary = FakeBackend(
        "primary", first_error=STOPPING, first_error_code=pb.TritonError.UNAVAILABLE
    )
    backup = FakeBackend("backup")
    model = router(backends=[primary, backup])
    for _ in range(3):  # the breaker would open after 2 failures
        request = ClientRequest()
        run(model, request)
        assert request.errors() == [STOPPING] and request.sender.final_flags() == 1
    assert backup.calls == 0 and gauge(model, "primary") == 0


def test_a_shutdown_mid_stream_reaches_the_client_unchanged(router):
    primary = FakeBackend("primary", fail_after=1, fail_message=STOPPING)
    model = router(backends=[primary, FakeBackend("backup")])
    for _ in range(3):
        request = ClientRequest()
        run(model, request)
        assert request.errors() == [STOPPING] and request.sender.final_flags() == 1
    assert gauge(model, "primary") == 0


def test_while_the_server_serves_nothing_is_refused_or_written(router, drain_folder):
    model = router(backends=[FakeBackend("primary")])
    model.drain.check()
    request = ClientRequest()
    run(model, request)
    assert request.texts() == ["a", "b", "c"] and not request.errors()
    assert busy(drain_folder) == []
