"""The request side of trident's LLM tensor interface, as plain Python.

A backend hands `parse_generate` a function that returns an input tensor's value (or
None when absent); it gets back a GenerateRequest or a BadRequest naming the problem.
No Triton, no engine: the same code serves vLLM and SGLang and is unit-tested alone.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from trident_common.interface import RETURNABLE

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
    priority: int = 0                  # the tenant's tier (bls/tenants.py)
    cache_salt: Optional[str] = None   # the tenant's prefix-cache salt
    lora_name: Optional[str] = None    # a LoRA adapter of the model (None: the base model)
    # The outputs named by the client's return_* flags (None: it sent none of them).
    returns: Optional[frozenset] = None


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


def parse_generate(get: Callable[[str], Any], parameters: Optional[dict] = None):
    """Inputs → GenerateRequest | AbortRequest; raises BadRequest.

    `parameters` are the request's Triton parameters: vllm_backend clients may send
    sampling values there instead of a sampling_parameters tensor."""
    abort_id = first_scalar(get("abort_request_id"))
    if abort_id:
        return AbortRequest(str(abort_id))
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
    sampling_json = first_scalar(get("sampling_parameters"))
    if sampling_json is None:
        sampling = coerce_sampling(_sampling_from_parameters(parameters))
    else:
        sampling = coerce_sampling(parse_sampling(sampling_json))
    # vllm_backend's dialect: the adapter is named among the sampling values.
    lora_name = sampling.pop("lora_name", None) or None
    max_tokens = first_scalar(get("max_tokens"))
    if max_tokens is None:
        max_tokens = sampling.pop("max_tokens", DEFAULT_MAX_TOKENS)
    else:
        sampling.pop("max_tokens", None)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {_show(max_tokens)}")
    stream = bool(first_scalar(get("stream")) or False)
    exclude = first_scalar(get("exclude_input_in_output"))
    if stream and exclude is not None and not exclude:
        # as vllm_backend: a streamed response carries new text only, never the prompt
        raise BadRequest("streaming with exclude_input_in_output=false is not supported: "
                         "streamed responses carry only the new text")
    return GenerateRequest(
        prompt=prompt, messages=messages, stream=stream,
        sampling=sampling, max_tokens=max_tokens,
        exclude_input_in_output=bool(exclude or False),
        request_id=str(first_scalar(get("request_id")) or ""),
        priority=int(first_scalar(get("priority")) or 0),
        cache_salt=first_scalar(get("cache_salt")) or None,
        lora_name=lora_name, returns=_returns(get),
    )


def _returns(get: Callable[[str], Any]) -> Optional[frozenset]:
    """The outputs a client asked for with vllm_backend's return_* flags; None when it
    sent no flag at all (then it gets trident's usual outputs)."""
    flags = {name: first_scalar(get(f"return_{name}")) for name in RETURNABLE}
    if all(value is None for value in flags.values()):
        return None
    return frozenset(name for name, value in flags.items() if value)


def check_adapter(name: Optional[str], held, model: str) -> Optional[str]:
    """The adapter a request named, if this model holds it; BadRequest listing the
    model's adapters otherwise (None: the base model)."""
    if name is not None and name not in held:
        raise BadRequest(f"unknown adapter {name!r} (sampling_parameters.lora_name): "
                         f"model {model} has adapters: {', '.join(sorted(held)) or 'none'}")
    return name


def _text_input(get: Callable[[str], Any], name: str) -> Optional[str]:
    value = first_scalar(get(name))
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string (BYTES tensor), got {type(value).__name__}")
    return value


def parse_sampling(text: Any) -> dict:
    if not text:
        return {}
    if not isinstance(text, str):
        raise BadRequest("sampling_parameters must be a JSON string (BYTES tensor)")
    try:
        params = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"sampling_parameters is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("sampling_parameters is nested too deeply") from None
    if not isinstance(params, dict):
        raise BadRequest("sampling_parameters must be a JSON object")
    return params


def _sampling_from_parameters(parameters: Optional[dict]) -> dict:
    """Sampling values sent as request parameters. Only known sampling names are taken:
    the same parameters also carry router hints and other per-request extras."""
    return {k: v for k, v in (parameters or {}).items() if k in SAMPLING_TYPES}


# -- sampling values ----------------------------------------------------------------------
# The type of each sampling value a client may set, as vLLM's SamplingParams declares it
# (vllm 0.32), plus SGLang's structured-output names. Clients of vllm_backend send every
# value as a string ("temperature": "0"), so strings are converted; a value that does not
# convert is refused here, before it reaches an engine (a str seed kills vLLM's engine
# core input thread). JSON null means "the engine's default".
INT, FLOAT, BOOL = "an integer", "a number", "a boolean"
TEXTS = "a string or a list of strings"
TEXT_LIST = "a list of strings"
INT_LIST = "a list of integers"
BIAS = "an object of token id -> number"
OBJECT = "a JSON object"
TEXT = "a string"
TEXT_OR_OBJECT = "a string or a JSON object"

SAMPLING_TYPES = {
    "n": INT, "max_tokens": INT, "min_tokens": INT, "top_k": INT, "seed": INT,
    "logprobs": INT, "prompt_logprobs": INT,
    "temperature": FLOAT, "top_p": FLOAT, "min_p": FLOAT, "presence_penalty": FLOAT,
    "frequency_penalty": FLOAT, "repetition_penalty": FLOAT,
    "ignore_eos": BOOL, "skip_special_tokens": BOOL, "spaces_between_special_tokens": BOOL,
    "include_stop_str_in_output": BOOL,
    "stop": TEXTS, "bad_words": TEXT_LIST,
    "stop_token_ids": INT_LIST, "allowed_token_ids": INT_LIST,
    "logit_bias": BIAS,
    "structured_outputs": OBJECT, "extra_args": OBJECT,
    "json_schema": TEXT_OR_OBJECT, "regex": TEXT, "ebnf": TEXT,   # SGLang's names
    "lora_name": TEXT,   # not a SamplingParams field: parse_generate takes it out
}


def coerce_sampling(params: dict) -> dict:
    """Known sampling values converted to their declared types; unknown keys are kept
    for the engine's own check (which names them). Raises BadRequest naming the field."""
    out = {}
    for key, value in params.items():
        kind = SAMPLING_TYPES.get(key)
        if kind is None:
            out[key] = value
        elif value is not None:
            try:
                out[key] = _CONVERT[kind](value)
            except (TypeError, ValueError, OverflowError):
                raise BadRequest(f"sampling_parameters.{key}: expected {kind}, "
                                 f"got {_show(value)}") from None
    n = out.pop("n", 1)
    if n != 1:
        raise BadRequest(f"sampling_parameters.n: only n=1 is supported (one completion "
                         f"per request), got {n}")
    return out


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise TypeError


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise TypeError


def _container(value: Any, kind: type) -> Any:
    """A list or dict, also when sent as JSON text (the strings dialect)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError from None
    if not isinstance(value, kind):
        raise TypeError
    return value


def _to_texts(value: Any):
    if isinstance(value, str):
        return value
    return _to_text_list(value)


def _to_text_list(value: Any) -> list:
    items = _container(value, list)
    if not all(isinstance(item, str) for item in items):
        raise TypeError
    return items


def _to_int_list(value: Any) -> list:
    return [_to_int(item) for item in _container(value, list)]


def _to_bias(value: Any) -> dict:
    return {_to_int(k): _to_float(v) for k, v in _container(value, dict).items()}


def _to_text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _to_text_or_object(value: Any):
    if not isinstance(value, (str, dict)):
        raise TypeError
    return value


_CONVERT = {INT: _to_int, FLOAT: _to_float, BOOL: _to_bool, TEXTS: _to_texts,
            TEXT_LIST: _to_text_list, INT_LIST: _to_int_list, BIAS: _to_bias,
            OBJECT: lambda v: _container(v, dict), TEXT: _to_text,
            TEXT_OR_OBJECT: _to_text_or_object}


def _show(value: Any, limit: int = 40) -> str:
    """A value for an error message, cut short (a client may send 100 KB)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def describe(error: BaseException) -> str:
    """An exception as words, never empty: its message, else its type (and its cause's,
    for wrappers such as vLLM's EngineGenerateError that carry no message)."""
    message = str(error).strip()
    if message:
        return message
    cause = error.__cause__ or error.__context__
    if cause is not None and cause is not error and str(cause).strip():
        return f"{type(error).__name__} ({type(cause).__name__}: {str(cause).strip()})"
    if cause is not None and cause is not error:
        return f"{type(error).__name__} ({type(cause).__name__})"
    return type(error).__name__


# -- chat messages ---------------------------------------------------------------------------
MESSAGES_SHAPE = "a JSON list of {role, content} objects (not empty), or one such object"


def parse_messages(value: Any) -> tuple[list, Optional[str]]:
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
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise BadRequest(f"messages[{i}] must be an object with string 'role' and "
                             "'content'")
    return messages, rewritten


def _elements(value: Any) -> list:
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


def check_sampling_keys(params: dict, allowed, engine: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown sampling parameter(s) for {engine}: {', '.join(unknown)}")
