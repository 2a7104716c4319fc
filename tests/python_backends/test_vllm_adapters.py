"""The vLLM model loads an adapter with add_lora before a request uses it (python_backends/
vllm/model.py), without vLLM: a fake engine whose add_lora fails as vLLM's utility call
does. The real case (a corrupted adapter file, real vLLM) is tests/server/test_lora.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tests.python_backends.test_vllm_health import module  # noqa: F401  (the fixture)

VLLM_FAILURE = "Call to add_lora method failed: Error while deserializing header"


class Engine:
    def __init__(self, fail=False, errored=False):
        self.calls, self.fail, self.errored = [], fail, errored

    async def add_lora(self, lora):
        self.calls.append(lora.lora_name)
        if self.fail:
            raise Exception(VLLM_FAILURE)  # what vLLM's client raises for a utility call
        return True


def model_with(module, engine, stay=True):  # noqa: F811
    model = module.TritonPythonModel()
    model.engine, model._loras_stay, model._loaded_loras = engine, stay, set()
    return model


LORA = SimpleNamespace(lora_name="support", lora_int_id=1)


def test_a_failed_load_is_the_requests_error_and_is_tried_again(module):  # noqa: F811
    model = model_with(module, Engine(fail=True))
    for _ in range(2):
        with pytest.raises(
            module.BadRequest, match=f"adapter 'support' cannot be loaded: {VLLM_FAILURE}"
        ):
            asyncio.run(model._load_adapter(LORA))
    assert model.engine.calls == ["support", "support"]  # not remembered as loaded


def test_a_loaded_adapter_is_not_loaded_again_while_all_fit(module):  # noqa: F811
    model = model_with(module, Engine())
    for _ in range(3):
        asyncio.run(model._load_adapter(LORA))
    assert model.engine.calls == ["support"]
    evicting = model_with(module, Engine(), stay=False)  # more adapters than the cache
    for _ in range(2):
        asyncio.run(evicting._load_adapter(LORA))
    assert evicting.engine.calls == ["support", "support"]


def test_a_dead_engine_is_not_the_clients_fault(module):  # noqa: F811
    model = model_with(module, Engine(fail=True, errored=True))
    with pytest.raises(Exception, match="Call to add_lora") as e:
        asyncio.run(model._load_adapter(LORA))
    assert not isinstance(e.value, module.BadRequest)
