"""trident's signal handling, installed in one place: a handler for some signals while a
block runs, the previous handlers back after it. Python runs a handler on the main
thread, between bytecodes, so a handler that raises leaves whatever that thread was
doing, as Ctrl-C does.

Who uses it: the CLI's jobs (builder.cli.common.sigterm_as_interrupt: SIGTERM as
Ctrl-C, so a job cleans up and exits 130) and `trident serve` once it serves
(builder.serve.drain.drain_on_signal: the first signal drains, a second stops). `trident
openai` is uvicorn's server, which installs its own (builder.serve.openai.runner).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

Handler = Callable[[int, FrameType | None], object]


@contextmanager
def handling(signals: Iterable[int], handler: Handler) -> Iterator[None]:
    """`handler` for each of `signals` for the duration (the main thread only)."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def interrupt(_signum: int, _frame: FrameType | None) -> NoReturn:
    """A signal as Ctrl-C: stop what runs now, with its clean-up (exit 130)."""
    raise KeyboardInterrupt
