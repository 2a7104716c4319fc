"""vllm_backend's ENABLE_VLLM_HEALTH_CHECK on trident's vLLM model (python_backends/vllm/
model.py), without vLLM: an instance whose engine has died, against the stub's pb_utils
double. The real server case (an EngineCore killed) is tests/server/test_vllm_metrics.py."""

from __future__ import annotations

import importlib
import json
import threading
from types import SimpleNamespace

import pytest

from tests.fakes import fake_pb_utils as pb
from tests.python_backends.test_sglang_model import ROOT, fake_stub_modules, make_request
from trident_common.error_classes import UNAVAILABLE, classify
from trident_common.interface import ERRORS_IN_BAND

MODEL_PY = ROOT / "python_backends" / "vllm" / "model.py"


@pytest.fixture
def module():
    """python_backends.vllm.model, under the stub's doubles."""
    with fake_stub_modules():
        yield importlib.import_module("python_backends.vllm.model")


class Unloads:
    def __init__(self, fail=False):
        self.names, self.fail, self.done = [], fail, threading.Event()

    def __call__(self, name):
        self.names.append(name)
        self.done.set()
        if self.fail:
            raise pb.TritonModelException("explicit model load / unload is not allowed")


def dead_model(module, monkeypatch, unloads, health_check=True):
    monkeypatch.setattr(pb, "unload_model", unloads, raising=False)
    model = module.TritonPythonModel()
    model.model_name, model._health_check = "chat", health_check
    model._unloading = threading.Lock()
    model.engine = SimpleNamespace(errored=True, dead_error=RuntimeError("core gone"))
    model.errors = []
    model.log = SimpleNamespace(error=model.errors.append)
    counted = model.counted = []
    model.metrics = SimpleNamespace(errors="errors")
    model.responses = module.ResponseFactory("chat")
    model._count = lambda active, outcome: counted.append(outcome)
    return model


def test_a_dead_engine_refuses_in_vllm_backends_words_and_unloads_once(module, monkeypatch):
    unloads = Unloads()
    model = dead_model(module, monkeypatch, unloads)
    requests = [make_request(text_input="hi"), make_request(text_input="ho")]
    model.execute(requests)
    model.execute([make_request(text_input="again")])
    for request in requests:
        (response,) = request.sender.responses()
        assert response.error().message() == module.UNHEALTHY
        assert response.error().code() == pb.TritonError.UNAVAILABLE
        assert request.sender.final_flags() == 1
    assert unloads.done.wait(5) and unloads.names == ["chat"]
    assert model.counted == ["errors"] * 3
    assert any("will be unloaded" in line for line in model.errors)


def test_the_router_gets_the_refusal_in_band_marked_unavailable(module, monkeypatch):
    # The router asks for errors in band (interface.ERRORS_IN_BAND): python_backend loses
    # an error response to a BLS call. The marker keeps the class: the router falls back.
    model = dead_model(module, monkeypatch, Unloads())
    request = make_request(text_input="hi")
    request.parameters = lambda: json.dumps({ERRORS_IN_BAND: True})
    model.execute([request])
    ((response, flags),) = request.sender.sent
    assert not response.has_error() and flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert classify(response.value("error")) is UNAVAILABLE
    assert module.UNHEALTHY in response.value("error")


def test_a_model_that_cannot_unload_says_so_and_keeps_refusing(module, monkeypatch):
    unloads = Unloads(fail=True)
    model = dead_model(module, monkeypatch, unloads)
    model.execute([make_request(text_input="hi")])
    assert unloads.done.wait(5)
    for _ in range(50):
        if any("stays loaded" in line for line in model.errors):
            break
        threading.Event().wait(0.02)
    assert any("stays loaded" in line for line in model.errors), model.errors
    request = make_request(text_input="hi")
    model.execute([request])
    assert request.sender.responses()[0].error().message() == module.UNHEALTHY


def test_without_the_parameter_a_dead_engine_is_not_unloaded(module, monkeypatch):
    unloads = Unloads()
    model = dead_model(module, monkeypatch, unloads, health_check=False)
    assert model.engine_dead() == "core gone"
    assert not unloads.done.wait(0.2)


def test_model_parameters_and_their_defaults(module):
    config = {"parameters": {"ENABLE_VLLM_HEALTH_CHECK": {"string_value": "true"}}}
    assert module.model_parameters({"model_config": json.dumps(config)}) == {
        "ENABLE_VLLM_HEALTH_CHECK": "true"
    }
    assert module.model_parameters({}) == {}
