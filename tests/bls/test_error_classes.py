"""The table of runtime error classes (trident_common/error_classes.py) and the router's
use of it: each of its own refusals carries its class's marker, the parameter at fault
and the Triton code, so the frontend and Triton clients classify it without guessing.
The router runs against the stub doubles of tests/bls/test_model.py."""

from __future__ import annotations

import pytest

from tests.bls import test_model
from tests.bls.test_model import ClientRequest, FakeBackend, run, run_with_one_more
from tests.fakes import fake_pb_utils as pb
from trident_common import error_classes as table
from trident_common.faults import CLIENT_FAULT_PREFIX, BadRequest

router = test_model.router  # the fixture: the real router with the stub's doubles


def test_each_class_maps_once_to_openai_and_triton():
    mapping = {c.name: (c.status, c.triton_code) for c in table.CLASSES}
    assert mapping == {
        "client_error": (400, "INVALID_ARG"),
        "forbidden": (403, "INVALID_ARG"),
        "rate_limit": (429, "UNAVAILABLE"),
        "overloaded": (503, "UNAVAILABLE"),
        "unavailable": (503, "UNAVAILABLE"),
        "draining": (503, "UNAVAILABLE"),
        "shutdown": (503, "UNAVAILABLE"),
        "internal": (500, "INTERNAL"),
    }
    # Every code names one python_backend r24.10 carries (it has no RESOURCE_EXHAUSTED).
    assert all(hasattr(pb.TritonError, c.triton_code) for c in table.CLASSES)
    assert len({c.marker for c in table.MARKED}) == len(table.MARKED)
    assert CLIENT_FAULT_PREFIX == table.CLIENT.marker


@pytest.mark.parametrize("error_class", table.CLASSES, ids=lambda c: c.name)
def test_a_marked_message_parses_back_to_its_class_and_param(error_class):
    param = "messages[0].content" if error_class is table.CLIENT else None
    parsed = table.parse(error_class.mark("the words", param))
    assert (parsed.error_class, parsed.param, parsed.reason) == (error_class, param, "the words")
    once = error_class.mark("x", param)
    assert error_class.mark(once, param) == once  # marking twice changes nothing


@pytest.mark.parametrize(
    "message",
    [
        "smollm2 failed mid-stream: invalid request: x",
        "every backend failed before its first token: a: overloaded: b",
        "Stub process 'smollm2_0_0' is not healthy.",
        "",
    ],
)
def test_only_a_messages_start_names_its_class(message):
    assert table.classify(message) is table.INTERNAL


def test_bad_request_carries_its_parameter():
    error = BadRequest("must be positive", "max_tokens")
    assert str(error) == "must be positive"
    assert error.marked() == "invalid request: [max_tokens] must be positive"


def test_triton_error_sets_the_code_of_the_marked_class():
    error = table.triton_error(pb, "rate limit: tenant 'a' is over 3 requests per minute")
    assert error.code() == pb.TritonError.UNAVAILABLE
    error = table.triton_error(pb, "boom", table.CLIENT, "route")
    assert (error.message(), error.code()) == (
        "invalid request: [route] boom",
        pb.TritonError.INVALID_ARG,
    )
    assert table.triton_error(pb, "boom").code() == pb.TritonError.INTERNAL


def only_error(request):
    (response,) = [r for r in request.sender.responses() if r.has_error()]
    assert request.sender.final_flags() == 1
    return response.error()


def test_an_unknown_route_is_a_client_error_naming_route(router):
    # Before: an unmarked message with the INTERNAL code (the frontend answered 500).
    model = router(backends=[FakeBackend("primary")])
    request = ClientRequest(hints={"route": "nope"})
    run(model, request)
    error = only_error(request)
    parsed = table.parse(error.message())
    assert (parsed.error_class, parsed.param) == (table.CLIENT, "route")
    assert error.code() == pb.TritonError.INVALID_ARG and "'nope'" in parsed.reason


def test_an_adapter_nobody_holds_is_a_client_error_naming_lora_name(router):
    model = router(backends=[FakeBackend("primary")])
    request = ClientRequest(parameters={"lora_name": "nope"})
    run(model, request)
    error = only_error(request)
    assert table.parse(error.message()).param == "lora_name"
    assert error.code() == pb.TritonError.INVALID_ARG


def test_malformed_messages_are_a_client_error_naming_messages(router):
    # Before: "bad request: messages is not valid JSON", INTERNAL.
    model = router(backends=[FakeBackend("primary")])
    request = ClientRequest(prompt=None, messages="not json")
    run(model, request)
    error = only_error(request)
    assert table.parse(error.message()).param == "messages"
    assert error.code() == pb.TritonError.INVALID_ARG


def test_all_backends_full_is_overloaded_and_unavailable(router):
    backend = FakeBackend("solo", chunks=["x"] * 5, delay_s=0.05)
    model = router(backends=[backend], max_inflight_per_backend=1)
    busy, shed = ClientRequest(hints={"route": "alone"}), ClientRequest(hints={"route": "alone"})
    run_with_one_more(model, busy, shed)
    error = only_error(shed)
    assert table.classify(error.message()) is table.OVERLOADED
    assert error.code() == pb.TritonError.UNAVAILABLE


def test_an_open_breaker_is_unavailable_and_a_failed_engine_internal(router):
    # Before: "no backend available ..." carried no class (the frontend answered 500).
    primary = FakeBackend("primary", first_error="CUDA error")
    model = router(backends=[primary], breaker={"consecutive_failures": 1, "cooldown_s": 600})
    failed, refused = (
        ClientRequest(hints={"route": "primary"}),
        ClientRequest(hints={"route": "primary"}),
    )
    run(model, failed)
    run(model, refused)
    error = only_error(failed)
    assert table.classify(error.message()) is table.INTERNAL
    assert error.code() == pb.TritonError.INTERNAL
    error = only_error(refused)
    assert table.classify(error.message()) is table.UNAVAILABLE
    assert error.code() == pb.TritonError.UNAVAILABLE
