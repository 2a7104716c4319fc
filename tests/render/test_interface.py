"""trident_common/interface.py is the one definition of the tensor interface: the rendered
configs list exactly its tensors, and a hint added there reaches the router's config."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from builder.engines.jobs import ServedEngine
from builder.plan.planner import plan_for_spec
from builder.render import context as render_context
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.spec import parse_spec
from trident_common import interface

SPEC = {
    "models": [
        {"name": "chat", "engine": "vllm", "model": "/m/chat"},
        {"name": "sg", "engine": "sglang", "model": "/m/sg"},
        {
            "name": "llama",
            "engine": "tensorrt_llm",
            "family": "llama",
            "checkpoint": {"hf_model": "/m/llama", "family": "llama"},
            "build": {"dtype": "bf16"},
            "profiles": {
                "p": {
                    "max_batch_size": 8,
                    "max_input_len": 512,
                    "max_seq_len": 1024,
                    "max_num_tokens": 2048,
                }
            },
        },
    ],
    "router": {"default": ["chat"]},
}


def configs() -> dict[str, model_config_pb2.ModelConfig]:
    spec = parse_spec(SPEC, "/deploy/t.yaml")
    engines = {"llama": ServedEngine("/engines/llama", "ab" * 32)}
    files = render_files(RenderContext(spec, {}, engines, plan_for_spec(spec)))
    return {
        path.split("/")[0]: text_format.Parse(data.decode(), model_config_pb2.ModelConfig())
        for path, data in files.items()
        if path.endswith("/config.pbtxt")
    }


def as_tensors(entries, with_optional=True) -> list[tuple]:
    dtype = model_config_pb2.DataType.Name
    return [
        (t.name, dtype(t.data_type), tuple(t.dims)) + ((t.optional,) if with_optional else ())
        for t in entries
    ]


def declared(tensors, with_optional=True) -> list[tuple]:
    return [
        (t.name, t.dtype, tuple(t.dims)) + ((t.optional,) if with_optional else ()) for t in tensors
    ]


def test_rendered_configs_list_exactly_the_interface():
    rendered = configs()
    assert as_tensors(rendered["router"].input) == declared(interface.ROUTER_INPUTS)
    for engine_model in ("chat", "sg"):
        assert as_tensors(rendered[engine_model].input) == declared(interface.ENGINE_INPUTS)
    for name in ("router", "chat", "sg"):
        assert as_tensors(rendered[name].output, False) == declared(interface.LLM_OUTPUTS, False)
    ensemble = rendered["llama"]
    assert as_tensors(ensemble.input) == declared(interface.TRTLLM_ENSEMBLE_INPUTS)
    assert as_tensors(ensemble.output, False) == declared(interface.TRTLLM_ENSEMBLE_OUTPUTS, False)


def test_the_ensemble_maps_each_sampling_input_to_the_engine_input_the_interface_names():
    rendered = configs()
    engine_step = rendered["llama"].ensemble_scheduling.step[1]
    for t in interface.TRTLLM_INPUTS:
        assert engine_step.input_map[t.engine] == t.ensemble
    engine_inputs = {
        i.name: model_config_pb2.DataType.Name(i.data_type)
        for i in rendered["llama_tensorrt_llm"].input
    }
    assert {t.engine: engine_inputs[t.engine] for t in interface.TRTLLM_INPUTS} == {
        t.engine: t.dtype for t in interface.TRTLLM_INPUTS
    }


def test_a_hint_added_to_the_interface_reaches_the_router_config(tmp_path, monkeypatch):
    source = Path(interface.__file__).read_text()
    old = 'HINT_NAMES = ("route",'
    assert source.count(old) == 1
    # The interface as it would be with one more hint: the edited source run as a module
    # of its own (dataclasses look their module up while they are made).
    edited = types.ModuleType("trident_interface_with_region")
    monkeypatch.setitem(sys.modules, edited.__name__, edited)
    exec(
        compile(source.replace(old, 'HINT_NAMES = ("region", "route",'), "<edited>", "exec"),
        edited.__dict__,
    )
    monkeypatch.setattr(render_context, "interface", edited)
    rendered = configs()
    router_inputs = {t.name: t for t in rendered["router"].input}
    assert "region" in router_inputs and router_inputs["region"].optional
    assert "region" not in {t.name for t in rendered["chat"].input}  # hints stay in router
