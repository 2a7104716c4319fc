"""trident's start-up self-test model: sends its one string (BYTES) input back unchanged.

Runs in a Python-backend stub of a short-lived tritonserver that `trident serve` starts
for itself (builder/serve/selftest.py); clients never see it.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT")
            # INPUT is a required input of the config selftest.py writes: Triton refuses a
            # request without it before the model sees one.
            assert tensor is not None
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", tensor.as_numpy())])
            )
        return responses
