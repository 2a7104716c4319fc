"""Reading the small text files a user hands trident (a spec, a topology matrix, a
config.pbtxt): regular files only, capped, strictly UTF-8, and every refusal one line
that the caller prefixes with the file's name."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotText(ValueError):
    """The bytes are not what a text file of trident's may be: `reason` (no file name)."""


def read_regular(path: str | Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file. Anything else is refused before a read:
    opening a named pipe waits for a writer and reading a device may never end.
    O_NONBLOCK makes the open itself return at once; the type is checked on the open
    descriptor, so the file cannot be swapped between the check and the read.
    OSError (missing, unreadable, IsADirectoryError) passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise NotText("not a regular file (a pipe, device or socket); give a file")
        os.set_blocking(fd, True)
        return f.read(limit)


def utf8(data: bytes, show_byte: bool = True) -> str:
    """data as text; NotText naming the line (and, unless the file holds secrets, the
    byte) of the first non-UTF-8 sequence."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise NotText("UTF-16 text; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        byte = f" (byte 0x{data[e.start]:02x})" if show_byte else ""
        raise NotText(f"line {line}: not UTF-8 text{byte}; save it as UTF-8") from None


def read_text(path: str | Path, limit: int, secret: bool = False) -> str:
    """A regular file's UTF-8 text, refused (NotText) past `limit` bytes. `secret`: the
    file holds secrets (API keys), so a refusal never quotes a byte of it."""
    data = read_regular(path, limit + 1)
    if len(data) > limit:
        raise NotText(f"larger than {_size(limit)}")
    return utf8(data, show_byte=not secret)


def _size(limit: int) -> str:
    """A byte limit as a reader says it: 16 MiB, 64 KiB."""
    if limit >= 1 << 20 and limit % (1 << 20) == 0:
        return f"{limit >> 20} MiB"
    return f"{limit // 1024} KiB"
