"""The vLLM model's structured-outputs default (python_backends/vllm/model.py): compact JSON
with xgrammar where the spec's engine arguments set nothing, the spec's own
`structured_outputs_config` kept where they do. Driven through the model's start_engine
with the AsyncLLM double (support/engine_doubles/vllm) in place of vLLM."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from support.vllm_double import DOUBLES
from tests.python_backends import test_vllm_health as health

module = health.module  # the fixture: python_backends.vllm.model under the stub's doubles


@pytest.fixture
def double_vllm():
    """`import vllm` gets the double for the test; the modules before it come back after."""

    def ours(name: str) -> bool:
        return name == "vllm" or name.startswith("vllm.")

    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if ours(name)}
    sys.path.insert(0, str(DOUBLES))
    try:
        yield
    finally:
        sys.path.remove(str(DOUBLES))
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


def started(module, monkeypatch, engine_args: dict):
    """The AsyncEngineArgs the model hands AsyncLLM, after start_engine(engine_args)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    handed = []
    make = AsyncLLM.from_engine_args

    def recording(args, **kwargs):
        handed.append(args)
        return make(args, **kwargs)

    monkeypatch.setattr(AsyncLLM, "from_engine_args", recording)
    model = module.TritonPythonModel()
    model._report_stats = False
    asyncio.run(model.start_engine(dict(engine_args, model="m")))
    (args,) = handed
    return args.structured_outputs_config


def test_without_a_setting_structured_outputs_are_compact_json(module, double_vllm, monkeypatch):
    config = started(module, monkeypatch, {})
    assert (config.backend, config.disable_any_whitespace) == ("xgrammar", True)


def test_the_specs_own_setting_survives(module, double_vllm, monkeypatch):
    given = {"backend": "guidance", "disable_any_whitespace": False}
    config = started(module, monkeypatch, {"structured_outputs_config": given})
    assert (config.backend, config.disable_any_whitespace) == ("guidance", False)


def test_the_default_fills_only_what_the_spec_left_unset(module, double_vllm, monkeypatch):
    config = started(
        module, monkeypatch, {"structured_outputs_config": {"disable_any_whitespace": False}}
    )
    assert (config.backend, config.disable_any_whitespace) == ("xgrammar", False)
    # A backend that refuses disable_any_whitespace (vLLM's "auto", outlines) gets none.
    config = started(module, monkeypatch, {"structured_outputs_config": {"backend": "auto"}})
    assert (config.backend, config.disable_any_whitespace) == ("auto", False)


def test_compact_json_only_on_a_backend_that_allows_it(module):
    assert module.structured_outputs_settings({"backend": "guidance"}) == {
        "backend": "guidance",
        "disable_any_whitespace": True,
    }
    assert module.structured_outputs_settings({"backend": "outlines"}) == {"backend": "outlines"}
    with pytest.raises(ValueError, match="structured_outputs_config must be an object"):
        module.structured_outputs_settings('{"backend": "xgrammar"}')


CACHE = "VLLM_XGRAMMAR_CACHE_MB"


def test_the_engines_grammar_cache_is_bounded(module, double_vllm, monkeypatch):
    """vLLM keeps 512 MB of compiled grammars per engine by default (issue 34: heavy
    schemas grew the engines by 3 GB): the model sets the bound before the engine starts,
    where the engine core (a child process) inherits it, unless the operator set one."""
    monkeypatch.delenv(CACHE, raising=False)
    started(module, monkeypatch, {})
    assert os.environ[CACHE] == module.XGRAMMAR_CACHE_MB == "64"
    monkeypatch.setenv(CACHE, "256")
    started(module, monkeypatch, {})
    assert os.environ[CACHE] == "256"


def test_the_grammar_cache_variable_is_this_vllms():
    """The name is vLLM 0.32's (vllm/envs.py), read without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    envs = Path(list(spec.submodule_search_locations)[0]) / "envs.py"
    assert f'"{CACHE}"' in envs.read_text()
