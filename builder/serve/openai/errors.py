"""Errors in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`), and
Triton's error messages mapped onto them. Pure: no I/O."""
from __future__ import annotations

import re


class OpenAIError(Exception):
    """An answer in OpenAI's error shape with its HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(param: str | None, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str) -> OpenAIError:
    """One answer for a model that is not exposed, not loaded or not a text model: the
    message never tells a client which of these it was (nor which models exist)."""
    return OpenAIError(404, f"The model '{model}' does not exist or is not ready",
                       "invalid_request_error", "model", "model_not_found")


def too_large(what: str, limit: int, unit: str = "bytes") -> OpenAIError:
    return OpenAIError(413, f"{what} is larger than the limit of {limit} {unit}",
                       "invalid_request_error", None, "request_too_large")


CLIENT_FAULT = "invalid request: "     # trident_common.request.CLIENT_FAULT_PREFIX
# The router's refusals of an adapter (bls/policy.py UnknownAdapter): "unknown adapter 'x':
# no backend holds it ...", "route 'r' has no backend holding adapter 'x' ...".
_ADAPTER_REFUSAL = re.compile(r"(?:unknown adapter|no backend holding adapter) '([^']*)'")


def from_triton(message: str, model: str) -> OpenAIError:
    """A Triton error message as an OpenAI error: the engine's `invalid request: ...` is
    the client's fault (400), an adapter nobody holds too (400, naming only the adapter:
    the router's own message lists backends, which the frontend does not expose), a
    tenant over its limit 429, an unknown model 404, an overloaded or unavailable
    backend 503, anything else a backend failure (500); the message says why."""
    text = message.strip()
    lowered = text.lower()
    adapter = _ADAPTER_REFUSAL.search(text)
    if adapter:
        return unknown_adapter(adapter.group(1), model)
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


def unknown_adapter(name: str, model: str) -> OpenAIError:
    return invalid("lora_name", f"unknown adapter '{name}': model '{model}' has no adapter "
                   "of that name", "adapter_not_found")


def _param_of(reason: str) -> str | None:
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
