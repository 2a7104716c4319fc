"""How large and how deep a request may be, checked before the frontend spends memory or
a model's time on it. Pure: no I/O.

A body is refused by its Content-Length before a byte of it is read, and a chunked body
as soon as it passes the limit (app.py reads it in pieces), so a client cannot make the
frontend hold more than `max_body_bytes` per request. The parsed JSON is then bounded in
depth, messages, the size of one message or prompt, and `max_tokens` (an INT32 tensor,
and no more than the model's context length where the frontend knows it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.serve.openai.errors import OpenAIError, invalid, too_large

INT32_MAX = 2**31 - 1  # max_tokens travels as an INT32 tensor


@dataclass(frozen=True)
class Limits:
    # 4 MiB holds a 128k-token prompt even as JSON \u escapes; the largest here is 2k.
    max_body_bytes: int = 4 * 2**20
    max_messages: int = 1024
    max_message_chars: int = 2**20  # one message's content, or a completion prompt
    max_depth: int = 16  # JSON nesting (a chat request needs 5)
    # A connection's bounds before its request reaches the app (guard.py): open
    # connections at once (a GPU node's 256-1024 streams, with room), the request line
    # and headers (browsers and SDKs send under 8 KiB; nginx allows 32 KiB), and how long
    # the headers and then the body may take to arrive.
    max_connections: int = 4096
    max_header_bytes: int = 64 * 2**10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # model -> its context length in tokens, where known: max_tokens above it is a 400
    context_tokens: Mapping[str, int] = field(default_factory=dict)


def declared_length(headers: Mapping[str, str], limits: Limits) -> int | None:
    """The body's Content-Length (None: not given, e.g. chunked); 413 above the limit,
    400 for a value that is not a length."""
    value = headers.get("content-length")
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 20:
        raise invalid(None, "the Content-Length header is not a length", "invalid_header")
    length = int(value)
    if length > limits.max_body_bytes:
        raise too_large("the request body", limits.max_body_bytes)
    return length


def check_body_json(value: Any, limit: int) -> None:
    """400 when the JSON nests deeper than `limit` (arrays and objects), or holds a string
    that is not text: a lone UTF-16 surrogate (`"\\ud800"` is valid JSON, but no UTF-8,
    so the engine's tokenizer failed on it with a 500 of its own words). Iterative, so
    no depth the parser accepted can overflow a stack here."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    raise invalid(
                        None, f"the request body nests deeper than {limit} levels", "invalid_json"
                    )
                stack.append((child, depth + 1))
            elif isinstance(child, str) and not child.isascii() and not _is_text(child):
                where = _path_of(value, child)
                raise invalid(
                    where,
                    f"'{where}' holds a lone UTF-16 surrogate, which is not text",
                    "invalid_value",
                )


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path_of(value: Any, target: str) -> str:
    """Where `target` (a string found in `value`) is, as OpenAI names a param:
    `messages[0].content`."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if item is target:
            return path
        if isinstance(item, dict):
            stack += [(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(v, f"{path}[{i}]") for i, v in enumerate(item)]
    return ""


def check_max_tokens(value: int | None, param: str, model: str, limits: Limits) -> None:
    """400 naming `param` when max_tokens is more than the model's context length."""
    context = limits.context_tokens.get(model)
    if value is not None and context is not None and value > context:
        raise invalid(
            param,
            f"'{param}' is {value}, more than the context length of "
            f"model '{model}' ({context} tokens)",
        )


def body_too_large(limits: Limits) -> OpenAIError:
    return too_large("the request body", limits.max_body_bytes)
