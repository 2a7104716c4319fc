"""How the router speaks to each engine's model: inputs, outputs, errors, abort.

trident's vLLM and SGLang models share the router's own interface, so their tensors and
responses pass through untouched (no per-chunk work beyond an error check). TRT-LLM's
ensemble uses batch dimensions ([1, 1]), separate sampling tensors and a required
`max_tokens`, and has no `served_by`: its adapter translates both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import triton_python_backend_utils as pb_utils

from trident_common import interface
from trident_common.request import DEFAULT_MAX_TOKENS, BadRequest, first_scalar
from trident_common.sampling import check_range, coerce_sampling, parse_sampling

if TYPE_CHECKING:
    from bls.router_config import BackendConfig

# Inputs only the router reads (routing hints, its own ids); never forwarded as they are.
ROUTER_ONLY_INPUTS = interface.ROUTER_ONLY_INPUTS
LLM_OUTPUTS = list(interface.OUTPUT_NAMES)
# vLLM-style sampling name → (TRT-LLM ensemble input, numpy dtype).
TRTLLM_SAMPLING = {
    key: (t.ensemble, np.dtype(interface.NUMPY_DTYPES[t.dtype]))
    for key, t in interface.TRTLLM_SAMPLING.items()
}

# What an adapter's split makes of one backend response: the backend's error or None, the
# response to relay or None, and whether it is the answer's last. Annotations only: the
# stub adds pb_utils' classes to the module after the model's files are imported.
if TYPE_CHECKING:
    Split = tuple[str | None, pb_utils.InferenceResponse | None, bool]


class Unsupported(ValueError):
    """The request asks what this engine's model has no input for (chat messages, or a
    sampling value, for the TRT-LLM ensemble): not this backend's failure, and another
    backend of the route may take it (the router's DoesNotFit). A ValueError still, as
    before it had a name."""


def string_tensor(name: str, value: str, shape: tuple[int, ...] = (1,)) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.array([value.encode("utf-8")], dtype=np.object_).reshape(shape))


class PythonLlmAdapter:
    """vLLM and SGLang models rendered by trident."""

    outputs = LLM_OUTPUTS

    def inputs(
        self,
        inputs: list[pb_utils.Tensor],
        id_tensor: pb_utils.Tensor,
        adapter: str | None = None,
    ) -> list[pb_utils.Tensor]:
        """The client's inputs and the router's request_id tensor (bls/job.py RequestIds
        makes it ahead); the model reads the adapter from sampling_parameters or the
        forwarded request parameters itself."""
        return [*inputs, id_tensor]

    def abort_inputs(self, request_id: str) -> list[pb_utils.Tensor] | None:
        return [string_tensor(interface.ABORT_REQUEST_ID, request_id)]

    def split(self, response: pb_utils.InferenceResponse) -> Split:
        """(the backend's error or None, the response to relay or None if it is empty,
        whether it is the answer's last: it carries a finish reason).

        Per chunk on the hot path: the tensors are read once and passed on as they are."""
        if response.has_error():
            return response.error().message(), None, False
        tensors = response.output_tensors()
        if not tensors:
            return None, None, False
        last = False
        for tensor in tensors:
            name = tensor.name()
            if name == "error":
                message = first_scalar(tensor.as_numpy())
                if message:
                    return message, None, False
            elif name == "finish_reason":
                # "None" is vllm_backend's word for "not finished" (return_finish_reason).
                last = first_scalar(tensor.as_numpy()) not in ("", "None", None)
        return None, pb_utils.InferenceResponse(output_tensors=tensors), last


class TrtllmAdapter:
    """TRT-LLM's ensemble (preprocessing → tensorrt_llm → postprocessing)."""

    outputs = [t.name for t in interface.TRTLLM_ENSEMBLE_OUTPUTS]

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def inputs(
        self,
        inputs: list[pb_utils.Tensor],
        id_tensor: pb_utils.Tensor | None = None,
        adapter: str | None = None,
    ) -> list[pb_utils.Tensor]:
        """The ensemble's inputs (it takes no request id); `adapter` is the LoRA adapter
        the request names (in sampling_parameters or a request parameter), sent as the
        lora_name input."""
        values = {t.name(): t.as_numpy() for t in inputs}
        if "messages" in values:
            raise Unsupported("the TRT-LLM ensemble takes text_input, not messages")
        if "tools" in values or "tool_choice" in values:  # never dropped on the way
            raise BadRequest(
                "[tools] the TRT-LLM ensemble takes no tools: tool calling "
                "needs a vLLM or SGLang model"
            )
        # Typed and range-checked as the engine models do (BadRequest: the client's fault).
        sampling = coerce_sampling(parse_sampling(first_scalar(values.get("sampling_parameters"))))
        adapter = sampling.pop("lora_name", None) or adapter
        max_tokens = first_scalar(values.get("max_tokens"))
        max_tokens = max_tokens or sampling.pop("max_tokens", DEFAULT_MAX_TOKENS)
        out = [
            string_tensor("text_input", first_scalar(values["text_input"]), (1, 1)),
            pb_utils.Tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
            pb_utils.Tensor(
                "stream", np.array([[bool(first_scalar(values.get("stream")))]], dtype=bool)
            ),
        ]
        if "exclude_input_in_output" in values:
            out.append(
                pb_utils.Tensor(
                    "exclude_input_in_output",
                    np.array([[bool(first_scalar(values["exclude_input_in_output"]))]], dtype=bool),
                )
            )
        if adapter:
            out.append(string_tensor("lora_name", adapter, (1, 1)))
        for key, value in sampling.items():
            if key not in TRTLLM_SAMPLING:
                raise Unsupported(
                    f"sampling parameter {key!r} is not supported by TRT-LLM "
                    f"(supported: {', '.join(sorted(TRTLLM_SAMPLING))})"
                )
            name, dtype = TRTLLM_SAMPLING[key]
            if dtype.kind in "iu":  # never wraps: random_seed is UINT64, a negative seed not
                info = np.iinfo(dtype)
                check_range(f"sampling_parameters.{key}", value, (int(info.min), int(info.max)))
            out.append(pb_utils.Tensor(name, np.array([[value]], dtype=dtype)))
        return out

    def abort_inputs(self, request_id: str) -> list[pb_utils.Tensor] | None:
        return None  # the ensemble has no abort input; the stream ends on its own

    def split(self, response: pb_utils.InferenceResponse) -> Split:
        """(the backend's error or None, the response in the router's interface or None
        if it is empty)."""
        if response.has_error():
            return response.error().message(), None, False
        text = pb_utils.get_output_tensor_by_name(response, "text_output")
        if text is None:
            return None, None, False
        # Fresh tensors per response: a send copies each tensor into shared memory with
        # the GIL released, so one tensor object shared by concurrent relays races.
        return (
            None,
            pb_utils.InferenceResponse(
                output_tensors=[
                    string_tensor("text_output", first_scalar(text.as_numpy()) or ""),
                    string_tensor("served_by", self.backend),
                    string_tensor("error", ""),
                ]
            ),
            False,
        )


class Adapters(dict[str, "PythonLlmAdapter | TrtllmAdapter"]):
    """Adapter per backend name, built from the router config."""

    @classmethod
    def from_config(cls, backends: Mapping[str, BackendConfig]) -> Adapters:
        python_llm = PythonLlmAdapter()
        return cls(
            {
                name: TrtllmAdapter(name) if info.engine == "tensorrt_llm" else python_llm
                for name, info in backends.items()
            }
        )
