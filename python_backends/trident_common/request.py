"""The request side of trident's LLM tensor interface, as plain Python.

A backend hands `parse_generate` a function that returns an input tensor's value (or
None when absent); it gets back a GenerateRequest or a BadRequest naming the problem.
No Triton, no engine: the same code serves vLLM and SGLang and is unit-tested alone.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

DEFAULT_MAX_TOKENS = 128
# Error messages of requests that are wrong (not the engine) start with this. Triton 2.51's
# BLS keeps only the message of a backend's error, not its INVALID_ARG code, so this is
# how the router tells a bad request (answer it) from a failing backend (fall back).
CLIENT_FAULT_PREFIX = "invalid request: "


class BadRequest(ValueError):
    """The client's request is malformed; the message is sent back as the error."""


@dataclass(frozen=True)
class GenerateRequest:
    prompt: Optional[str]              # text_input, or None when messages are given
    messages: Optional[list]           # chat messages (the backend applies the template)
    stream: bool
    sampling: dict = field(default_factory=dict)   # engine-neutral names (vLLM's)
    max_tokens: int = DEFAULT_MAX_TOKENS
    exclude_input_in_output: bool = False
    request_id: str = ""


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


def parse_generate(get: Callable[[str], Any]):
    """Inputs → GenerateRequest | AbortRequest; raises BadRequest."""
    abort_id = first_scalar(get("abort_request_id"))
    if abort_id:
        return AbortRequest(str(abort_id))
    prompt = first_scalar(get("text_input"))
    messages_json = first_scalar(get("messages"))
    if prompt is None and messages_json is None:
        raise BadRequest("missing input: one of 'text_input' or 'messages' is required")
    if prompt is not None and messages_json is not None:
        raise BadRequest("give either 'text_input' or 'messages', not both")
    messages = _parse_messages(messages_json) if messages_json is not None else None
    sampling = parse_sampling(first_scalar(get("sampling_parameters")))
    max_tokens = first_scalar(get("max_tokens"))
    if max_tokens is None:
        max_tokens = sampling.pop("max_tokens", DEFAULT_MAX_TOKENS)
    else:
        sampling.pop("max_tokens", None)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
    return GenerateRequest(
        prompt=prompt, messages=messages,
        stream=bool(first_scalar(get("stream")) or False),
        sampling=sampling, max_tokens=max_tokens,
        exclude_input_in_output=bool(first_scalar(get("exclude_input_in_output")) or False),
        request_id=str(first_scalar(get("request_id")) or ""),
    )


def parse_sampling(text: Optional[str]) -> dict:
    if not text:
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"sampling_parameters is not valid JSON: {e}") from None
    if not isinstance(params, dict):
        raise BadRequest("sampling_parameters must be a JSON object")
    return params


def _parse_messages(text: str) -> list:
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"messages is not valid JSON: {e}") from None
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty JSON list of {role, content} objects")
    for i, message in enumerate(messages):
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise BadRequest(f"messages[{i}] must be an object with string 'role' and "
                             "'content'")
    return messages


def check_sampling_keys(params: dict, allowed, engine: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown sampling parameter(s) for {engine}: {', '.join(unknown)}")
