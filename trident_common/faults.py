"""A request's failure in words: the client's fault (BadRequest, whose message the
engine models send with CLIENT_FAULT_PREFIX) or an engine's (describe), and values shown
cut short. Shared by the request and sampling checks, the engine models and the router.
The classes of errors and how each travels are in error_classes.py."""

from __future__ import annotations

from typing import Any

from trident_common.error_classes import CLIENT

# Error messages of requests that are wrong (not the engine) start with this: the client
# error class's marker (error_classes.py says why a marker and not the code alone).
CLIENT_FAULT_PREFIX = CLIENT.marker


class BadRequest(ValueError):
    """The client's request is malformed; the message is sent back as the error.
    `param` names the request field at fault where one is (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def marked(self) -> str:
        """The message as it travels: the client error marker, and `[param] `."""
        return CLIENT.mark(str(self), self.param)


def show(value: Any, limit: int = 40) -> str:
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
