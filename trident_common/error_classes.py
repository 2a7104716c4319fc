"""The runtime error classes, one table for the engine models, the router and the OpenAI
frontend: what each class means, its OpenAI status and error fields, its Triton error
code, and the marker that carries it inside an error message. Pure: no Triton import
(the frontend imports this outside the stub).

Why a marker in the message and not the Triton code alone: the router is decoupled, so
its clients reach it over a gRPC *stream*, and a stream's error is `error_message` only
(ModelStreamInferResponse has no status field); a BLS caller gets a backend's error as
a message too (Triton 2.51). The code is still set, for Triton's HTTP endpoints (which
turn it into the HTTP status) and for BLS callers that read it.

A message of a class starts with the class's marker, then, for a client error that
names the parameter, `[param] `: `invalid request: [route] unknown route 'x' ...`.
Only the start of a message is read; a message without a marker is internal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the types only: this module is imported outside the stub too
    import triton_python_backend_utils


@dataclass(frozen=True)
class ErrorClass:
    name: str  # also the metrics word
    marker: str  # an error message of this class starts with it ("" for none)
    status: int  # the HTTP status an OpenAI client gets
    openai_type: str  # OpenAI's error.type
    openai_code: str  # OpenAI's error.code
    triton_code: str  # the pb_utils.TritonError code's name (python_backend r24.10)

    def mark(self, message: str, param: str | None = None) -> str:
        """The message as this class sends it (a marker already there is kept)."""
        found = parse(message)
        if found.error_class is self and (param is None or found.param == param):
            return message
        tag = f"[{param}] " if param and self.marker else ""
        return f"{self.marker}{tag}{message}"


# The request is wrong: answering it elsewhere would fail the same way, and it is not
# the backend's failure (the router neither retries it nor counts it in a breaker).
CLIENT = ErrorClass(
    "client_error",
    "invalid request: ",
    400,
    "invalid_request_error",
    "invalid_value",
    "INVALID_ARG",
)
# The request names a tenant it may not (not listed, under `unknown: reject`): permanent,
# so not the 429 of a limit, which clients retry (the openai SDK does, twice by default).
# python_backend r24.10 has no PERMISSION_DENIED; INVALID_ARG is the nearest it carries.
FORBIDDEN = ErrorClass(
    "forbidden", "forbidden: ", 403, "invalid_request_error", "permission_denied", "INVALID_ARG"
)
# The tenant is over a limit the spec sets (bls/tenants.py). python_backend r24.10's
# TritonError has no RESOURCE_EXHAUSTED; UNAVAILABLE is what Triton's own queue limit
# answers with, and its HTTP endpoint turns it into 503.
RATE_LIMIT = ErrorClass(
    "rate_limit", "rate limit: ", 429, "requests", "rate_limit_exceeded", "UNAVAILABLE"
)
# Every backend that could answer is at its in-flight limit: retry later. 503, as
# OpenAI's "engine is currently overloaded" (429 is for a caller's own limits: this is
# the server's capacity, not something the client did).
OVERLOADED = ErrorClass(
    "overloaded", "overloaded: ", 503, "server_error", "overloaded", "UNAVAILABLE"
)
# No backend can take it at all (breakers open, not loaded, engine dead).
UNAVAILABLE = ErrorClass(
    "unavailable", "unavailable: ", 503, "server_error", "unavailable", "UNAVAILABLE"
)
# The server is draining (a SIGTERM, a rolling restart): it takes no new request, the
# ones in flight finish. Retry on another server (the frontend adds Retry-After).
DRAINING = ErrorClass(
    "draining", "draining: ", 503, "server_error", "server_draining", "UNAVAILABLE"
)
# The drain's timeout ended this answer before it was done: the server is stopping.
# Final: no fallback, the backends are stopping too.
SHUTDOWN = ErrorClass(
    "shutdown", "server shutdown: ", 503, "server_error", "server_shutdown", "UNAVAILABLE"
)
# Anything else: an engine failed or crashed, a defect. The default of an unmarked
# message, so an unforeseen error is never blamed on the client.
INTERNAL = ErrorClass("internal", "", 500, "server_error", "backend_error", "INTERNAL")

CLASSES = (CLIENT, FORBIDDEN, RATE_LIMIT, OVERLOADED, UNAVAILABLE, DRAINING, SHUTDOWN, INTERNAL)
BY_NAME = {c.name: c for c in CLASSES}
MARKED = tuple(c for c in CLASSES if c.marker)

# `[param] ` right after a client error's marker: a name as OpenAI's `param` spells it
# (`max_tokens`, `messages[0].content`, `route`).
_PARAM = re.compile(r"\[([A-Za-z_][\w.]*(?:\[\d+\][\w.]*)*)\] ")


@dataclass(frozen=True)
class Parsed:
    error_class: ErrorClass
    param: str | None
    reason: str  # the message without its marker and tag


def parse(message: str) -> Parsed:
    """A received error message's class, parameter and words, from its start only."""
    text = message or ""
    for error_class in MARKED:
        if text.startswith(error_class.marker):
            rest = text[len(error_class.marker) :]
            tag = _PARAM.match(rest) if error_class is CLIENT else None
            if tag:
                return Parsed(error_class, tag.group(1), rest[tag.end() :])
            return Parsed(error_class, None, rest)
    return Parsed(INTERNAL, None, text)


def classify(message: str) -> ErrorClass:
    return parse(message).error_class


def triton_error(
    pb_utils: ModuleType,
    message: str,
    error_class: ErrorClass | None = None,
    param: str | None = None,
) -> triton_python_backend_utils.TritonError:
    """A pb_utils.TritonError for `message`: marked with `error_class` (or the class its
    marker says) and carrying that class's Triton code. pb_utils is passed in: this
    module must import outside the stub."""
    error_class = error_class or classify(message)
    code = getattr(pb_utils.TritonError, error_class.triton_code)
    error: triton_python_backend_utils.TritonError = pb_utils.TritonError(
        error_class.mark(message, param), code
    )
    return error
