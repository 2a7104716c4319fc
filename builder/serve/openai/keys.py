"""API keys of the OpenAI frontend (`--api-keys-file FILE`).

The file holds one `KEY TENANT` per line (blank lines and `#` comments ignored). With a
file, every /v1 request needs `Authorization: Bearer KEY` with a key from it (401 in
OpenAI's shape otherwise, checked before a byte of the body is read), and the key's
tenant becomes the request's `tenant` hint, in place of any the client sent, so the
router's tenant limits apply to it (policy.as_tenant). Keys are never printed: errors
name the file and the line number only.
"""
from __future__ import annotations

import hmac
from pathlib import Path
from typing import Mapping, Optional

from builder.errors import TridentError
from builder.serve.openai.errors import OpenAIError

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class KeysFileError(TridentError):
    """The keys file cannot be used; the message says why (never a key)."""

    exit_code = 2


def load_keys(path: str | Path) -> dict:
    """key → tenant from a keys file; raises KeysFileError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeysFileError(f"{path}: cannot read the API keys file: "
                            f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
    keys: dict = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2:
            raise KeysFileError(f"{path}:{number}: expected `KEY TENANT` (two words), "
                                f"got {len(words)}")
        key, tenant = words
        if not set(tenant) <= _NAME_CHARS:
            raise KeysFileError(f"{path}:{number}: tenant names are letters, digits, "
                                "'_', '.' and '-'")
        if key in keys:
            raise KeysFileError(f"{path}:{number}: this key is already on an earlier line")
        keys[key] = tenant
    if not keys:
        raise KeysFileError(f"{path}: no `KEY TENANT` line: every request would be refused")
    return keys


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, "invalid_request_error", None, "invalid_api_key")


def tenant_of(keys: Mapping[str, str], headers: Mapping[str, str]) -> Optional[str]:
    """The tenant of the request's bearer key; raises a 401 OpenAIError for a missing or
    unknown key. Every key is compared in constant time."""
    value = headers.get("authorization") or ""
    scheme, _, key = value.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise unauthorized("You didn't provide an API key: send `Authorization: Bearer "
                           "KEY`.")
    found = None
    for known, tenant in keys.items():
        if hmac.compare_digest(known.encode(), key.encode()):
            found = tenant
    if found is None:
        raise unauthorized("Incorrect API key provided.")
    return found
