"""API keys of the OpenAI frontend (`--api-keys-file FILE`).

The file holds one `KEY TENANT` per line (blank lines and `#` comments ignored). With a
file, every /v1 request needs `Authorization: Bearer KEY` with a key from it (401 in
OpenAI's shape otherwise, checked before a byte of the body is read), and the key's
tenant becomes the request's `tenant` hint, in place of any the client sent, so the
router's tenant limits apply to it (policy.as_tenant). Keys are never printed: errors
name the file and the line number only.

The file must be a regular file of at most MAX_KEYS_BYTES, in UTF-8: a named pipe would
block the start forever waiting for a writer, and /dev/zero would be read until memory ran
out (builder.textfile refuses both before reading).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from pathlib import Path

from bls.tenant_names import TENANT_RE
from builder import textfile
from builder.errors import EXIT_USAGE, TridentError, printable
from builder.serve.openai.errors import OpenAIError

# 16 MiB: a line is a key (~50 bytes), a tenant name and a newline, so this holds well
# over 100,000 keys, and it is still read and split in well under a second.
MAX_KEYS_BYTES = 16 << 20


class KeysFileError(TridentError):
    """The keys file cannot be used; the message says why (never a key)."""

    exit_code = EXIT_USAGE


def load_keys(path: str | Path) -> dict:
    """key → tenant from a keys file; raises KeysFileError."""
    path = Path(path)
    name = printable(str(path))  # a file name cannot add lines to the message
    try:
        text = textfile.read_text(path, MAX_KEYS_BYTES, secret=True)
    except (OSError, textfile.NotText) as e:
        # NotText names the line only: the offending byte may belong to a key.
        reason = str(e) if isinstance(e, textfile.NotText) else (e.strerror or str(e))
        raise KeysFileError(f"{name}: cannot read the API keys file: {reason}") from None
    keys: dict = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2:
            raise KeysFileError(
                f"{name}:{number}: expected `KEY TENANT` (two words), got {len(words)}"
            )
        key, tenant = words
        if not TENANT_RE.fullmatch(tenant):  # the router's rule, as the spec's
            raise KeysFileError(
                f"{name}:{number}: a tenant name is a letter or digit, then up to 127 "
                "letters, digits, '_', '.', '@' or '-'"
            )
        if key in keys:
            raise KeysFileError(f"{name}:{number}: this key is already on an earlier line")
        keys[key] = tenant
    if not keys:
        raise KeysFileError(f"{name}: no `KEY TENANT` line: every request would be refused")
    return keys


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, "invalid_request_error", None, "invalid_api_key")


def tenant_of(keys: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """The tenant of the request's bearer key; raises a 401 OpenAIError for a missing or
    unknown key. Every key is compared in constant time."""
    value = headers.get("authorization") or ""
    scheme, _, key = value.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise unauthorized("You didn't provide an API key: send `Authorization: Bearer KEY`.")
    found = None
    for known, tenant in keys.items():
        if hmac.compare_digest(known.encode(), key.encode()):
            found = tenant
    if found is None:
        raise unauthorized("Incorrect API key provided.")
    return found
