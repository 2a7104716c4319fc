"""The engine cache's errors. engine_cache depends on nothing of trident's: a CLI prints a
CacheError as one line and exits with its exit_code (2: bad input, 1: a failure)."""

from __future__ import annotations

from engine_cache.redact import redact

__all__ = ["CacheError", "CorruptEntry", "S3Unreachable", "redact"]


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
