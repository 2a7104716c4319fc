"""The TRT-LLM pre-processing model with LoRA adapters, as `trident repo` renders it.

The rendered model.py runs against tests/fakes/fake_pb_utils.py (Triton's stub module),
with the tiny-llama tokenizer and two random adapters converted at render time; Triton
drives it through initialize / execute. TRT-LLM itself cannot run here: what the engine
does with the tensors is the GPU check's business (docs/lora.md).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging

import numpy as np
import pytest
from google.protobuf import json_format

from builder.engines import assets
from builder.engines.lora import convert_adapter
from builder.render.validate import parse_config
from support.lora import write_adapter
from tests.fakes import fake_pb_utils as pb
from tests.render.test_trtllm import model, render
from trident_common import error_classes


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trt-lora")
    tokenizer = str(assets.ensure("tiny-llama"))
    adapters = {
        name: str(write_adapter(tmp / name, seed=seed, rank=8))
        for name, seed in (("support", 1), ("legal", 2))
    }
    m = model(
        build={"dtype": "fp16"},
        engine_args={},
        adapters=adapters,
        lora={"max_lora_rank": 8},
        checkpoint={"hf_model": tokenizer, "family": "llama"},
    )
    render([m], tmp)
    return tmp


@contextlib.contextmanager
def loaded(repo, config_changes=None):
    """The rendered preprocessing model, initialized as Triton would."""
    folder = repo / "repo" / "llama_preprocessing"
    config = json.loads(
        json_format.MessageToJson(
            parse_config(folder / "config.pbtxt"), preserving_proto_field_name=True
        )
    )
    config.update(config_changes or {})
    # The rendered model.py imports this module (tests/render/test_trtllm.py checks the
    # rendered copy is the source's).
    module = importlib.import_module("python_backends.tensorrt_llm.preprocessing.model")
    instance = module.TritonPythonModel()
    instance.initialize(
        {"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1"}
    )
    yield instance


class Request(pb.InferenceRequest):
    """With Triton's request parameters (the fake has none)."""

    def __init__(self, inputs, parameters=None):
        super().__init__(inputs)
        self._parameters = json.dumps(parameters or {})

    def parameters(self):
        return self._parameters


def request(lora_name=None, parameters=None, sampling=None):
    inputs = {
        "QUERY": pb.Tensor("QUERY", np.array([[b"hello there"]], dtype=object)),
        "REQUEST_OUTPUT_LEN": pb.Tensor("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32)),
    }
    if lora_name is not None:
        inputs["LORA_NAME"] = pb.Tensor("LORA_NAME", np.array([[lora_name.encode()]], dtype=object))
    if sampling is not None:
        inputs["SAMPLING_PARAMETERS"] = pb.Tensor(
            "SAMPLING_PARAMETERS", np.array([[json.dumps(sampling).encode()]], dtype=object)
        )
    return Request(inputs, parameters)


def outputs(response) -> dict:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


def test_base_requests_carry_no_lora_tensors(repo):
    with loaded(repo) as m:
        out = outputs(m.execute([request()])[0])
    assert "INPUT_ID" in out and not any(name.startswith("LORA_") for name in out)


def test_an_adapter_sends_its_task_and_weights_once(repo):
    weights, config = convert_adapter(repo / "support", "fp16")
    with loaded(repo) as m:
        first, same_batch = (outputs(r) for r in m.execute([request("support")] * 2))
        later = outputs(m.execute([request("support")])[0])
        other = outputs(m.execute([request("legal")])[0])
    for out in (first, same_batch):  # the whole first batch carries the weights
        assert out["LORA_TASK_ID"].tolist() == [[2]] and out["LORA_TASK_ID"].dtype == np.uint64
        np.testing.assert_array_equal(out["LORA_WEIGHTS"], weights)
        np.testing.assert_array_equal(out["LORA_CONFIG"], config)
        assert out["LORA_WEIGHTS"].dtype == np.float16 and out["LORA_CONFIG"].shape[-1] == 3
    assert set(later) >= {"LORA_TASK_ID"} and "LORA_WEIGHTS" not in later  # cached now
    assert later["LORA_TASK_ID"].tolist() == [[2]]
    assert other["LORA_TASK_ID"].tolist() == [[1]] and "LORA_WEIGHTS" in other


def test_send_always_for_several_engine_instances(repo):
    parameters = parse_config(repo / "repo/llama_preprocessing/config.pbtxt").parameters
    changed = {k: {"string_value": v.string_value} for k, v in parameters.items()}
    changed["lora_send_weights"] = {"string_value": "always"}
    with loaded(repo, {"parameters": changed}) as m:
        for _ in range(2):
            assert "LORA_WEIGHTS" in outputs(m.execute([request("legal")])[0])


@pytest.mark.parametrize(
    "how", [{"parameters": {"lora_name": "legal"}}, {"sampling": {"lora_name": "legal"}}]
)
def test_sampling_parameters_or_a_request_parameter_name_an_adapter_too(repo, how):
    with loaded(repo) as m:
        out = outputs(m.execute([request(**how)])[0])
    assert out["LORA_TASK_ID"].tolist() == [[1]]


def test_other_sampling_parameters_are_refused_not_ignored(repo):
    with loaded(repo) as m:
        response = m.execute([request(sampling={"lora_name": "legal", "top_k": 3})])[0]
    assert response.error().message() == (
        "sampling_parameters of the TRT-LLM ensemble carry "
        "only lora_name; send top_k as the ensemble's own "
        "inputs"
    )


def test_an_unknown_adapter_fails_alone_as_a_client_error_on_lora_name(repo, caplog):
    """The client learns its adapter is unknown, not which ones the server holds: those
    are in the server's log, written at load."""
    with caplog.at_level(logging.INFO, logger="trident.llama_preprocessing"):
        with loaded(repo) as m:
            bad, good = m.execute([request("nope"), request("legal")])
    assert bad.has_error() and bad.error().message() == (
        "invalid request: [lora_name] unknown adapter 'nope': model llama has no adapter "
        "of that name"
    )
    found = error_classes.parse(bad.error().message())
    assert (found.error_class, found.param) == (error_classes.CLIENT, "lora_name")
    assert bad.error().code() == pb.TritonError.INVALID_ARG
    assert "legal" not in bad.error().message()
    assert "model llama has adapters: legal, support" in caplog.text
    assert outputs(good)["LORA_TASK_ID"].tolist() == [[1]]


def test_an_adapter_named_to_a_model_without_any_is_a_client_error_on_lora_name(repo):
    parameters = parse_config(repo / "repo/llama_preprocessing/config.pbtxt").parameters
    kept = {
        k: {"string_value": v.string_value}
        for k, v in parameters.items()
        if k not in ("lora_adapters", "lora_send_weights")
    }
    with loaded(repo, {"parameters": kept}) as m:
        bad, base = m.execute([request("legal"), request()])
    assert bad.error().message() == (
        "invalid request: [lora_name] unknown adapter 'legal': the model has no adapters"
    )
    assert bad.error().code() == pb.TritonError.INVALID_ARG
    assert "LORA_TASK_ID" not in outputs(base)


def test_other_refusals_keep_their_unmarked_message_and_internal_code(repo):
    with loaded(repo) as m:
        response = m.execute([request(sampling={"top_k": 3})])[0]
    assert error_classes.classify(response.error().message()) is error_classes.INTERNAL
    assert response.error().code() == pb.TritonError.INTERNAL
