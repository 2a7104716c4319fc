"""OpenAI's HTTP protocol as plain Python: request JSON -> Generation, answers -> JSON.

Pure (no I/O, no Triton): the request checks name the parameter at fault the way
OpenAI does (`{"error": {"message", "type", "param", "code"}}`), sampling goes out under
vLLM's names (what trident's engine models read from `sampling_parameters`), and
routing hints come from the body (`extra_body`) or `X-Trident-*` headers.
"""
from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# Router inputs a request may set; the body wins over the header of the same name.
HINTS = ("route", "task", "family", "tenant", "tier", "conversation_id", "shared_prefix")
HINT_HEADER_PREFIX = "x-trident-"          # x-trident-route, x-trident-conversation-id ...
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# OpenAI fields with no equivalent here: refused with a 400 naming them, never ignored.
UNSUPPORTED = {
    "tools": "tool calling", "functions": "function calling", "audio": "audio output",
    "prediction": "predicted outputs", "suffix": "suffix (insertion)",
    "top_logprobs": "logprobs", "web_search_options": "web search",
}
# vLLM sampling extras that vLLM's own OpenAI server also takes from the body.
EXTRAS = {"top_k": "int", "min_p": "float", "repetition_penalty": "float",
          "min_tokens": "int", "ignore_eos": "bool", "stop_token_ids": "ints",
          "include_stop_str_in_output": "bool", "skip_special_tokens": "bool"}
FINISH_REASONS = {"stop": "stop", "eos": "stop", "stop_sequence": "stop", "end": "stop",
                  "length": "length", "max_tokens": "length",
                  "content_filter": "content_filter"}


class OpenAIError(Exception):
    """An answer in OpenAI's error shape with its HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(param: Optional[str], message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{model}' does not exist or is not ready",
                       "invalid_request_error", "model", "model_not_found")


@dataclass(frozen=True)
class Generation:
    """One request, ready to become Triton inputs."""

    kind: str                          # "chat" or "completion"
    model: str
    prompt: Optional[str] = None       # completions: text_input
    messages: Optional[list] = None    # chat: the messages tensor (the engine templates)
    stream: bool = False
    include_usage: bool = False
    max_tokens: Optional[int] = None   # None: the engine's default
    sampling: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)
    echo: bool = False                 # completions: the prompt before the answer


def parse_chat(body: Any, headers: Mapping[str, str] = {}) -> Generation:
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list of messages")
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "none"):
        raise invalid("tool_choice", "tool calling is not supported", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise invalid("response_format", "only response_format {\"type\": \"text\"} is "
                      "supported", "unsupported_parameter")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid("modalities", "only the text modality is supported",
                      "unsupported_parameter")
    if body.get("logprobs"):
        raise invalid("logprobs", "logprobs are not supported", "unsupported_parameter")
    max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"))
    return Generation("chat", _model(body), messages=[_message(m, i) for i, m in
                                                      enumerate(messages)],
                      max_tokens=max_tokens, **_common(body, headers))


def parse_completion(body: Any, headers: Mapping[str, str] = {}) -> Generation:
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid("prompt", "'prompt' must be a string (or a list of one string); "
                      "batches and token ids are not supported")
    if not prompt:
        raise invalid("prompt", "'prompt' is empty")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise invalid("best_of", "only best_of=1 is supported", "unsupported_parameter")
    if body.get("logprobs") not in (None, 0):
        raise invalid("logprobs", "logprobs are not supported", "unsupported_parameter")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise invalid("echo", "'echo' must be a boolean")
    return Generation("completion", _model(body), prompt=prompt,
                      max_tokens=_max_tokens(body, ("max_tokens",)), echo=echo,
                      **_common(body, headers))


# -- request parts --------------------------------------------------------------------------

def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    for name, what in UNSUPPORTED.items():
        if body.get(name) not in (None, [], False):
            raise invalid(name, f"{what} is not supported", "unsupported_parameter")
    return body


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' must name a model (see GET /v1/models)")
    return model


def _message(message: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(where, f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise invalid(f"{where}.role", f"{where}.role must be one of "
                      f"{', '.join(ROLES)}, got {_show(role)}")
    content = message.get("content")
    if content is None:
        raise invalid(f"{where}.content", f"{where} has no content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{j}]", f"{where}.content[{j}]: only "
                              "text parts ({\"type\": \"text\", \"text\": ...}) are supported")
            texts.append(part["text"])
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise invalid(f"{where}.content", f"{where}.content must be a string or a list "
                      "of text parts")
    return {"role": ROLES[role], "content": content}


def _common(body: dict, headers: Mapping[str, str]) -> dict:
    n = body.get("n", 1)
    if n != 1:
        raise invalid("n", f"only n=1 is supported (one choice per request), got {_show(n)}",
                      "unsupported_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream", "'stream' must be a boolean")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise invalid("stream_options", "'stream_options' is an object, only with "
                      "stream=true")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid("stream_options.include_usage", "'include_usage' must be a boolean")
    return {"stream": stream, "include_usage": include_usage,
            "sampling": sampling(body), "hints": hints(body, headers)}


def _max_tokens(body: dict, names: tuple) -> Optional[int]:
    for name in names:
        value = body.get(name)
        if value is not None:
            if not _is_int(value) or value < 1:
                raise invalid(name, f"'{name}' must be a positive integer, got {_show(value)}")
            return value
    return None


def sampling(body: dict) -> dict:
    """The request's sampling values under vLLM's names; raises OpenAIError naming one."""
    out = {}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0),
                            ("presence_penalty", -2.0, 2.0),
                            ("frequency_penalty", -2.0, 2.0)):
        value = body.get(name)
        if value is None:
            continue
        if not _is_number(value) or not low <= value <= high:
            raise invalid(name, f"'{name}' must be a number from {low:g} to {high:g}, "
                          f"got {_show(value)}")
        if name == "top_p" and value == 0:
            raise invalid(name, "'top_p' must be greater than 0")
        out[name] = float(value)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not -2**63 <= seed < 2**64:
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
                str(k).isdigit() and _is_number(v) and -100 <= v <= 100
                for k, v in bias.items()):
            raise invalid("logit_bias", "'logit_bias' maps token ids to numbers from -100 "
                          "to 100")
        out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    for name, kind in EXTRAS.items():
        value = body.get(name)
        if value is None:
            continue
        ok = {"int": _is_int(value), "float": _is_number(value),
              "bool": isinstance(value, bool),
              "ints": isinstance(value, list) and all(_is_int(v) for v in value)}[kind]
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


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _show(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- answers --------------------------------------------------------------------------------

def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def finish_reason(engine_reason: Optional[str]) -> Optional[str]:
    """The engine's finish reason in OpenAI's words (None while not finished)."""
    if not engine_reason:
        return None
    return FINISH_REASONS.get(engine_reason.lower(), "stop")


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens}


@dataclass
class Answer:
    """Builds the JSON of one request's answer (whole, or chunk by chunk)."""

    generation: Generation
    id: str = ""
    created: int = 0
    _template: Optional[tuple] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.id = self.id or new_id(self.generation.kind)
        self.created = self.created or int(time.time())

    @property
    def chat(self) -> bool:
        return self.generation.kind == "chat"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.generation.model}

    def whole(self, text: str, reason: Optional[str], tokens_in: int,
              tokens_out: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason(reason) or "stop"}
            out = self._head("chat.completion")
        else:
            if self.generation.echo:
                text = self.generation.prompt + text
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": finish_reason(reason) or "stop"}
            out = self._head("text_completion")
        out["choices"] = [choice]
        out["usage"] = usage(tokens_in, tokens_out)
        return out

    def chunk(self, text: Optional[str], reason: Optional[str] = None,
              first: bool = False) -> dict:
        """One streamed chunk: new text, or the finish reason (then text is None)."""
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason(reason)}
            out = self._head("chat.completion.chunk")
        else:
            if first and self.generation.echo:
                text = self.generation.prompt + (text or "")
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason(reason)}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if self.generation.include_usage:
            out["usage"] = None
        return out

    def text_chunk_json(self, text: str) -> str:
        """json.dumps(chunk(text)) from a template made once per answer: a streamed
        token then costs one string encode, not a dict tree built and encoded."""
        if self._template is None:
            mark = json.dumps("\0")      # a request's id and model never hold a NUL
            whole = json.dumps(self.chunk("\0"), ensure_ascii=False)
            self._template = tuple(whole.rsplit(mark, 1))   # the text is the last string
        head, tail = self._template
        return head + json.dumps(text, ensure_ascii=False) + tail

    def usage_chunk(self, tokens_in: int, tokens_out: int) -> dict:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = usage(tokens_in, tokens_out)
        return out


# -- Triton's errors ------------------------------------------------------------------------

CLIENT_FAULT = "invalid request: "     # trident_common.request.CLIENT_FAULT_PREFIX


def from_triton(message: str, model: str) -> OpenAIError:
    """A Triton error message as an OpenAI error: the engine's `invalid request: ...` is
    the client's fault (400), a tenant over its limit 429, an unknown model 404, an overloaded or unavailable
    backend 503, anything else a backend failure (500); the message says why."""
    text = message.strip()
    lowered = text.lower()
    if CLIENT_FAULT in text:
        reason = text[text.index(CLIENT_FAULT) + len(CLIENT_FAULT):]
        return OpenAIError(400, reason or text, "invalid_request_error", _param_of(reason),
                           "invalid_value")
    if "rate limit: " in lowered:   # the router's tenant limits (bls/tenants.py)
        return OpenAIError(429, f"{model}: {text}", "requests", None, "rate_limit_exceeded")
    if "unknown model" in lowered or ("model" in lowered and "is not found" in lowered):
        return model_not_found(model)
    if "overloaded" in lowered or "not ready" in lowered or "unavailable" in lowered \
            or "not healthy" in lowered or "is dead" in lowered:
        return OpenAIError(503, f"{model}: {text}", "server_error", None, "unavailable")
    return OpenAIError(500, f"{model}: {text}", "server_error", None, "backend_error")


def _param_of(reason: str) -> Optional[str]:
    """The parameter an engine's complaint starts with (`sampling_parameters.seed: ...`,
    `messages[0] must be ...`, `max_tokens must be ...`), in OpenAI's names."""
    named = re.search(r"sampling_parameters(?:\.|: )(\w+)", reason)
    if named:
        return named.group(1)
    match = re.match(r"[A-Za-z_][\w.\[\]]*", reason.strip())
    word = match.group(0).rstrip(".") if match else ""
    if word.startswith("sampling_parameters."):
        return word[len("sampling_parameters."):]
    if word.startswith("messages") or word in ("max_tokens", "stop", "seed"):
        return word
    return "prompt" if word == "text_input" else None
