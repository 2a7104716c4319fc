"""The OpenAI frontend's Triton side without a server: which models it lists, and the
tensors a request becomes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.protocol import parse_chat, parse_completion
from builder.serve.openai.tensors import ModelInfo, build_inputs, read_response

LLM_INPUTS = [
    "text_input",
    "messages",
    "stream",
    "sampling_parameters",
    "max_tokens",
    "exclude_input_in_output",
    "request_id",
    "abort_request_id",
]
ROUTER_INPUTS = LLM_INPUTS + [
    "route",
    "task",
    "family",
    "tenant",
    "tier",
    "conversation_id",
    "shared_prefix",
]
TYPES = {"stream": "TYPE_BOOL", "exclude_input_in_output": "TYPE_BOOL", "max_tokens": "TYPE_INT32"}


def config(name, inputs, outputs=("text_output", "finish_reason"), batch=0, types=TYPES):
    return {
        "name": name,
        "max_batch_size": batch,
        "input": [{"name": i, "data_type": types.get(i, "TYPE_STRING")} for i in inputs],
        "output": [{"name": o, "data_type": "TYPE_STRING"} for o in outputs],
    }


def tensors(inputs) -> dict:
    out = {}
    for tensor in inputs:
        proto = tensor._get_tensor()
        contents = tensor._get_content()
        out[proto.name] = (proto.datatype, list(proto.shape), contents)
    return out


def text_of(inputs, name) -> str:
    """The one string of a BYTES input (its raw contents are length-prefixed)."""
    raw = tensors(inputs)[name][2]
    return raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()


def test_text_models_are_listed_and_token_models_are_not():
    assert ModelInfo.from_config(config("router", ROUTER_INPUTS)).name == "router"
    assert ModelInfo.from_config(config("smollm2", LLM_INPUTS)) is not None
    ensemble = ModelInfo.from_config(
        config("llama", ["text_input", "max_tokens", "temperature"], batch=8)
    )
    assert ensemble.batched
    # TRT-LLM's internal models take or give token ids, not text.
    assert (
        ModelInfo.from_config(
            config("llama_preprocessing", ["QUERY", "REQUEST_OUTPUT_LEN"], outputs=["INPUT_ID"])
        )
        is None
    )
    assert (
        ModelInfo.from_config(config("llama_postprocessing", ["TOKENS_BATCH"], outputs=["OUTPUT"]))
        is None
    )
    assert (
        ModelInfo.from_config(config("llama_tensorrt_llm", ["input_ids"], outputs=["output_ids"]))
        is None
    )


def test_chat_becomes_messages_sampling_json_and_router_hints():
    info = ModelInfo.from_config(config("router", ROUTER_INPUTS))
    g = parse_chat(
        {
            "model": "router",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "temperature": 0,
            "max_tokens": 5,
            "route": "fast",
            "tenant": "acme",
        }
    )
    sent = tensors(build_inputs(g, info))
    assert set(sent) == {
        "messages",
        "stream",
        "max_tokens",
        "exclude_input_in_output",
        "sampling_parameters",
        "route",
        "tenant",
    }
    assert sent["stream"][:2] == ("BOOL", [1])
    assert sent["max_tokens"][0] == "INT32"
    messages = build_inputs(g, info)[0]
    assert messages.name() == "messages"


def test_completion_becomes_text_input_and_hints_are_dropped_for_an_engine_model():
    info = ModelInfo.from_config(config("smollm2", LLM_INPUTS))
    g = parse_completion({"model": "smollm2", "prompt": "Once", "route": "fast", "seed": 3})
    sent = tensors(build_inputs(g, info))
    assert set(sent) == {"text_input", "stream", "exclude_input_in_output", "sampling_parameters"}


def test_a_model_without_messages_refuses_chat_and_batched_models_get_a_batch_dim():
    info = ModelInfo.from_config(
        config(
            "llama",
            ["text_input", "max_tokens", "stream", "temperature"],
            batch=8,
            types={**TYPES, "temperature": "TYPE_FP32"},
        )
    )
    with pytest.raises(OpenAIError) as caught:
        build_inputs(
            parse_chat({"model": "llama", "messages": [{"role": "user", "content": "x"}]}), info
        )
    assert caught.value.status == 400 and caught.value.param == "model"
    sent = tensors(
        build_inputs(parse_completion({"model": "llama", "prompt": "x", "temperature": 0.5}), info)
    )
    assert sent["temperature"][:2] == ("FP32", [1, 1])
    assert sent["text_input"][1] == [1, 1]
    with pytest.raises(OpenAIError) as caught:
        build_inputs(parse_completion({"model": "llama", "prompt": "x", "seed": 1}), info)
    assert caught.value.param == "seed"


def test_a_named_adapter_goes_out_as_lora_name_in_sampling_parameters():
    # Before: the frontend dropped `lora_name`, and the base model answered.
    router = ModelInfo.from_config(config("router", ROUTER_INPUTS))
    g = parse_chat(
        {
            "model": "router",
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 0,
            "lora_name": "support",
        }
    )
    assert json.loads(text_of(build_inputs(g, router), "sampling_parameters")) == {
        "temperature": 0.0,
        "lora_name": "support",
    }
    alone = parse_completion({"model": "router", "prompt": "x", "lora_name": "legal"})
    assert json.loads(text_of(build_inputs(alone, router), "sampling_parameters")) == {
        "lora_name": "legal"
    }
    # A TRT-LLM ensemble with adapters takes it as a tensor of its own; one without
    # any way to name an adapter refuses it rather than answer from the base model.
    ensemble = ModelInfo.from_config(
        config("llama", ["text_input", "max_tokens", "lora_name"], batch=8)
    )
    sent = build_inputs(alone, ensemble)
    assert text_of(sent, "lora_name") == "legal"
    assert tensors(sent)["lora_name"][1] == [1, 1]
    plain = ModelInfo.from_config(config("llama", ["text_input", "max_tokens"], batch=8))
    with pytest.raises(OpenAIError) as caught:
        build_inputs(alone, plain)
    assert caught.value.status == 400 and caught.value.param == "lora_name"


def _result(**outputs) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    for name, value in outputs.items():
        out = response.outputs.add()
        out.name, out.shape[:] = name, [1]
        if isinstance(value, str):
            out.datatype = "BYTES"
            raw = value.encode()
            response.raw_output_contents.append(len(raw).to_bytes(4, "little") + raw)
        else:
            out.datatype = "UINT32"
            response.raw_output_contents.append(np.array([value], np.uint32).tobytes())
    return response


def test_read_response():
    piece, error = read_response(
        _result(
            text_output=" Paris",
            finish_reason="",
            num_input_tokens=37,
            num_output_tokens=6,
            error="",
        )
    )
    assert (piece.text, piece.finish_reason, piece.input_tokens, piece.output_tokens, error) == (
        " Paris",
        None,
        37,
        6,
        None,
    )
    piece, error = read_response(
        _result(text_output="", finish_reason="error", error="engine died")
    )
    assert error == "engine died"
    piece, error = read_response(
        _result(
            text_output="caf\u00e9",
            served_by="smollm2",
            finish_reason="length",
            num_output_tokens=32,
        )
    )
    assert (piece.text, piece.served_by, piece.finish_reason, piece.output_tokens, error) == (
        "caf\u00e9",
        "smollm2",
        "length",
        32,
        None,
    )
