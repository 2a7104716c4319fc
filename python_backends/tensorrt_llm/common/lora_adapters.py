"""The LoRA adapters of a TRT-LLM model, as its pre-processing model hands them to the engine.

`trident repo` converted each adapter into TRT-LLM's format beside this file
(lora/NAME/model.lora_weights.npy, model.lora_config.npy) and names them in the
`lora_adapters` parameter (name → lora_task_id). A request names its adapter with
`lora_name` (the ensemble input, in sampling_parameters, or a request parameter); the
engine gets
`lora_task_id` and, the first time this instance sends that task, its weights and config:
the tensorrtllm backend caches adapters by task id (its host cache is sized to hold them
all). With `lora_send_weights: always` (several engine instances, each with its own
cache) every request carries them. Free of Triton types; its refusals are marked through
trident_common/error_classes.py, which `trident repo` ships beside it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trident_common.error_classes import CLIENT

Array = npt.NDArray[Any]

WEIGHTS_NPY = "model.lora_weights.npy"
CONFIG_NPY = "model.lora_config.npy"


class UnknownAdapter(ValueError):
    """A request named an adapter the model does not hold (a client error, marked with
    CLIENT and its `[lora_name]` tag). The client is not told which adapters the model
    does hold: the server's log says that (the pre-processing model, at load)."""


class LoraTable:
    def __init__(
        self,
        model: str,
        task_ids: Mapping[str, int],
        folder: str | Path,
        send_always: bool = False,
    ) -> None:
        self.model = model
        self.task_ids = dict(task_ids)
        self.folder = Path(folder)
        self.send_always = send_always
        self._sent: set[int] = set()  # task ids whose weights reached the engine
        self._pending: set[int] = set()  # ... in the batch being answered now
        self._arrays: dict[str, tuple[Array, Array]] = {}  # name → (weights, config)
        self._lock = threading.Lock()

    @classmethod
    def from_parameters(
        cls, model: str, parameters: Mapping[str, Any], folder: str | Path
    ) -> LoraTable | None:
        """None for a model without adapters (its config has no lora_adapters)."""
        if "lora_adapters" not in parameters:
            return None
        send = parameters.get("lora_send_weights", {}).get("string_value", "first_use")
        return cls(
            model,
            json.loads(parameters["lora_adapters"]["string_value"]),
            folder,
            send_always=send == "always",
        )

    def select(self, name: str) -> tuple[int, Array | None, Array | None]:
        """(task id, weights or None, config or None) for adapter `name`."""
        task = self.task_ids.get(name)
        if task is None:
            raise UnknownAdapter(
                CLIENT.mark(
                    f"unknown adapter {name!r}: model {self.model} has no adapter of that name",
                    "lora_name",
                )
            )
        with self._lock:
            if task in self._sent and not self.send_always:
                return task, None, None
            self._pending.add(task)
        weights, config = self._load(name)
        return task, weights, config

    def commit(self) -> None:
        """The batch was answered: its adapters now sit in the engine's cache. Requests of
        one batch all carry the weights, so none reaches the engine before them."""
        with self._lock:
            self._sent |= self._pending
            self._pending.clear()

    def _load(self, name: str) -> tuple[Array, Array]:
        if name not in self._arrays:  # a race loads twice, harmlessly
            folder = self.folder / name
            self._arrays[name] = (
                np.load(folder / WEIGHTS_NPY, allow_pickle=False),
                np.load(folder / CONFIG_NPY, allow_pickle=False),
            )
        return self._arrays[name]


def _first_text(tensor: Array | None) -> str:
    values: Array | list[Any] = (
        np.asarray(tensor, dtype=object).reshape(-1) if tensor is not None else []
    )
    value = values[0] if len(values) else b""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def requested_name(
    name_tensor: Array | None, sampling_tensor: Array | None, parameters_json: str | None
) -> str | None:
    """The adapter a request names: the lora_name input, else `lora_name` in its
    sampling_parameters (vllm_backend's dialect), else its `lora_name` request parameter;
    None for the base model. The ensemble's sampling_parameters carry only lora_name:
    TRT-LLM's sampling knobs are tensors of their own, and ignoring them would be silent."""
    name = _first_text(name_tensor)
    sampling = json.loads(_first_text(sampling_tensor) or "{}")
    if not isinstance(sampling, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    others = sorted(set(sampling) - {"lora_name"})
    if others:
        raise ValueError(
            f"sampling_parameters of the TRT-LLM ensemble carry only lora_name; "
            f"send {', '.join(others)} as the ensemble's own inputs"
        )
    name = name or sampling.get("lora_name") or ""
    if not name and parameters_json:
        name = json.loads(parameters_json).get("lora_name") or ""
    return str(name) or None


def engine_tensors(table: LoraTable | None, name: str | None, batch: int) -> dict[str, Array]:
    """{output name: array} for the engine's LoRA inputs ({} for the base model)."""
    if name is None:
        return {}
    if table is None:
        raise UnknownAdapter(
            CLIENT.mark(f"unknown adapter {name!r}: the model has no adapters", "lora_name")
        )
    task, weights, config = table.select(name)
    out: dict[str, Array] = {"LORA_TASK_ID": np.full((batch, 1), task, dtype=np.uint64)}
    if weights is not None and config is not None:  # select gives both or neither
        out["LORA_WEIGHTS"] = np.repeat(weights, batch, axis=0)
        out["LORA_CONFIG"] = np.repeat(config, batch, axis=0)
    return out
