"""The OpenAI frontend's requests and responses as Triton tensors: which inputs a model
takes (ModelInfo), one generation as inputs (build_inputs), one streamed response as a
Piece (read_response). Pure mapping, no I/O: the transport is triton.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import InferInput, InferResult

from builder.serve.openai import tools as chat_tools
from builder.serve.openai.errors import invalid
from builder.serve.openai.protocol import Generation

DTYPES = {
    "TYPE_BOOL": ("BOOL", bool),
    "TYPE_INT32": ("INT32", np.int32),
    "TYPE_INT64": ("INT64", np.int64),
    "TYPE_UINT64": ("UINT64", np.uint64),
    "TYPE_FP32": ("FP32", np.float32),
    "TYPE_STRING": ("BYTES", np.object_),
}


@dataclass(frozen=True)
class ModelInfo:
    """What the frontend needs of a model's config."""

    name: str
    inputs: dict  # input name -> Triton data type (TYPE_...)
    batched: bool  # max_batch_size > 0: tensors get a batch dimension

    @staticmethod
    def from_config(config: dict) -> ModelInfo | None:
        """The model, if it speaks text in and text out (an LLM: the router, an engine
        model, a TRT-LLM ensemble); None for the rest (TRT-LLM's pre/post-processing
        and engine models take token ids)."""
        inputs = {i.get("name"): i.get("data_type", "") for i in config.get("input", [])}
        outputs = {o.get("name") for o in config.get("output", [])}
        if "text_output" not in outputs or not {"text_input", "messages"} & set(inputs):
            return None
        return ModelInfo(
            config.get("name", ""), inputs, int(config.get("max_batch_size", 0) or 0) > 0
        )


@dataclass
class Piece:
    """One streamed response: new text, and the engine's counts so far."""

    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    served_by: str = ""  # the engine model that answered (through the router)
    # The logprobs of this response's tokens when asked for (the `logprobs` output:
    # per token, {token id: {logprob, rank, decoded_token}}, the sampled token first).
    logprobs: list | None = None
    tool_calls: list | None = None  # the answer's calls, on its last response (tools.py)


class OneValue(InferInput):
    """An input of one element, its raw bytes given. tritonclient's
    set_data_from_numpy checks and serialises an array per tensor: ~40 us each, 0.2 ms
    of every request's path to its first token for five inputs (docs/performance.md,
    "The OpenAI frontend's own cost")."""

    def __init__(self, name: str, shape: list[int], datatype: str, raw: bytes):
        super().__init__(name, shape, datatype)
        self._one_value = raw

    def _get_content(self) -> bytes:
        return self._one_value


def build_inputs(generation: Generation, info: ModelInfo) -> list:
    """Triton inputs for one generation; raises OpenAIError (400) for what this model
    cannot take."""
    shape = [1, 1] if info.batched else [1]

    def tensors_of(values) -> list:
        return [_one_value(info, shape, name, value) for name, value in values]

    # Values become tensors group by group, in order, so one that fails to convert
    # raises before a later one is refused.
    tensors = tensors_of(_prompt_values(generation, info))
    tensors += tensors_of(_tool_values(generation, info))
    if "stream" in info.inputs:
        tensors += tensors_of([("stream", generation.stream)])
    if generation.max_tokens is not None:
        tensors += tensors_of([("max_tokens", generation.max_tokens)])
    if "exclude_input_in_output" in info.inputs:
        tensors += tensors_of([("exclude_input_in_output", True)])
    sampling = generation.sampling
    if generation.logprobs is not None:
        # vLLM's `logprobs`: alternatives per token beside the sampled one; the engine
        # models then add the `logprobs` output to their usual ones (returns.py).
        sampling = {**sampling, "logprobs": generation.logprobs}
    if generation.lora_name is not None:
        lora_values, sampling = _lora_values(generation.lora_name, info, sampling)
        tensors += tensors_of(lora_values)
    tensors += tensors_of(_sampling_values(sampling, info))
    # A model without a router ignores routing hints.
    tensors += tensors_of((n, v) for n, v in generation.hints.items() if n in info.inputs)
    return tensors


def _one_value(info: ModelInfo, shape: list[int], name: str, value) -> OneValue:
    """One input tensor of one element, in the data type the model's config gives it."""
    dtype, np_dtype = DTYPES[info.inputs.get(name, "TYPE_STRING")]
    if np_dtype is np.object_:
        data = str(value).encode()
        raw = len(data).to_bytes(4, "little") + data  # Triton's BYTES: length, bytes
    else:
        raw = np.array([value], dtype=np_dtype).tobytes()
    return OneValue(name, shape, dtype, raw)


def _prompt_values(generation: Generation, info: ModelInfo) -> list[tuple[str, object]]:
    """The chat messages or the text prompt, as the model takes them."""
    if generation.kind == "chat":
        if "messages" not in info.inputs:
            raise invalid(
                "model",
                f"model '{info.name}' takes no chat messages (use /v1/completions, or the router)",
                "unsupported_model",
            )
        return [("messages", json.dumps(generation.messages))]
    if "text_input" not in info.inputs:
        raise invalid(
            "model",
            f"model '{info.name}' takes no text prompt (use /v1/chat/completions)",
            "unsupported_model",
        )
    return [("text_input", generation.prompt)]


def _tool_values(generation: Generation, info: ModelInfo) -> list[tuple[str, object]]:
    """The tools and tool choice, when the request names tools."""
    if generation.tools is None:
        return []
    if "tools" not in info.inputs:
        raise invalid(
            "tools",
            f"model '{info.name}' takes no tools (tool calling "
            "needs a vLLM or SGLang model, or the router)",
            "unsupported_parameter",
        )
    return list(chat_tools.inputs(generation.tools, generation.tool_choice).items())


def _lora_values(
    lora_name: str, info: ModelInfo, sampling: dict
) -> tuple[list[tuple[str, object]], dict]:
    """The adapter as a tensor of its own, or in the sampling parameters (returned)."""
    # The adapter goes where vllm_backend's clients put it, and where the router and
    # trident's engine models read it: `lora_name` in sampling_parameters; a TRT-LLM
    # ensemble with adapters also takes it as a tensor of its own.
    if "lora_name" in info.inputs:
        return [("lora_name", lora_name)], sampling
    if "sampling_parameters" in info.inputs:
        return [], {**sampling, "lora_name": lora_name}
    raise invalid("lora_name", f"model '{info.name}' takes no adapters", "unsupported_parameter")


def _sampling_values(sampling: dict, info: ModelInfo) -> Iterator[tuple[str, object]]:
    """The sampling values: one JSON tensor, or one tensor per value (a TRT-LLM ensemble)."""
    if not sampling:
        return
    if "sampling_parameters" in info.inputs:
        yield "sampling_parameters", json.dumps(sampling)
        return
    if "structured_outputs" in sampling:
        raise invalid(
            "response_format",
            f"model '{info.name}' has no structured "
            "outputs (a vLLM or SGLang model has, or the router)",
            "unsupported_parameter",
        )
    for name, value in sampling.items():
        if name not in info.inputs or isinstance(value, (list, dict)):
            raise invalid(
                name, f"model '{info.name}' does not take '{name}'", "unsupported_parameter"
            )
        yield name, value


# One element of a numeric output, straight from its raw bytes (little-endian).
NUMERIC = {
    "BOOL": struct.Struct("<?"),
    "INT32": struct.Struct("<i"),
    "INT64": struct.Struct("<q"),
    "UINT32": struct.Struct("<I"),
    "UINT64": struct.Struct("<Q"),
    "FP32": struct.Struct("<f"),
}


def read_response(response) -> tuple[Piece, str | None]:
    """One streamed ModelInferResponse as a Piece, and the mid-stream error it carries
    (or None). This runs once per streamed response: no InferResult around it."""
    values = first_values(response)
    text = values.get("text_output") or ""
    error = values.get("error") or None
    logprobs = values.get("logprobs")
    calls = values.get("tool_calls")
    return Piece(
        text,
        values.get("finish_reason") or None,
        int(values.get("num_input_tokens") or 0),
        int(values.get("num_output_tokens") or 0),
        values.get("served_by") or "",
        json.loads(logprobs) if logprobs else None,
        chat_tools.read(calls) if calls else None,
    ), error


def first_values(response) -> dict:
    """The first element of each output of a ModelInferResponse, by name (BYTES decoded
    as UTF-8). Read from the raw bytes: this runs for every streamed response, and
    tritonclient's as_numpy (a name search and a numpy array per output) costs several
    times more. Each output's name and data type are read once: every attribute read
    of a protobuf message is a lookup of its own."""
    raws = response.raw_output_contents
    count = len(raws)
    values: dict[str, object] = {}
    for i, output in enumerate(response.outputs):
        name, datatype = output.name, output.datatype
        if i < count:
            raw = raws[i]
            if datatype == "BYTES":
                if len(raw) < 4:
                    values[name] = None
                else:
                    size = int.from_bytes(raw[:4], "little")
                    values[name] = raw[4 : 4 + size].decode("utf-8", "replace")
                continue
            reader = NUMERIC.get(datatype)
            if reader is not None:
                values[name] = reader.unpack_from(raw)[0] if len(raw) >= reader.size else None
                continue
        values[name] = _typed(response, name)
    return values


def _typed(response, name: str):
    """An output sent as typed contents (no raw bytes), or of a rarer data type: through
    tritonclient's own decoding."""
    try:
        array = InferResult(response).as_numpy(name)
    except Exception:
        return None
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
