"""The server's output, passed on line by line to where it always went (a log file, or
our own stdout) while the last lines stay in memory: a load that does not finish is
described from them (loading.load_stage), with or without a log file."""

from __future__ import annotations

import collections
import threading
from typing import IO

KEEP_LINES = 4000  # vLLM's start-up writes a few hundred lines per model


class OutputTail:
    """Copies a pipe to `sink` in a thread of its own; `lines()` are the newest ones."""

    def __init__(
        self, pipe: IO[bytes], sink: IO[bytes], keep: int = KEEP_LINES, close_sink: bool = False
    ):
        self._pipe, self._sink, self._close_sink = pipe, sink, close_sink
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, name="tritonserver-output", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        # The pipe ends when the last process of the server's group closes it.
        for raw in iter(self._pipe.readline, b""):
            try:
                self._sink.write(raw)
                self._sink.flush()
            except Exception:  # noqa: BLE001 - a closed terminal, a replaced stderr
                pass  # whatever the sink's fault, keep draining the pipe: the server
                # would block on a full one
            with self._lock:
                self._lines.append(raw.decode(errors="replace").rstrip("\n"))
        self._pipe.close()
        if self._close_sink:
            self._sink.close()

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
