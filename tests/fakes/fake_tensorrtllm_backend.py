"""A stand-in for the tensorrtllm backend's model inside a real tritonserver (Python
backend, decoupled), for the LoRA wiring of the TRT-LLM ensemble on machines without
TensorRT-LLM.

It keeps an adapter cache as the real backend does (a `lora_task_id` with weights and
config is stored; one without them must already be stored, else the request fails with
the backend's kind of error), appends what each request carried to the file named by the
`record_path` parameter, and echoes the prompt's ids as output_ids.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.record_path = parameters["record_path"]["string_value"]
        self.cache = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                response = self._one(request)
            except ValueError as e:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _one(self, request):
        ids = _input(request, "input_ids")
        task, weights, config = (
            _input(request, n) for n in ("lora_task_id", "lora_weights", "lora_config")
        )
        record = {
            "task": None if task is None else int(task.reshape(-1)[0]),
            "weights": None if weights is None else list(weights.shape),
            "weights_dtype": None if weights is None else str(weights.dtype),
            "config": None if config is None else config.reshape(-1, 3).tolist(),
        }
        with open(self.record_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if task is not None:
            if weights is not None:
                self.cache[record["task"]] = record["weights"]
            elif record["task"] not in self.cache:
                raise ValueError(
                    f"LoRA task {record['task']} not found in cache. Please "
                    "send LoRA weights with request"
                )
        out = ids.reshape(1, 1, -1).astype(np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("output_ids", out),
                pb_utils.Tensor("sequence_length", np.array([[out.shape[-1]]], dtype=np.int32)),
            ]
        )
