"""TRT-LLM ensemble step 1: text_input → input_ids (the model's own tokenizer), and for a
model with LoRA adapters, lora_name → the engine's lora_task_id / lora_weights / lora_config.

Parameters (config.pbtxt): tokenizer_dir; with adapters also model_name, lora_adapters and
lora_send_weights (lora_adapters.py). Outputs end/pad ids so the engine stops where the
tokenizer says a sequence ends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from python_backends.tensorrt_llm.common.lora_adapters import (
    LoraTable,
    engine_tensors,
    requested_name,
)
from python_backends.tensorrt_llm.common.tokenizing import (
    Array,
    encode_batch,
    load_tokenizer,
    special_ids,
)
from trident_common.error_classes import triton_error
from trident_common.log import Log


def _parameter(config: dict[str, Any], key: str) -> str:
    value: str = config["parameters"][key]["string_value"]
    return value


def _required(request: pb_utils.InferenceRequest, name: str) -> Array:
    """A required input's array (Triton refuses a request without one before execute)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"missing input {name}")
    return tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self.tokenizer = load_tokenizer(_parameter(config, "tokenizer_dir"))
        self.end_id, self.pad_id = special_ids(self.tokenizer)
        parameters = config["parameters"]
        model = parameters.get("model_name", {}).get("string_value", config["name"])
        # The converted adapters lie in the model's version folder (builder/render/trtllm.py).
        version = Path(args["model_repository"]) / args["model_version"]
        self.adapters = LoraTable.from_parameters(model, parameters, version / "lora")
        if self.adapters is not None:  # a client naming another is told only "unknown"
            Log(config["name"]).info(
                f"model {model} has adapters: {', '.join(sorted(self.adapters.task_ids))}"
            )

    def execute(
        self, requests: list[pb_utils.InferenceRequest]
    ) -> list[pb_utils.InferenceResponse]:
        responses = [self._one(request) for request in requests]
        if self.adapters is not None:
            self.adapters.commit()
        return responses

    def _one(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        try:
            query = _required(request, "QUERY")
            output_len = _required(request, "REQUEST_OUTPUT_LEN").astype(np.int32)
            if (output_len < 1).any():
                raise ValueError("max_tokens must be >= 1")
            ids, lengths = encode_batch(self.tokenizer, query, self.pad_id)
            lora = engine_tensors(self.adapters, _lora_name(request), ids.shape[0])
        except Exception as e:  # a bad request fails alone, never the model
            # its marker (an unknown adapter's CLIENT) sets the code; none is INTERNAL
            return pb_utils.InferenceResponse(error=triton_error(pb_utils, str(e)))
        batch = ids.shape[0]
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("INPUT_ID", ids),
                pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.reshape(batch, 1)),
                pb_utils.Tensor("OUT_END_ID", np.full((batch, 1), self.end_id, dtype=np.int32)),
                pb_utils.Tensor("OUT_PAD_ID", np.full((batch, 1), self.pad_id, dtype=np.int32)),
            ]
            + [pb_utils.Tensor(name, value) for name, value in lora.items()]
        )


def _lora_name(request: pb_utils.InferenceRequest) -> str | None:
    name, sampling = (
        pb_utils.get_input_tensor_by_name(request, n) for n in ("LORA_NAME", "SAMPLING_PARAMETERS")
    )
    parameters = getattr(request, "parameters", None)  # Triton's request parameters (JSON)
    return requested_name(
        name.as_numpy() if name is not None else None,
        sampling.as_numpy() if sampling is not None else None,
        parameters() if parameters else None,
    )
