"""TRT-LLM ensemble step 1: text_input → input_ids (the model's own tokenizer).

Parameters (config.pbtxt): tokenizer_dir. Outputs end/pad ids so the engine stops where
the tokenizer says a sequence ends.
"""
import numpy as np
import triton_python_backend_utils as pb_utils

from tokenizing import encode_batch, load_tokenizer, special_ids


def _parameter(config, key):
    return config["parameters"][key]["string_value"]


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        self.tokenizer = load_tokenizer(_parameter(config, "tokenizer_dir"))
        self.end_id, self.pad_id = special_ids(self.tokenizer)

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            output_len = pb_utils.get_input_tensor_by_name(
                request, "REQUEST_OUTPUT_LEN").as_numpy().astype(np.int32)
            if (output_len < 1).any():
                raise ValueError("max_tokens must be >= 1")
            ids, lengths = encode_batch(self.tokenizer, query, self.pad_id)
        except Exception as e:  # a bad request fails alone, never the model
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        batch = ids.shape[0]
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_ID", ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.reshape(batch, 1)),
            pb_utils.Tensor("OUT_END_ID", np.full((batch, 1), self.end_id, dtype=np.int32)),
            pb_utils.Tensor("OUT_PAD_ID", np.full((batch, 1), self.pad_id, dtype=np.int32)),
        ])
