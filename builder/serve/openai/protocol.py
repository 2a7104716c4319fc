"""OpenAI's HTTP requests as plain Python: request JSON -> a Generation.

Pure (no I/O, no Triton): the request checks name the parameter at fault the way
OpenAI does (`{"error": {"message", "type", "param", "code"}}`), sampling goes out under
vLLM's names (what trident's engine models read from `sampling_parameters`), and
routing hints come from the body (`extra_body`) or `X-Trident-*` headers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.serve.openai import tools as chat_tools
from builder.serve.openai.errors import invalid
from builder.serve.openai.limits import INT32_MAX, Limits
from builder.serve.openai.structured import response_format
from trident_common import interface as _INTERFACE

DEFAULT_LIMITS = Limits()

# Router inputs a request may set; the body wins over the header of the same name.
HINTS: tuple[str, ...] = tuple(_INTERFACE.HINT_NAMES)
# The engine's tenant inputs (priority, cache_salt): the router sets them from the spec's
# tenants, never from a request, so a body field of these names is refused (not dropped).
TENANT_ONLY: tuple[str, ...] = tuple(tensor.name for tensor in _INTERFACE.TENANT_INPUTS)
HINT_HEADER_PREFIX = "x-trident-"  # x-trident-route, x-trident-conversation-id ...
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}

# OpenAI fields with no equivalent here: refused with a 400 naming them, never ignored.
UNSUPPORTED = {
    "functions": "function calling (use tools)",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
    "suffix": "suffix (text to insert before: the engines only continue a prompt, "
    "they do not fill in between a prefix and a suffix)",
}
# How many choices (n) one request may ask for: each is one generation in the engine
# (fan-out, answers.py), so n multiplies the work a request costs.
MAX_N = 16
# OpenAI's bounds: top_logprobs (chat) 0..20, logprobs (completions) 0..5.
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5
# vLLM sampling extras that vLLM's own OpenAI server also takes from the body.
EXTRAS = {
    "top_k": "int",
    "min_p": "float",
    "repetition_penalty": "float",
    "min_tokens": "int",
    "ignore_eos": "bool",
    "stop_token_ids": "ints",
    "include_stop_str_in_output": "bool",
    "skip_special_tokens": "bool",
}
# OpenAI's request fields, per endpoint, as the API reference and the openai SDK's
# create() send them (openai/types/chat/completion_create_params.py and
# openai/types/completion_create_params.py; tests/serve/test_openai_protocol.py checks
# that the installed SDK sends none missing here). Those in UNSUPPORTED are refused by
# name; OpenAI's own bookkeeping and features without an engine counterpart here
# (metadata, store, service_tier, prompt_cache_*, safety_identifier, moderation,
# reasoning_effort, verbosity, function_call without functions) are taken and not
# acted on.
_BOTH_ENDPOINTS = frozenset(
    {
        "model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p",
        "presence_penalty", "frequency_penalty", "seed", "stop", "logit_bias", "logprobs",
        "user",
    }
)  # fmt: skip
OPENAI_FIELDS = {
    "chat": _BOTH_ENDPOINTS
    | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "modalities", "functions",
        "function_call", "audio", "prediction", "web_search_options", "metadata", "store",
        "service_tier", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
        "safety_identifier", "moderation", "reasoning_effort", "verbosity",
    },
    "completion": _BOTH_ENDPOINTS | {"prompt", "echo", "best_of", "suffix"},
}  # fmt: skip
# trident's extensions, on both endpoints (`extra_body`): the adapter, vLLM's sampling
# extras and the router's hints.
EXTENSIONS = frozenset({"lora_name", *EXTRAS, *HINTS})
# Every body field an endpoint knows; any other is a 400 `unknown_parameter` naming it.
# TENANT_ONLY are known in order to be refused with their reason.
KNOWN_FIELDS = {
    kind: fields | EXTENSIONS | frozenset(TENANT_ONLY) for kind, fields in OPENAI_FIELDS.items()
}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# A LoRA adapter's name (trident's spec allows letters, digits, `_`, `-`, `.`).
ADAPTER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True)
class Generation:
    """One request, ready to become Triton inputs."""

    kind: str  # "chat" or "completion"
    model: str
    prompt: str | None = None  # completions: text_input
    messages: list | None = None  # chat: the messages tensor (the engine templates)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the engine's default
    sampling: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)
    echo: bool = False  # completions: the prompt before the answer
    max_tokens_param: str = "max_tokens"  # the field max_tokens came from (for errors)
    lora_name: str | None = None  # the adapter the client named (None: base model)
    tools: list | None = None  # chat: OpenAI's tools (tools.py)
    tool_choice: str | None = None  # none / auto / required / a function's name
    n: int = 1  # choices asked for (each a generation of its own)
    # One of the n choices: (the fan-out's group id, this choice's index), which a router
    # with tenants reads to admit the n together (choices.py); None for the request itself.
    choice: tuple[str, int] | None = None
    # Logprobs asked for: how many alternatives per token beside the sampled one (chat's
    # top_logprobs, completions' logprobs); None: no logprobs.
    logprobs: int | None = None


def parse_chat(
    body: Any, headers: Mapping[str, str] = {}, limits: Limits = DEFAULT_LIMITS
) -> Generation:
    body = _object(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list of messages")
    if len(messages) > limits.max_messages:
        raise invalid(
            "messages",
            f"'messages' holds {len(messages)} messages, more than "
            f"the limit of {limits.max_messages}",
            "too_many_messages",
        )
    tools, tool_choice = chat_tools.parse(body)
    structured = response_format(body)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid("modalities", "only the text modality is supported", "unsupported_parameter")
    common = _common(body, headers)
    if structured is not None:  # response_format, under vLLM's name (structured.py)
        common["sampling"] = {**common["sampling"], "structured_outputs": structured}
    return Generation(
        "chat",
        _model(body),
        messages=[_message(m, i, limits.max_message_chars) for i, m in enumerate(messages)],
        logprobs=_chat_logprobs(body),
        tools=tools,
        tool_choice=tool_choice,
        **_max_tokens(body, ("max_completion_tokens", "max_tokens")),
        **common,
    )


def parse_completion(
    body: Any, headers: Mapping[str, str] = {}, limits: Limits = DEFAULT_LIMITS
) -> Generation:
    body = _object(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid(
            "prompt",
            "'prompt' must be a string (or a list of one string); "
            "batches and token ids are not supported",
        )
    if not prompt:
        raise invalid("prompt", "'prompt' is empty")
    if len(prompt) > limits.max_message_chars:
        raise _too_long("prompt", len(prompt), limits.max_message_chars)
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise invalid("best_of", "only best_of=1 is supported", "unsupported_parameter")
    logprobs = body.get("logprobs")
    if logprobs is not None and (
        not _is_int(logprobs) or not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS
    ):
        raise invalid(
            "logprobs",
            "'logprobs' must be an integer from 0 to "
            f"{MAX_COMPLETION_LOGPROBS}, got {_show(logprobs)}",
        )
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise invalid("echo", "'echo' must be a boolean")
    if echo and logprobs is not None:
        # OpenAI's echo with logprobs scores the prompt's tokens too; the engine models
        # return the logprobs of generated tokens only.
        raise invalid(
            "echo",
            "'echo' with 'logprobs' is not supported: the engines "
            "return logprobs for generated tokens only, not for the prompt",
            "unsupported_parameter",
        )
    return Generation(
        "completion",
        _model(body),
        prompt=prompt,
        echo=echo,
        logprobs=logprobs,
        **_max_tokens(body, ("max_tokens",)),
        **_common(body, headers),
    )


# -- request parts --------------------------------------------------------------------------


def _object(body: Any, kind: str) -> dict:
    """The body, once it is an object of fields this endpoint knows: an unknown field,
    an unsupported one or a tenant input is a 400 naming it, never ignored."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    for name, what in UNSUPPORTED.items():
        if body.get(name) not in (None, [], False):
            raise invalid(name, f"{what} is not supported", "unsupported_parameter")
    for name in TENANT_ONLY:
        if name in body:
            raise invalid(
                name,
                f"'{name}' is set by the router from the tenant (the spec's tenants), "
                "never by a request",
                "unsupported_parameter",
            )
    unknown = [name for name in body if name not in KNOWN_FIELDS[kind]]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise invalid(
            _bounded(unknown[0]),
            f"unknown parameter {_show(unknown[0], 80)}{more}: {PATHS[kind]} takes "
            "OpenAI's parameters and trident's extensions (docs/openai.md, Parameters)",
            "unknown_parameter",
        )
    return body


def _bounded(name: str, limit: int = 100) -> str:
    """A client's field name as `param`, cut to a length fit to send back."""
    return name if len(name) <= limit else name[:limit] + "..."


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' must name a model (see GET /v1/models)")
    return model


def _message(message: Any, i: int, max_chars: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(where, f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(
            f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, got {_show(role)}"
        )
    history = chat_tools.history(message, where)  # earlier calls and their results
    content = message.get("content")
    if content is None and "tool_calls" in history:
        content = ""  # an assistant turn that only called tools
    if content is None:
        raise invalid(f"{where}.content", f"{where} has no content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid(
                    f"{where}.content[{j}]",
                    f"{where}.content[{j}]: only "
                    'text parts ({"type": "text", "text": ...}) are supported',
                )
            texts.append(part["text"])
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise invalid(
            f"{where}.content", f"{where}.content must be a string or a list of text parts"
        )
    if len(content) > max_chars:
        raise _too_long(f"{where}.content", len(content), max_chars)
    return {"role": ROLES[role], "content": content, **history}


def _chat_logprobs(body: dict) -> int | None:
    """Chat's logprobs (a boolean) and top_logprobs (alternatives per token) as one
    number: the alternatives wanted, or None for no logprobs."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise invalid("logprobs", f"'logprobs' must be a boolean, got {_show(wanted)}")
    if top is None:
        return 0 if wanted else None
    if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise invalid(
            "top_logprobs",
            f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {_show(top)}",
        )
    if not wanted:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return top


def _common(body: dict, headers: Mapping[str, str]) -> dict:
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise invalid("n", f"'n' must be an integer from 1 to {MAX_N}, got {_show(n)}")
    # `user` identifies the end user to OpenAI's abuse monitoring; here it is checked
    # and then ignored: it is no tenant (API keys name those, keys.py) and no routing
    # hint, and it is not logged (it may be personal data).
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("user", f"'user' must be a string, got {_show(user)}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream", "'stream' must be a boolean")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise invalid("stream_options", "'stream_options' is an object, only with stream=true")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid("stream_options.include_usage", "'include_usage' must be a boolean")
    return {
        "stream": stream,
        "include_usage": include_usage,
        "n": n,
        "sampling": sampling(body),
        "hints": hints(body, headers),
        "lora_name": _lora_name(body),
    }


def _too_long(param: str, size: int, limit: int):
    return invalid(
        param, f"{param} is {size} characters, more than the limit of {limit}", "too_long"
    )


def _max_tokens(body: dict, names: tuple) -> dict:
    """max_tokens and the field it came from (the first of `names` given). It becomes an
    INT32 tensor: a larger value is refused here, never wrapped (2**32+5 would be 5
    tokens). Every one given is checked, the one that loses too: a bad value is a
    mistake to name, not to ignore."""
    found: dict = {}
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or not 1 <= value <= INT32_MAX:
            raise invalid(
                name, f"'{name}' must be an integer from 1 to {INT32_MAX}, got {_show(value)}"
            )
        found = found or {"max_tokens": value, "max_tokens_param": name}
    return found


def _lora_name(body: dict) -> str | None:
    """The adapter named by `lora_name` (extra_body), as vllm_backend's clients name it."""
    name = body.get("lora_name")
    if name is None:
        return None
    if not isinstance(name, str) or not name or len(name) > 128 or not set(name) <= ADAPTER_CHARS:
        raise invalid(
            "lora_name",
            f"'lora_name' must name an adapter (letters, digits, '_', '-', '.'), got {_show(name)}",
        )
    return name


def sampling(body: dict) -> dict:
    """The request's sampling values under vLLM's names; raises OpenAIError naming one."""
    out: dict[str, Any] = {}
    for name, low, high in (
        ("temperature", 0.0, 2.0),
        ("top_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
    ):
        value = body.get(name)
        if value is None:
            continue
        if not _is_number(value) or not low <= value <= high:
            raise invalid(
                name, f"'{name}' must be a number from {low:g} to {high:g}, got {_show(value)}"
            )
        if name == "top_p" and value == 0:
            raise invalid(name, "'top_p' must be greater than 0")
        out[name] = float(value)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not -(2**63) <= seed < 2**64:
            raise invalid("seed", f"'seed' must be an integer, got {_show(seed)}")
        out["seed"] = seed
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        if stop:
            out["stop"] = stop
    elif stop is not None:
        raise invalid("stop", "'stop' must be a string or a list of non-empty strings")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(
            _is_token_id(k) and _is_number(v) and -100 <= v <= 100 for k, v in bias.items()
        ):
            raise invalid("logit_bias", "'logit_bias' maps token ids to numbers from -100 to 100")
        out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    for name, kind in EXTRAS.items():
        value = body.get(name)
        if value is None:
            continue
        ok = {
            "int": _is_int(value),
            "float": _is_number(value),
            "bool": isinstance(value, bool),
            "ints": isinstance(value, list) and all(_is_int(v) for v in value),
        }[kind]
        if not ok:
            raise invalid(name, f"'{name}' has the wrong type: {_show(value)}")
        out[name] = value
    return out


def hints(body: dict, headers: Mapping[str, str]) -> dict:
    """Routing hints: extra_body fields first, then X-Trident-<Name> headers."""
    lowered = {k.lower(): v for k, v in headers.items()}
    out = {}
    for name in HINTS:
        value = body.get(name)
        if value is None:
            value = lowered.get(HINT_HEADER_PREFIX + name.replace("_", "-"))
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise invalid(name, f"'{name}' must be a non-empty string")
        out[name] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_id(key: Any) -> bool:
    """A logit_bias key: ASCII digits (str.isdigit alone takes '²', which int() refuses)."""
    return isinstance(key, str) and key.isascii() and key.isdigit()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _show(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
