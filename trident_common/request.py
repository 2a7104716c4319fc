"""The request side of trident's LLM tensor interface, as plain Python.

A backend hands `parse_generate` a function that returns an input tensor's value (or
None when absent); it gets back a GenerateRequest or a BadRequest naming the problem.
No Triton, no engine: the same code serves vLLM and SGLang and is unit-tested alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

# BadRequest, describe and the sampling names are imported from here by the models: the
# `X as X` form exports them explicitly (mypy --strict reads no other as a re-export).
from trident_common.faults import CLIENT_FAULT_PREFIX as CLIENT_FAULT_PREFIX
from trident_common.faults import BadRequest as BadRequest
from trident_common.faults import describe as describe
from trident_common.faults import show as _show
from trident_common.interface import (
    ABORT_REQUEST_ID,
    CACHE_SALT,
    PRIORITY,
    REQUEST_ID,
    RETURNABLE,
    UNPROVEN_PRIORITY,
)
from trident_common.sampling import SAMPLING_TYPES as SAMPLING_TYPES
from trident_common.sampling import check_range as check_range
from trident_common.sampling import check_sampling_keys as check_sampling_keys
from trident_common.sampling import coerce_sampling as coerce_sampling
from trident_common.sampling import parse_sampling as parse_sampling
from trident_common.tool_calls import ToolPlan, read_tools
from trident_common.trust import proves_abort, proves_generate

DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str | None  # text_input, or None when messages are given
    messages: list[dict[str, Any]] | None  # chat messages (the backend applies the template)
    stream: bool
    sampling: dict[str, Any] = field(default_factory=dict)  # engine-neutral names (vLLM's)
    max_tokens: int = DEFAULT_MAX_TOKENS
    exclude_input_in_output: bool = False
    request_id: str = ""
    priority: int = UNPROVEN_PRIORITY  # the tenant's tier (bls/tenants.py), if the router's
    cache_salt: str | None = None  # the tenant's prefix-cache salt
    lora_name: str | None = None  # a LoRA adapter of the model (None: the base model)
    # The outputs named by the client's return_* flags (None: it sent none of them).
    returns: frozenset[str] | None = None
    # Sent by the router (trust.py): only then is request_id registered for its aborts.
    proven: bool = False
    tools: list[dict[str, Any]] | None = None  # for the chat template (tool_calls.py)
    tool_plan: ToolPlan | None = None  # which calls to enforce or parse (None: none)


@dataclass(frozen=True)
class AbortRequest:
    """A control request from the router: abort the generation with this request id."""

    request_id: str


def first_scalar(value: Any) -> Any:
    """The single element of a Triton tensor value (numpy array or list), decoded."""
    if value is None:
        return None
    while hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
        if len(value) == 0:
            return None
        value = value[0]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("input is not valid UTF-8") from None
    if hasattr(value, "item"):
        return value.item()
    return value


def parse_generate(
    get: Callable[[str], Any],
    parameters: dict[str, Any] | None = None,
    proof_key: bytes | None = None,
) -> GenerateRequest | AbortRequest:
    """Inputs → GenerateRequest | AbortRequest; raises BadRequest.

    `parameters` are the request's Triton parameters: vllm_backend clients may send
    sampling values there instead of a sampling_parameters tensor, and the router its
    proof (trust.py), checked with `proof_key` (None: no caller is the router)."""
    abort_id = first_scalar(get(ABORT_REQUEST_ID))
    if abort_id:
        return _abort(str(abort_id), parameters, proof_key)
    prompt, messages, has_messages = _prompt(get)
    tools, tool_plan = read_tools(
        first_scalar(get("tools")), first_scalar(get("tool_choice")), has_messages
    )
    sampling_json = first_scalar(get("sampling_parameters"))
    if sampling_json is None:
        sampling = coerce_sampling(_sampling_from_parameters(parameters))
    else:
        sampling = coerce_sampling(parse_sampling(sampling_json))
    # vllm_backend's dialect: the adapter is named among the sampling values.
    lora_name = sampling.pop("lora_name", None) or None
    max_tokens = _max_tokens(first_scalar(get("max_tokens")), sampling)
    stream = bool(first_scalar(get("stream")) or False)
    exclude = first_scalar(get("exclude_input_in_output"))
    if stream and exclude is not None and not exclude:
        # as vllm_backend: a streamed response carries new text only, never the prompt
        raise BadRequest(
            "streaming with exclude_input_in_output=false is not supported: "
            "streamed responses carry only the new text"
        )
    request_id = str(first_scalar(get(REQUEST_ID)) or "")
    priority, cache_salt, proven = _router_values(get, parameters, proof_key, request_id)
    return GenerateRequest(
        prompt=prompt,
        messages=messages,
        stream=stream,
        sampling=sampling,
        max_tokens=max_tokens,
        exclude_input_in_output=bool(exclude or False),
        request_id=request_id,
        priority=priority,
        cache_salt=cache_salt,
        lora_name=lora_name,
        returns=_returns(get),
        proven=proven,
        tools=tools,
        tool_plan=tool_plan,
    )


def _abort(
    abort_id: str, parameters: dict[str, Any] | None, proof_key: bytes | None
) -> AbortRequest:
    if not proves_abort(proof_key, parameters, abort_id):
        # Anyone could end anyone's stream by its id: only the router may, for the ids
        # it sent. A client stops its own request by cancelling its stream.
        raise BadRequest(
            "abort_request_id is the router's own input (no valid router "
            "proof): cancel your stream to stop your request"
        )
    return AbortRequest(abort_id)


def _prompt(get: Callable[[str], Any]) -> tuple[str | None, list[dict[str, Any]] | None, bool]:
    """(text_input, messages, whether messages were given): exactly one of the two."""
    prompt = _text_input(get, "text_input")
    messages_value = get("messages")
    has_messages = bool(_elements(messages_value))
    if prompt is None and not has_messages:
        raise BadRequest("missing input: one of 'text_input' or 'messages' is required")
    if prompt is not None and has_messages:
        raise BadRequest("give either 'text_input' or 'messages', not both")
    if prompt == "":
        raise BadRequest("text_input is empty")
    messages = parse_messages(messages_value)[0] if has_messages else None
    return prompt, messages, has_messages


def _max_tokens(given: Any, sampling: dict[str, Any]) -> int:
    """The max_tokens input, else the sampling values' (vllm_backend's dialect), else the
    default; a positive integer. Taken out of `sampling` either way."""
    if given is None:
        given = sampling.pop("max_tokens", DEFAULT_MAX_TOKENS)
    else:
        sampling.pop("max_tokens", None)
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {_show(given)}")
    return given


def _router_values(
    get: Callable[[str], Any],
    parameters: dict[str, Any] | None,
    proof_key: bytes | None,
    request_id: str,
) -> tuple[int, str | None, bool]:
    """(priority, cache_salt, proven): the tenant values only the router may set. A
    request without the router's proof for exactly these values may not set them (a
    salt would read another tenant's prefix cache, a priority jump every tier's queue)
    and is scheduled at UNPROVEN_PRIORITY."""
    priority = first_scalar(get(PRIORITY))
    check_range(PRIORITY, priority)
    cache_salt = first_scalar(get(CACHE_SALT)) or None
    if proves_generate(proof_key, parameters, request_id, priority, cache_salt):
        return (0 if priority is None else int(priority)), cache_salt, True
    for name, value in ((CACHE_SALT, cache_salt), (PRIORITY, priority)):
        if value is not None:
            raise BadRequest(
                f"{name} is set by the router only (no valid router proof): "
                f"send the request to the router, or leave {name} out"
            )
    return UNPROVEN_PRIORITY, None, False


def _returns(get: Callable[[str], Any]) -> frozenset[str] | None:
    """The outputs a client asked for with vllm_backend's return_* flags; None when it
    sent no flag at all (then it gets trident's usual outputs)."""
    flags = {name: first_scalar(get(f"return_{name}")) for name in RETURNABLE}
    if all(value is None for value in flags.values()):
        return None
    return frozenset(name for name, value in flags.items() if value)


def check_adapter(name: str | None, held: Collection[str], model: str) -> str | None:
    """The adapter a request named, if this model holds it; BadRequest listing the
    model's adapters otherwise (None: the base model)."""
    if name is not None and name not in held:
        raise BadRequest(
            f"unknown adapter {name!r} (sampling_parameters.lora_name): "
            f"model {model} has adapters: {', '.join(sorted(held)) or 'none'}"
        )
    return name


def _text_input(get: Callable[[str], Any], name: str) -> str | None:
    value = first_scalar(get(name))
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string (BYTES tensor), got {type(value).__name__}")
    return value


def _sampling_from_parameters(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Sampling values sent as request parameters. Only known sampling names are taken:
    the same parameters also carry router hints and other per-request extras."""
    return {k: v for k, v in (parameters or {}).items() if k in SAMPLING_TYPES}


# -- chat messages ---------------------------------------------------------------------------
MESSAGES_SHAPE = "a JSON list of {role, content} objects (not empty), or one such object"


def parse_messages(value: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Chat messages from a `messages` input; the router and the engine models both
    check them here. Accepted, in the shapes clients send:
      - one JSON string holding the list of messages (the documented form);
      - one JSON string holding a single message object;
      - one JSON string per tensor element, each a message object.
    Every message is an object with a string `role` and a string `content`.
    Returns (messages, their JSON list when the input was in another shape, else None:
    the router forwards that, so an engine model gets the documented form). Raises
    BadRequest naming the problem."""
    items = [first_scalar(item) for item in _elements(value)]
    if not items or not all(isinstance(item, str) for item in items):
        raise BadRequest(f"messages must be a JSON string (BYTES tensor): {MESSAGES_SHAPE}")
    parsed = [_messages_json(item) for item in items]
    if len(parsed) == 1 and isinstance(parsed[0], list):
        messages, rewritten = parsed[0], None
    elif all(isinstance(item, dict) for item in parsed):
        messages = parsed
        rewritten = json.dumps(parsed)
    else:
        raise BadRequest(f"messages must be {MESSAGES_SHAPE}")
    if not messages:
        raise BadRequest(f"messages must be {MESSAGES_SHAPE}")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise BadRequest(f"messages[{i}] must be an object with string 'role' and 'content'")
    return messages, rewritten


def _elements(value: Any) -> list[Any]:
    """A tensor value (numpy array, nested lists, or one scalar) as a flat list."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _elements(part)]
    return [] if value is None else [value]


def _messages_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"messages is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("messages is nested too deeply") from None
