"""One way for trident's Python models to write to the server's log.

Inside a Triton stub, `pb_utils.Logger` writes into tritonserver's own log (a stub's
stdout and stderr are not always kept); elsewhere (unit tests, tools) the `logging`
module does. Lines start with the model's tag: `[vllm] Cancelling the request ...`.
"""

from __future__ import annotations

import logging
from types import ModuleType

pb_utils: ModuleType | None  # None outside a stub
try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # not inside a stub: the logging module is the log
    pb_utils = None

_LEVELS = {
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "verbose": logging.DEBUG,
}
_TRITON_METHODS = {
    "info": "log_info",
    "warning": "log_warn",
    "error": "log_error",
    "verbose": "log_verbose",
}


class Log:
    """Log lines tagged `[tag]`. `triton_logger` is pb_utils.Logger when running in a
    stub (found on its own when not given); None means the logging module."""

    def __init__(self, tag: str, triton_logger: object | None = None):
        self.tag = tag
        self._triton = triton_logger if triton_logger is not None else _stub_logger()
        self._fallback = logging.getLogger(f"trident.{tag}")

    def info(self, message: str) -> None:
        self._write("info", message)

    def warning(self, message: str) -> None:
        self._write("warning", message)

    def error(self, message: str) -> None:
        self._write("error", message)

    def verbose(self, message: str) -> None:
        self._write("verbose", message)

    def _write(self, level: str, message: str) -> None:
        line = f"[{self.tag}] {message}"
        if self._triton is not None:
            try:
                getattr(self._triton, _TRITON_METHODS[level])(line)
                return
            except Exception:  # logging must never fail a request: e.g. the stub's
                pass  # IPC is closing at shutdown; the line goes below instead
        self._fallback.log(_LEVELS[level], line)


def _stub_logger() -> object | None:
    return getattr(pb_utils, "Logger", None)
