"""The rendered TRT-LLM models: parameters, devices, orchestrator mode, errors, the tensor
contract with the router's TrtllmAdapter, and the tokenizer models in a real Triton."""

import contextlib
import copy
import json

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from builder.engines.jobs import ServedEngine
from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext, RenderError
from builder.render.repository import render_files
from builder.render.validate import parse_config, validate_repository
from builder.render.write import write_repository
from builder.spec import parse_spec
from tests.fakes import fake_pb_utils as pb

# A path that does not spell the key: the key must come from the cache lookup.
ENGINE = ServedEngine("/cache/engines/llama-short-context", "ab" * 32)
MODEL = {
    "name": "llama",
    "engine": "tensorrt_llm",
    "family": "llama",
    "checkpoint": {"hf_model": "/m/llama", "family": "llama"},
    "build": {"dtype": "bf16", "tp_size": 2},
    "profiles": {
        "short-context": {
            "max_batch_size": 32,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_num_tokens": 4096,
            "plugins": {"paged_context_fmha": True},
        }
    },
    "engine_args": {
        "kv_cache_free_gpu_mem_fraction": 0.85,
        "enable_kv_cache_reuse": True,
        "batch_scheduler_policy": "max_utilization",
        "max_batch_size": 16,
    },
}


def render(models, tmp_path=None, engines=None, hardware=None):
    spec = parse_spec(
        {
            "name": "t",
            "hardware": hardware or {"gpu": "cpu"},
            "models": models,
            "router": {"default": [models[0]["name"]]},
        },
        "/deploy/t.yaml",
    )
    files = render_files(
        RenderContext(spec, {}, engines or {m["name"]: ENGINE for m in models}, plan_for_spec(spec))
    )
    if tmp_path is not None:
        write_repository(files, tmp_path / "repo", validate_repository)
    return files


def config_of(files, name) -> model_config_pb2.ModelConfig:
    from google.protobuf import text_format

    return text_format.Parse(files[f"{name}/config.pbtxt"].decode(), model_config_pb2.ModelConfig())


def params(config) -> dict:
    return {k: v.string_value for k, v in config.parameters.items()}


def model(**changes):
    data = copy.deepcopy(MODEL)
    data.update(changes)
    return data


def test_four_models_render_and_validate(tmp_path):
    files = render([model()], tmp_path)
    assert validate_repository(tmp_path / "repo") == []
    names = {path.split("/")[0] for path in files}
    assert {
        "llama",
        "llama_preprocessing",
        "llama_tensorrt_llm",
        "llama_postprocessing",
        "router",
    } == names
    for name in names:
        assert parse_config(tmp_path / "repo" / name / "config.pbtxt").name == name
    assert "llama_preprocessing/1/python_backends/tensorrt_llm/common/tokenizing.py" in files
    assert "llama_postprocessing/1/python_backends/tensorrt_llm/common/tokenizing.py" in files
    # lora_adapters.py marks its refusals through the runtime error table
    assert "llama_preprocessing/1/trident_common/error_classes.py" in files


def test_engine_model_parameters():
    config = config_of(render([model()]), "llama_tensorrt_llm")
    assert config.backend == "tensorrtllm" and config.max_batch_size == 16
    assert config.model_transaction_policy.decoupled
    p = params(config)
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["gpt_model_path"] == ENGINE.path
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.85"
    assert p["enable_kv_cache_reuse"] == "true"
    assert p["batch_scheduler_policy"] == "max_utilization"
    assert p["exclude_input_in_output"] == "true" and p["max_beam_width"] == "1"
    assert "max_batch_size" not in p  # a config field, not a param
    assert p["executor_worker_path"].endswith("trtllmExecutorWorker")  # TP2 → orchestrator


def test_engine_config_names_the_served_profile_and_cache_key():
    files = render([model()])
    text = files["llama_tensorrt_llm/config.pbtxt"].decode()
    assert f"short-context (cache key {ENGINE.key})" in text
    assert files["llama_tensorrt_llm/1/engine.txt"].decode().strip().endswith(ENGINE.path)


def test_single_gpu_single_model_uses_leader_mode_and_defaults():
    m = model(build={"dtype": "fp16"}, engine_args={})
    p = params(config_of(render([m]), "llama_tensorrt_llm"))
    assert "executor_worker_path" not in p and "gpu_device_ids" not in p
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert p["enable_kv_cache_reuse"] == "false"
    assert config_of(render([m]), "llama").max_batch_size == 32  # the profile's


H100X8 = {"gpu": "H100-80GB", "count": 8}


def test_gpu_device_ids_per_instance_from_placement():
    m = model(instances=2, placement={"devices": [4, 5, 6, 7]})
    config = config_of(render([m], hardware=H100X8), "llama_tensorrt_llm")
    assert params(config)["gpu_device_ids"] == "4,5;6,7"
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_mig_placement_is_refused():
    with pytest.raises(RenderError, match="placement.mig: the tensorrtllm backend"):
        render([model(placement={"mig": "3g.40gb"})])


def test_two_trtllm_models_use_orchestrator_mode():
    files = render(
        [
            model(build={"dtype": "fp16"}, engine_args={}),
            model(name="other", build={"dtype": "fp16"}, engine_args={}),
        ]
    )
    for name in ("llama_tensorrt_llm", "other_tensorrt_llm"):
        assert "executor_worker_path" in params(config_of(files, name))
    assert b"TRTLLM_ORCHESTRATOR=1" in files["llama_tensorrt_llm/config.pbtxt"]


def test_medusa_profile_sets_decoding_mode_and_draft_model_is_refused():
    profile = dict(
        MODEL["profiles"]["short-context"],
        speculative={"mode": "medusa", "max_draft_len": 4, "heads_model": "/h", "num_heads": 4},
    )
    p = params(config_of(render([model(profiles={"medusa": profile})]), "llama_tensorrt_llm"))
    assert p["decoding_mode"] == "medusa"
    profile["speculative"] = {"mode": "draft-model", "max_draft_len": 4, "draft_model": "x"}
    with pytest.raises(RenderError, match="draft-model speculative decoding"):
        render([model(profiles={"draft": profile})])


def test_missing_engine_is_a_render_error():
    with pytest.raises(RenderError, match="model llama: no engine directory"):
        render([model()], engines={"none": ENGINE})


def test_tokenizer_paths_are_relative_to_the_spec():
    m = model(checkpoint={"path": "ckpt"}, tokenizer={"path": "tok"}, build={})
    files = render([m])
    assert params(config_of(files, "llama_preprocessing"))["tokenizer_dir"] == "/deploy/tok"
    p = params(config_of(files, "llama_postprocessing"))
    assert p["tokenizer_dir"] == "/deploy/tok" and p["skip_special_tokens"] == "true"


# ---------------------------------------------------------------------------------------
# LoRA adapters (docs/lora.md): ensemble lora_name → pre-processing → the engine's inputs


def lora_model(tmp_path, **changes):
    from support.lora import write_adapter

    adapters = {
        name: str(write_adapter(tmp_path / name, seed=seed, rank=8))
        for name, seed in (("support", 1), ("legal", 2))
    }
    return model(
        build={"dtype": "fp16", "tp_size": 2},
        adapters=adapters,
        lora={"max_lora_rank": 8},
        **changes,
    )


def test_lora_wiring_renders_and_validates(tmp_path):
    from builder.engines.lora import convert_adapter

    files = render([lora_model(tmp_path)], tmp_path)
    assert validate_repository(tmp_path / "repo") == []
    ensemble = config_of(files, "llama")
    lora_input = next(t for t in ensemble.input if t.name == "lora_name")
    assert (
        lora_input.optional
        and model_config_pb2.DataType.Name(lora_input.data_type) == "TYPE_STRING"
    )
    pre, engine = ensemble.ensemble_scheduling.step[0], ensemble.ensemble_scheduling.step[1]
    assert pre.input_map["LORA_NAME"] == "lora_name"
    assert {k: engine.input_map[k] for k in ("lora_task_id", "lora_weights", "lora_config")} == {
        k: pre.output_map[v]
        for k, v in (
            ("lora_task_id", "LORA_TASK_ID"),
            ("lora_weights", "LORA_WEIGHTS"),
            ("lora_config", "LORA_CONFIG"),
        )
    }
    engine_config = config_of(files, "llama_tensorrt_llm")
    inputs = {t.name: t for t in engine_config.input}
    assert model_config_pb2.DataType.Name(inputs["lora_weights"].data_type) == "TYPE_FP16"
    assert all(inputs[n].optional for n in ("lora_task_id", "lora_weights", "lora_config"))
    assert list(inputs["lora_config"].dims) == [-1, 3]
    p = params(engine_config)
    assert p["lora_cache_max_adapter_size"] == "8" == p["lora_cache_optimal_adapter_size"]
    assert float(p["lora_cache_gpu_memory_fraction"]) == 0.05
    assert int(p["lora_cache_host_memory_bytes"]) >= 1 << 30
    pre_config = config_of(files, "llama_preprocessing")
    pp = params(pre_config)
    assert json.loads(pp["lora_adapters"]) == {"legal": 1, "support": 2}
    assert (pp["lora_send_weights"], pp["model_name"]) == ("first_use", "llama")
    assert {t.name for t in pre_config.output} >= {"LORA_TASK_ID", "LORA_WEIGHTS", "LORA_CONFIG"}
    weights, config = convert_adapter(tmp_path / "legal", "fp16")
    stored = np.load(tmp_path / "repo/llama_preprocessing/1/lora/legal/model.lora_weights.npy")
    np.testing.assert_array_equal(stored, weights)
    assert "llama_preprocessing/1/python_backends/tensorrt_llm/common/lora_adapters.py" in files


def test_several_engine_instances_send_weights_always(tmp_path):
    files = render([lora_model(tmp_path, instances=2)])
    assert params(config_of(files, "llama_preprocessing"))["lora_send_weights"] == "always"


def test_without_adapters_nothing_of_lora_is_rendered():
    files = render([model()])
    for name in ("llama", "llama_tensorrt_llm", "llama_preprocessing"):
        assert "lora" not in files[f"{name}/config.pbtxt"].decode().lower(), name
    assert not any("/lora/" in path for path in files)


# ---------------------------------------------------------------------------------------
# The contract with bls/adapters.py TrtllmAdapter

_NP_TYPES = {
    np.dtype(np.float32): "TYPE_FP32",
    np.dtype(np.int32): "TYPE_INT32",
    np.dtype(np.uint64): "TYPE_UINT64",
    np.dtype(bool): "TYPE_BOOL",
    np.dtype(object): "TYPE_STRING",
}


@contextlib.contextmanager
def adapters_module():
    from bls import adapters

    yield adapters


def test_ensemble_accepts_every_tensor_the_router_sends():
    ensemble = config_of(render([model()]), "llama")
    declared = {t.name: t for t in ensemble.input}
    sampling = {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 4,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "seed": 7,
        "min_tokens": 2,
    }
    request = [
        pb.Tensor("text_input", np.array([b"hi"], dtype=object)),
        pb.Tensor("stream", np.array([True])),
        pb.Tensor("exclude_input_in_output", np.array([True])),
        pb.Tensor("max_tokens", np.array([8], dtype=np.int32)),
        pb.Tensor("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=object)),
    ]
    with adapters_module() as adapters:
        sent = adapters.TrtllmAdapter("llama").inputs(request, "r1")
        assert adapters.TrtllmAdapter("llama").outputs == [t.name for t in ensemble.output]
    assert len(sent) == 3 + 1 + len(sampling)
    for tensor in sent:
        spec = declared[tensor.name()]
        value = tensor.as_numpy()
        assert value.shape == (1, 1) and list(spec.dims) == [1]  # batch dim + [1]
        assert model_config_pb2.DataType.Name(spec.data_type) == _NP_TYPES[value.dtype], (
            tensor.name()
        )
    required = {t.name for t in ensemble.input if not t.optional}
    assert required <= {t.name() for t in sent}


@pytest.mark.parametrize("named_in", ["sampling_parameters", "request parameter"])
def test_router_sends_the_adapter_as_the_ensembles_lora_name(tmp_path, named_in):
    ensemble = config_of(render([lora_model(tmp_path)], tmp_path), "llama")
    declared = {t.name: t for t in ensemble.input}
    sampling = {"temperature": 0.5}
    if named_in == "sampling_parameters":
        sampling["lora_name"] = "support"
    request = [
        pb.Tensor("text_input", np.array([b"hi"], dtype=object)),
        pb.Tensor("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=object)),
    ]
    with adapters_module() as adapters:
        # The router passes the adapter it routed by (features.adapter) either way.
        sent = adapters.TrtllmAdapter("llama").inputs(request, "r1", "support")
    lora = next(t for t in sent if t.name() == "lora_name")
    assert lora.as_numpy().shape == (1, 1) and lora.as_numpy()[0, 0] == b"support"
    assert model_config_pb2.DataType.Name(declared["lora_name"].data_type) == "TYPE_STRING"
    assert {t.name() for t in sent} <= set(declared)
