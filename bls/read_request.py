"""Reading a client's request into what the router routes by (Inbound): its hints, the
tenant's tier in place of the client's, its prompt or messages (normalised once), whether
it streams, the outputs it asks for, the request parameters a backend may take, and the
fan-out it belongs to. Runs in the router's stub only (pb_utils tensors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils

from bls.adapters import string_tensor
from bls.inbound import Inbound
from bls.policy import ADAPTER_KEYS, features_from
from bls.tenants import FAN_OUT_KEYS, fan_out_of
from trident_common.interface import HINT_NAMES, RETURNABLE, ROUTER_PROOF, TRACEPARENT
from trident_common.request import first_scalar, parse_messages

HINT_KEYS = (*HINT_NAMES, *ADAPTER_KEYS)  # the hints, and the adapter's (policy.adapter_name)
RETURN_FLAGS = tuple(f"return_{name}" for name in RETURNABLE)
READ_INPUTS = frozenset((*HINT_KEYS, *RETURN_FLAGS, "text_input", "messages", "stream"))


def forwardable(parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """Request parameters as a BLS request takes them: the stub accepts bool, int and
    str values only, so a float travels as its text (the engine models convert sampling
    values sent as text, as vllm_backend does). A client's ROUTER_PROOF is dropped: the
    proof is the router's own (trust.py), and so is a TRACEPARENT; the fan-out's are the
    router's to read (tenants.fan_out_of). None when there are none."""
    if not parameters:
        return None
    return {
        k: str(v) if isinstance(v, float) else v
        for k, v in parameters.items()
        if isinstance(v, (bool, int, str, float))
        and k not in (ROUTER_PROOF, TRACEPARENT, *FAN_OUT_KEYS)
    }


def read_request(
    request: pb_utils.InferenceRequest, set_tier: Callable[[dict[str, Any]], None]
) -> Inbound:
    """Routing features, whether the client streams, and inputs to forward in a
    normalised form; from one pass over the request's inputs. `set_tier` puts the
    tenant's tier from the spec in the hints (Tenants.set_tier), never the client's."""
    hints: dict[str, Any]
    loaded: dict[str, Any] | None
    hints, loaded = {}, None
    params = request.parameters()
    if params and params != "{}":
        loaded = json.loads(params)
        hints.update({k: loaded[k] for k in HINT_KEYS if k in loaded})
    inputs = [(t.name(), t) for t in request.inputs()]
    values = {name: t for name, t in inputs if name in READ_INPUTS}
    for name in HINT_KEYS:
        if name in values:
            hints[name] = first_scalar(values[name].as_numpy())
    set_tier(hints)
    text = first_scalar(values["text_input"].as_numpy()) if "text_input" in values else None
    messages: list[dict[str, Any]] | None = None
    if "messages" in values:
        messages, normalised = parse_messages(values["messages"].as_numpy())
        if normalised is not None:
            tensor = string_tensor("messages", normalised)
            inputs = [(name, tensor if name == "messages" else t) for name, t in inputs]
    stream = bool(first_scalar(values["stream"].as_numpy())) if "stream" in values else False
    returns = {
        name: bool(first_scalar(values[name].as_numpy())) for name in RETURN_FLAGS if name in values
    } or None
    return Inbound(
        features_from(text, messages, hints),
        stream,
        inputs,
        (text, messages),
        returns,
        forwardable(loaded),
        fan_out_of(loaded),
        sent_traceparent(loaded),
    )


def sent_traceparent(parameters: dict[str, Any] | None) -> str | None:
    """The traceparent a traced request's caller sent as a parameter besides its
    metadata (the OpenAI frontend does: tracing.EngineTraces.follow_caller says why)."""
    value = (parameters or {}).get(TRACEPARENT)
    return value if isinstance(value, str) else None
