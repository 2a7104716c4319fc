"""Stand-ins for the engine cache tests: a settable clock and a recording compiler."""

from __future__ import annotations

import os
from pathlib import Path


class FakeClock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def recording_build(log: Path, payload: bytes = b"ENGINE" * 100):
    """A stand-in compiler: writes rank0.engine + config.json and logs each call."""

    def build(out: Path) -> None:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        (out / "rank0.engine").write_bytes(payload)
        (out / "config.json").write_text('{"builder_config": {"max_batch_size": 8}}')

    return build


def builds(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0
