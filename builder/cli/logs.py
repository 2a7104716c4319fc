"""Logging for the command line: trident's own loggers (`trident.*`, such as
`trident.engine_cache`) to stderr at INFO, or DEBUG with -v, so a message such as
"waiting for a build lease" reaches the user. Nothing that looks like a secret is logged.
"""

from __future__ import annotations

import logging
import sys

# The project's one rule for secrets in text (also behind CacheError and CLI errors).
from engine_cache.redact import redact

__all__ = ["configure", "redact"]

_HANDLER_NAME = "trident-cli"


class _StderrHandler(logging.Handler):
    """Writes to sys.stderr as it is when the record comes, not when the handler was made,
    so redirected stderr (contextlib.redirect_stderr, pytest's capture) gets the line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never break the command it reports on
            self.handleError(record)


class _Formatter(logging.Formatter):
    """INFO as the bare message, others prefixed by their level; -v adds time and logger.
    Tracebacks only with -v: without it, errors stay one line."""

    def __init__(self, verbose: bool):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if self.verbose:
            return redact(super().format(record))
        message = redact(record.getMessage())
        if record.levelno == logging.INFO:
            return message
        return f"{record.levelname.lower()}: {message}"


def configure(verbose: bool = False) -> None:
    """Idempotent: main() may run many times in one process (tests)."""
    logger = logging.getLogger("trident")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = _StderrHandler()
        handler.set_name(_HANDLER_NAME)
        logger.addHandler(handler)
    handler.setFormatter(_Formatter(verbose))
