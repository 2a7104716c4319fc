"""One escaping function per output format a template writes (jinja filters).

Every spec string that reaches a rendered file goes through one of these, so it lands as
data: a spec path holding a newline and `parameters { ... }` stays inside its comment, a
rule name with quotes stays inside its JSON string. They also keep `${`, `{{` and `{%`
out of the output, which `trident validate` would report as template leftovers.
"""

from __future__ import annotations

import json
import re
from typing import Any

from builder.errors import printable

# Sequences trident validate reads as unfilled placeholders (builder.render.validate._LEFTOVER).
_PLACEHOLDER_START = re.compile(r"[{$](?=[{%])")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EscapeError(ValueError):
    """A value that has no safe form in the target format."""


def pbtxt_string(value: Any) -> str:
    """A protobuf text-format string literal, quotes included: printable ASCII as is;
    quotes, backslashes, placeholder starts and everything else as octal escapes of
    their UTF-8 bytes (the format is byte-oriented)."""
    text = str(value)
    opens = {m.start() for m in _PLACEHOLDER_START.finditer(text)}
    out: list[str] = []
    for i, char in enumerate(text):
        if char in '"\\' or i in opens or not " " <= char <= "~":
            out.extend(f"\\{byte:03o}" for byte in char.encode("utf-8"))
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def pbtxt_comment(value: Any) -> str:
    """Text for after a `#`: one line (a newline would end the comment), placeholder
    starts written as \\x escapes; it is never parsed back, only read."""
    return _PLACEHOLDER_START.sub(lambda m: f"\\x{ord(m.group()):02x}", printable(value))


def pbtxt_ident(value: Any) -> str:
    """An enum value or other bare identifier (TYPE_STRING, KIND_CPU): checked, not quoted."""
    if not isinstance(value, str) or not _IDENT.fullmatch(value):
        raise EscapeError(f"{value!r} is not a protobuf identifier")
    return value


def pbtxt_int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EscapeError(f"{value!r} is not an integer")
    return str(value)


def json_text(value: Any, indent: int | None = None) -> str:
    """Strict JSON (no NaN/Infinity), keys sorted; a `{` or `$` that would open a
    placeholder is written as a \\u escape, which JSON readers decode back to itself
    (outside strings those characters never precede `{` or `%`)."""
    try:
        text = json.dumps(value, indent=indent, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise EscapeError(f"not JSON data: {e}") from None
    return _PLACEHOLDER_START.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


FILTERS = {
    "pbtxt_string": pbtxt_string,
    "pbtxt_comment": pbtxt_comment,
    "pbtxt_ident": pbtxt_ident,
    "pbtxt_int": pbtxt_int,
    "json": json_text,
}
