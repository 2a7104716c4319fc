"""Errors in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`), and
Triton's error messages mapped onto them by trident's table of error classes. Pure: no
I/O (the table is read from its source file once, at import)."""

from __future__ import annotations

import re

from trident_common import error_classes as TABLE


class OpenAIError(Exception):
    """An answer in OpenAI's error shape with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code = param, code
        self.headers = headers  # sent with the answer (Retry-After)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(param: str | None, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param, code)


def client_closed() -> OpenAIError:
    """The client left before its whole answer was ready (nginx's 499: no one reads it)."""
    return OpenAIError(499, "the client closed the request", "invalid_request_error")


def no_finish_reason(model: str) -> OpenAIError:
    """The backend's stream ended without saying why: a backend fault, not the client's."""
    return OpenAIError(
        502,
        f"{model}: the stream ended without a finish reason",
        "server_error",
        None,
        "backend_error",
    )


def model_not_found(model: str) -> OpenAIError:
    """One answer for a model that is not exposed, not loaded or not a text model: the
    message never tells a client which of these it was (nor which models exist)."""
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or is not ready",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def too_large(what: str, limit: int, unit: str = "bytes") -> OpenAIError:
    return OpenAIError(
        413,
        f"{what} is larger than the limit of {limit} {unit}",
        "invalid_request_error",
        None,
        "request_too_large",
    )


# Triton's own words, not trident's: a model it does not know (unloaded since the
# frontend's index was read), and the request id Triton puts before a message.
TRITON_UNKNOWN_MODEL = "Request for unknown model"
_TRITON_REQUEST_ID = re.compile(r"\[request id: [^\]]*\] ")
# Parameters whose values the router's words explain with the deployment's own names
# (routes, backends, adapters): the frontend answers with the client's value only.
_OWN_WORDS = {
    "lora_name": lambda value, model: unknown_adapter(value, model),
    "route": lambda value, model: invalid("route", f"unknown route {value!r}", "route_not_found"),
}


def from_triton(message: str, model: str, asked: dict | None = None) -> OpenAIError:
    """A Triton error message as an OpenAI error, by the class its marker names
    (trident_common/error_classes.py): client error 400 naming the parameter, rate
    limit 429, overloaded and unavailable 503, anything else 500. `asked` holds what
    the client sent (lora_name, route), for a refusal that must not list the
    deployment's backends."""
    text = _TRITON_REQUEST_ID.sub("", message.strip(), count=1)
    if text.startswith(TRITON_UNKNOWN_MODEL):
        return model_not_found(model)
    parsed = TABLE.parse(text)
    error_class = parsed.error_class
    if error_class is TABLE.CLIENT:
        param = parsed.param or _param_of(parsed.reason)
        own = _OWN_WORDS.get(param) if param is not None else None
        value = (asked or {}).get(param)
        if own is not None and value is not None:
            return own(value, model)
        return OpenAIError(
            400, parsed.reason or text, error_class.openai_type, param, error_class.openai_code
        )
    return OpenAIError(
        error_class.status,
        f"{model}: {parsed.reason or text}",
        error_class.openai_type,
        None,
        error_class.openai_code,
    )


def unknown_adapter(name: str, model: str) -> OpenAIError:
    return invalid(
        "lora_name",
        f"unknown adapter '{name}': model '{model}' has no adapter of that name",
        "adapter_not_found",
    )


def server_draining(retry_after_s: int) -> OpenAIError:
    """New work while the server drains: 503, retry on another server."""
    draining = TABLE.DRAINING
    return OpenAIError(
        draining.status,
        "the server is draining (it is stopping or restarting) and takes no new "
        "requests: retry on another server",
        draining.openai_type,
        None,
        draining.openai_code,
        {"Retry-After": str(retry_after_s)},
    )


def server_shutdown() -> OpenAIError:
    """An answer the drain's timeout ended before it was done."""
    shutdown = TABLE.SHUTDOWN
    return OpenAIError(
        shutdown.status,
        "the server is stopping: the drain timeout ended this answer before it was done",
        shutdown.openai_type,
        None,
        shutdown.openai_code,
    )


def model_died(model: str) -> OpenAIError:
    """An answer lost with the process of the model that made it (`trident serve`'s
    keeper saw the stub die and reloads it): 503, the request may be sent again."""
    unavailable = TABLE.UNAVAILABLE
    return OpenAIError(
        unavailable.status,
        f"{model}: the model's process died while answering (it is being restarted): "
        "send the request again",
        unavailable.openai_type,
        None,
        unavailable.openai_code,
    )


def _param_of(reason: str) -> str | None:
    """For a client error without a `[param]` tag: the parameter an engine's complaint
    starts with (`sampling_parameters.seed: ...`, `messages[0] must be ...`,
    `max_tokens must be ...`), in OpenAI's names."""
    named = re.search(r"sampling_parameters(?:\.|: )(\w+)", reason)
    if named:
        return named.group(1)
    match = re.match(r"[A-Za-z_][\w.\[\]]*", reason.strip())
    word = match.group(0).rstrip(".") if match else ""
    if word.startswith("sampling_parameters."):
        return word[len("sampling_parameters.") :]
    if word.startswith("messages") or word in ("max_tokens", "stop", "seed"):
        return word
    return "prompt" if word == "text_input" else None
