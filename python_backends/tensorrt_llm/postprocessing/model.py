"""TRT-LLM ensemble step 3: output_ids → text_output.

When streaming, the engine sends only the new tokens of each step, so each response's
text is the new text (the router's convention). Parameters: tokenizer_dir,
skip_special_tokens.
"""

import json

import triton_python_backend_utils as pb_utils

from tokenizing import decode_batch, load_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.tokenizer = load_tokenizer(parameters["tokenizer_dir"]["string_value"])
        self.skip_special = parameters["skip_special_tokens"]["string_value"] == "true"

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            text = decode_batch(self.tokenizer, tokens, lengths, self.skip_special)
        except Exception as e:  # a bad request fails alone, never the model
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", text)])
