"""The sampling values a client may send: their types (vLLM's SamplingParams), the
conversion of vllm_backend's strings dialect, integer ranges, and the check of an
engine's names. Pure Python, shared by the vLLM and SGLang models (via request.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from trident_common.faults import BadRequest
from trident_common.faults import show as _show


def parse_sampling(text: Any) -> dict[str, Any]:
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
    "n": INT,
    "max_tokens": INT,
    "min_tokens": INT,
    "top_k": INT,
    "seed": INT,
    "logprobs": INT,
    "prompt_logprobs": INT,
    "temperature": FLOAT,
    "top_p": FLOAT,
    "min_p": FLOAT,
    "presence_penalty": FLOAT,
    "frequency_penalty": FLOAT,
    "repetition_penalty": FLOAT,
    "ignore_eos": BOOL,
    "skip_special_tokens": BOOL,
    "spaces_between_special_tokens": BOOL,
    "include_stop_str_in_output": BOOL,
    "stop": TEXTS,
    "bad_words": TEXT_LIST,
    "stop_token_ids": INT_LIST,
    "allowed_token_ids": INT_LIST,
    "logit_bias": BIAS,
    "structured_outputs": OBJECT,
    "extra_args": OBJECT,
    "json_schema": TEXT_OR_OBJECT,
    "regex": TEXT,
    "ebnf": TEXT,  # SGLang's names
    "lora_name": TEXT,  # not a SamplingParams field: parse_generate takes it out
}


# Every integer becomes an INT32 tensor (TRT-LLM's ensemble) or a C int in an engine: out
# of range, it would wrap (2**32 + 5 tokens → 5) or fail deep in the engine. The seed is
# 64 bits wide (vLLM's own bound; TRT-LLM's random_seed tensor is UINT64).
INT32, INT64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)


def check_range(name: str, value: Any, bounds: tuple[int, int] = INT32) -> None:
    """BadRequest naming `name` unless every integer in value (a number, or the items or
    keys of a list or object) is within bounds."""
    items = value if isinstance(value, (list, dict)) else (value,)
    for item in items:
        if isinstance(item, int) and not bounds[0] <= item <= bounds[1]:
            raise BadRequest(
                f"{name} is out of range: {_show(item)} (from {bounds[0]} to {bounds[1]})"
            )


def coerce_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """Known sampling values converted to their declared types; unknown keys are kept
    for the engine's own check (which names them). Raises BadRequest naming the field."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = SAMPLING_TYPES.get(key)
        if kind is None:
            out[key] = value
        elif value is not None:
            try:
                out[key] = _CONVERT[kind](value)
            except (TypeError, ValueError, OverflowError):
                raise BadRequest(
                    f"sampling_parameters.{key}: expected {kind}, got {_show(value)}"
                ) from None
            check_range(f"sampling_parameters.{key}", out[key], INT64 if key == "seed" else INT32)
    n = out.pop("n", 1)
    if n != 1:
        raise BadRequest(
            f"sampling_parameters.n: only n=1 is supported (one completion per request), got {n}"
        )
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


def _container(value: Any, kind: type[list[Any]] | type[dict[Any, Any]]) -> Any:
    """A list or dict, also when sent as JSON text (the strings dialect)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise ValueError from None
    if not isinstance(value, kind):
        raise TypeError
    return value


def _to_texts(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    return _to_text_list(value)


def _to_text_list(value: Any) -> list[str]:
    items: list[Any] = _container(value, list)
    if not all(isinstance(item, str) for item in items):
        raise TypeError
    return items


def _to_int_list(value: Any) -> list[int]:
    return [_to_int(item) for item in _container(value, list)]


def _to_bias(value: Any) -> dict[int, float]:
    return {_to_int(k): _to_float(v) for k, v in _container(value, dict).items()}


def _to_text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _to_text_or_object(value: Any) -> str | dict[str, Any]:
    if not isinstance(value, (str, dict)):
        raise TypeError
    return value


_CONVERT: dict[str, Callable[[Any], Any]] = {
    INT: _to_int,
    FLOAT: _to_float,
    BOOL: _to_bool,
    TEXTS: _to_texts,
    TEXT_LIST: _to_text_list,
    INT_LIST: _to_int_list,
    BIAS: _to_bias,
    OBJECT: lambda v: _container(v, dict),
    TEXT: _to_text,
    TEXT_OR_OBJECT: _to_text_or_object,
}


# The sampling values that name token ids: an id past the model's vocabulary is the
# client's error, named here (the engine's own check said it deep in generation, with
# no parameter, issue 34).
TOKEN_ID_FIELDS = ("logit_bias", "stop_token_ids", "allowed_token_ids")


def check_token_ids(params: dict[str, Any], vocabulary: int, model: str) -> None:
    """BadRequest tagged with the field unless every token id in it is in 0..vocabulary-1."""
    for name in TOKEN_ID_FIELDS:
        ids = params.get(name)
        if not ids:
            continue
        for token in ids:  # a list's items, or logit_bias's keys
            if isinstance(token, int) and not 0 <= token < vocabulary:
                raise BadRequest(
                    f"[{name}] sampling_parameters.{name}: token id {token} is not in the "
                    f"vocabulary of model {model} (ids 0 to {vocabulary - 1})"
                )


def check_sampling_keys(params: dict[str, Any], allowed: Iterable[str], engine: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown sampling parameter(s) for {engine}: {', '.join(unknown)}")
