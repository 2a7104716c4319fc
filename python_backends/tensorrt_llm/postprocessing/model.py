"""TRT-LLM ensemble step 3: output_ids → text_output.

When streaming, the engine sends only the new tokens of each step, so each response's
text is the new text (the router's convention). Parameters: tokenizer_dir,
skip_special_tokens.
"""

from __future__ import annotations

import json
from typing import Any

import triton_python_backend_utils as pb_utils

from python_backends.tensorrt_llm.common.tokenizing import Array, decode_batch, load_tokenizer


def _required(request: pb_utils.InferenceRequest, name: str) -> Array:
    """A required input's array (Triton refuses a request without one before execute)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"missing input {name}")
    return tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        parameters = json.loads(args["model_config"])["parameters"]
        self.tokenizer = load_tokenizer(parameters["tokenizer_dir"]["string_value"])
        self.skip_special = parameters["skip_special_tokens"]["string_value"] == "true"

    def execute(
        self, requests: list[pb_utils.InferenceRequest]
    ) -> list[pb_utils.InferenceResponse]:
        return [self._one(request) for request in requests]

    def _one(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        try:
            tokens = _required(request, "TOKENS_BATCH")
            lengths = _required(request, "SEQUENCE_LENGTH")
            text = decode_batch(self.tokenizer, tokens, lengths, self.skip_special)
        except Exception as e:  # a bad request fails alone, never the model
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", text)])
