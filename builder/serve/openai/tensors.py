"""The OpenAI frontend's requests and responses as Triton tensors: which inputs a model
takes (ModelInfo), one generation as inputs (build_inputs), one streamed response as a
Piece (read_response). Pure mapping, no I/O: the transport is triton.py.
"""

from __future__ import annotations

import json
import struct
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
    tensors: list = []

    shape = [1, 1] if info.batched else [1]

    def add(name: str, value) -> None:
        dtype, np_dtype = DTYPES[info.inputs.get(name, "TYPE_STRING")]
        if np_dtype is np.object_:
            data = str(value).encode()
            raw = len(data).to_bytes(4, "little") + data  # Triton's BYTES: length, bytes
        else:
            raw = np.array([value], dtype=np_dtype).tobytes()
        tensors.append(OneValue(name, shape, dtype, raw))

    if generation.kind == "chat":
        if "messages" not in info.inputs:
            raise invalid(
                "model",
                f"model '{info.name}' takes no chat messages (use /v1/completions, or the router)",
                "unsupported_model",
            )
        add("messages", json.dumps(generation.messages))
    else:
        if "text_input" not in info.inputs:
            raise invalid(
                "model",
                f"model '{info.name}' takes no text prompt (use /v1/chat/completions)",
                "unsupported_model",
            )
        add("text_input", generation.prompt)
    if generation.tools is not None:
        if "tools" not in info.inputs:
            raise invalid(
                "tools",
                f"model '{info.name}' takes no tools (tool calling "
                "needs a vLLM or SGLang model, or the router)",
                "unsupported_parameter",
            )
        for name, value in chat_tools.inputs(generation.tools, generation.tool_choice).items():
            add(name, value)
    if "stream" in info.inputs:
        add("stream", generation.stream)
    if generation.max_tokens is not None:
        add("max_tokens", generation.max_tokens)
    if "exclude_input_in_output" in info.inputs:
        add("exclude_input_in_output", True)
    sampling = generation.sampling
    if generation.logprobs is not None:
        # vLLM's `logprobs`: alternatives per token beside the sampled one; the engine
        # models then add the `logprobs` output to their usual ones (returns.py).
        sampling = {**sampling, "logprobs": generation.logprobs}
    if generation.lora_name is not None:
        # The adapter goes where vllm_backend's clients put it, and where the router and
        # trident's engine models read it: `lora_name` in sampling_parameters; a TRT-LLM
        # ensemble with adapters also takes it as a tensor of its own.
        if "lora_name" in info.inputs:
            add("lora_name", generation.lora_name)
        elif "sampling_parameters" in info.inputs:
            sampling = {**sampling, "lora_name": generation.lora_name}
        else:
            raise invalid(
                "lora_name", f"model '{info.name}' takes no adapters", "unsupported_parameter"
            )
    if sampling and "sampling_parameters" in info.inputs:
        add("sampling_parameters", json.dumps(sampling))
    elif sampling:
        # A model with one tensor per sampling value (a TRT-LLM ensemble).
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
            add(name, value)
    for name, value in generation.hints.items():
        if name in info.inputs:  # a model without a router ignores routing hints
            add(name, value)
    return tensors


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
