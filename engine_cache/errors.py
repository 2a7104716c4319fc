"""The engine cache's errors. engine_cache depends on nothing of trident's: a CLI prints a
CacheError as one line and exits with its exit_code (2: bad input, 1: a failure)."""
from __future__ import annotations

import os
import re

# scheme://user:password@host - whatever is between "://" and "@" is a credential (which
# may contain "/", so a path with an "@" is over-redacted rather than a secret shown).
_USERINFO = re.compile(r"(?<=://)[^\s@'\"]+@")
# Shorter values are not plausible secrets, and replacing them would garble messages.
_MIN_SECRET_LEN = 8


def redact(text: str, secrets: tuple[str | None, ...] = ()) -> str:
    """text without URL credentials, the standard AWS secret variables' values, or secrets."""
    text = _USERINFO.sub("***@", text)
    known = (*secrets, os.environ.get("AWS_SECRET_ACCESS_KEY"), os.environ.get("AWS_SESSION_TOKEN"))
    for secret in known:
        if secret and len(secret) >= _MIN_SECRET_LEN:
            text = text.replace(secret, "***")
    return text


class CacheError(Exception):
    """The cache cannot do what was asked (bad input, unreachable S3, unusable entry).

    The message is redacted here, once, so that no path (a botocore message quoting a URL,
    an echoed setting) can put a secret into an error a CLI prints or a log keeps."""

    exit_code = 1

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(redact(str(message)))
        if exit_code is not None:
            self.exit_code = exit_code


class S3Unreachable(CacheError):
    """The endpoint could not be reached at all (as opposed to refusing a request)."""


class CorruptEntry(CacheError):
    """An entry that must not be used (unreadable manifest, missing or damaged file)."""

    def __init__(self, key: str, problems: list[str], etag: str | None = None):
        super().__init__(f"entry {key} is damaged: {'; '.join(problems)}")
        self.key, self.problems, self.etag = key, problems, etag
