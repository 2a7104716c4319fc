"""The router's side of trust.py (issue 21): it proves every request and abort it sends
an engine model, a client's own "proof" never passes it, tenants need the secret, and a
value no engine could take is the client's error. Against the doubles of test_model."""

from __future__ import annotations

import json
import logging

import pytest

from bls import control
from tests.bls.conftest import TEST_SECRET
from tests.bls.test_model import (
    BlsRequest,
    ClientRequest,
    FakeBackend,
    cancel_after_first_text,  # noqa: F401
    make_router,
    router_modules,
    run,
    string_tensor,
)
from tests.fakes import fake_pb_utils as pb
from trident_common import trust
from trident_common.interface import ERRORS_IN_BAND, ROUTER_PROOF, ROUTER_SECRET_ENV
from trident_common.request import CLIENT_FAULT_PREFIX

KEY = trust.proof_key({ROUTER_SECRET_ENV: TEST_SECRET})
TENANTS = {"limits": {"alice": {"tier": "premium"}, "bob": {"tier": "batch"}}}


@pytest.fixture
def sent(monkeypatch):
    """Every BLS request the router makes, as (model, inputs, parameters): requests,
    aborts and probes alike."""
    calls = []
    for name in ("exec", "async_exec"):
        original = getattr(BlsRequest, name)

        def recording(self, decoupled=False, _original=original):
            calls.append((self.model_name, dict(self.inputs), self.parameters))
            return _original(self, decoupled)

        monkeypatch.setattr(BlsRequest, name, recording)
    return calls


@pytest.fixture
def make(tmp_path, monkeypatch):
    """A router from SPEC with `tenants` and per-backend engine overrides."""
    with router_modules() as module:
        monkeypatch.setattr(module, "FIRST_TOKEN_WATCH_S", 0.005)
        monkeypatch.setattr(module, "STREAM_WATCH_S", 0.005)
        monkeypatch.setattr(module, "SILENCE_PROBE_S", 0.05)
        monkeypatch.setattr(control, "SILENCE_PROBE_S", 0.05)
        models = []

        def build(backends, tenants=None, engines=None):
            return make_router(module, tmp_path, models, backends, tenants=tenants, engines=engines)

        yield build
        for model in models:
            model.finalize()


def test_every_backend_request_carries_the_proof_of_its_tenant_values(make, sent):
    model = make([FakeBackend("primary")], tenants=TENANTS)
    for tenant in ("alice", "bob"):
        run(model, ClientRequest(hints={"tenant": tenant}))
    expected = zip(sent, ("alice", "bob"), (0, 2), strict=True)
    for (_, inputs, parameters), tenant, priority in expected:
        salt = trust.tenant_salt(tenant)
        assert (inputs["priority"], inputs["cache_salt"]) == (priority, salt)
        assert trust.proves_generate(KEY, parameters, inputs["request_id"], priority, salt)
        assert not trust.proves_generate(
            KEY,
            parameters,
            inputs["request_id"],
            0,
            trust.tenant_salt("alice" if priority else "bob"),
        )


def test_a_clients_proof_parameter_never_reaches_a_backend(make, sent, monkeypatch):
    request = ClientRequest(parameters={ROUTER_PROOF: "f" * 64, "temperature": 0})
    run(make([FakeBackend("primary")]), request)
    proof = sent[-1][2][ROUTER_PROOF]
    assert proof != "f" * 64 and trust.proves_generate(
        KEY, sent[-1][2], sent[-1][1]["request_id"], None, None
    )
    monkeypatch.delenv(ROUTER_SECRET_ENV)  # a router with no proof to give drops it too
    run(make([FakeBackend("primary")]), ClientRequest(parameters={ROUTER_PROOF: "f" * 64}))
    assert sent[-1][2] == {ERRORS_IN_BAND: True}  # no proof: the router's own request only


def test_aborts_carry_the_proof_for_the_id_they_abort(make, sent):
    backend = FakeBackend("primary", chunks=["x"] * 200, delay_s=0.01)
    request = ClientRequest()
    run(make([backend]), request, during=cancel_after_first_text(request, backend))
    assert backend.aborted
    aborts = [
        (inputs, parameters) for _, inputs, parameters in sent if "abort_request_id" in inputs
    ]
    assert [inputs["abort_request_id"] for inputs, _ in aborts] == backend.aborted
    inputs, parameters = aborts[0]
    assert trust.proves_abort(KEY, parameters, inputs["abort_request_id"])
    assert not trust.proves_abort(KEY, parameters, backend.request_ids[0] + "x")


def test_tenants_without_a_secret_fail_the_load_in_one_line(make, monkeypatch):
    monkeypatch.delenv(ROUTER_SECRET_ENV)
    with pytest.raises(RuntimeError) as failed:
        make([FakeBackend("primary")], tenants=TENANTS)
    message = str(failed.value)
    assert message.startswith(f"tenants need {ROUTER_SECRET_ENV}") and "\n" not in message


def test_without_tenants_the_router_needs_no_secret_and_says_what_it_costs(
    make, monkeypatch, caplog, sent
):
    monkeypatch.delenv(ROUTER_SECRET_ENV)
    caplog.set_level(logging.WARNING, logger="trident")
    request = ClientRequest()
    run(make([FakeBackend("primary")]), request)
    assert request.errors() == [] and sent[-1][2] == {ERRORS_IN_BAND: True}
    assert any(
        f"no {ROUTER_SECRET_ENV}: the engine models will refuse this router's aborts"
        in record.getMessage()
        for record in caplog.records
    )


class RefusingControls(FakeBackend):
    """An engine model with no secret in common with the router: it refuses every abort
    (and so every health probe) as the client's fault."""

    def _control(self, request_id):
        with self.lock:
            self.controls += 1
        return iter(
            [
                (
                    pb.InferenceResponse(
                        error=pb.TritonError(
                            CLIENT_FAULT_PREFIX + "abort_request_id is the router's own input",
                            pb.TritonError.INVALID_ARG,
                        )
                    ),
                    True,
                )
            ]
        )


def test_a_probe_refused_as_the_clients_fault_means_the_backend_is_alive(make, monkeypatch):
    monkeypatch.delenv(ROUTER_SECRET_ENV)
    backend = RefusingControls("primary", chunks=["a", "b", "c"], delay_s=0.25)
    request = ClientRequest()
    run(make([backend]), request)  # quiet > SILENCE_PROBE_S between chunks
    assert backend.controls >= 1  # it was probed, and answered
    assert request.errors() == [] and request.texts() == ["a", "b", "c"]


@pytest.mark.parametrize(
    "sampling,field",
    [
        ({"max_tokens": 2**32 + 5}, "max_tokens"),
        ({"seed": -1}, "seed"),  # random_seed: UINT64
        ({"top_k": 2**31}, "top_k"),
    ],
)
def test_a_value_the_trtllm_ensemble_cannot_take_is_the_clients_error(make, sampling, field):
    backend = FakeBackend("primary")
    model = make([backend], engines={"primary": "tensorrt_llm"})
    request = ClientRequest()
    request.inputs["sampling_parameters"] = string_tensor(
        "sampling_parameters", json.dumps(sampling)
    )
    run(model, request)
    assert len(request.errors()) == 1 and request.errors()[0].startswith(
        f"{CLIENT_FAULT_PREFIX}sampling_parameters.{field} is out of range"
    )
    assert backend.calls == 0 and model.breakers["primary"].state == "closed"
    assert request.sender.final_flags() == 1


def test_what_no_candidate_can_do_is_the_clients_error_and_trips_no_breaker(make):
    """logprobs to a route whose backends are TRT-LLM ensembles: a 400-class answer naming
    what was asked, however often a client asks; the backends stay closed for others."""
    primary, backup = FakeBackend("primary"), FakeBackend("backup")
    model = make([primary, backup], engines={"primary": "tensorrt_llm", "backup": "tensorrt_llm"})
    for _ in range(3):  # the breaker opens after 2 failures: a misfit is none
        request = ClientRequest()
        request.inputs["sampling_parameters"] = string_tensor(
            "sampling_parameters", json.dumps({"logprobs": 2})
        )
        run(model, request)
        (error,) = request.errors()
        assert error.startswith(CLIENT_FAULT_PREFIX) and "'logprobs'" in error
        assert request.sender.responses()[0].error().code() == pb.TritonError.INVALID_ARG
    assert primary.calls == backup.calls == 0
    assert model.breakers["primary"].state == model.breakers["backup"].state == "closed"


def test_a_request_one_engine_cannot_take_falls_back_to_one_that_can(make):
    primary, backup = FakeBackend("primary"), FakeBackend("backup", chunks=["ok"])
    model = make([primary, backup], engines={"primary": "tensorrt_llm"})
    request = ClientRequest()
    request.inputs["sampling_parameters"] = string_tensor(
        "sampling_parameters", json.dumps({"logprobs": 2})
    )
    run(model, request)
    assert request.errors() == [] and request.served_by() == {"backup"}
    assert primary.calls == 0 and model.breakers["primary"].state == "closed"
