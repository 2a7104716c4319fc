"""Counters persisted in the local cache directory (sccache-style), safe across processes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock

COUNTERS = (
    "lookups",
    "hits_local",
    "hits_s3",
    "misses",
    "builds",
    "build_failures",
    "build_seconds",
    "fetch_bytes",
    "fetch_seconds",
    "upload_bytes",
    "upload_seconds",
    "corrupt_entries",
    "lease_waits",
    "publish_conflicts",
)


class StatsFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = FileLock(str(self.path) + ".lock")

    def read(self) -> dict[str, float]:
        counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        try:
            stored = json.loads(self.path.read_text())
        except FileNotFoundError:
            return counters
        except (OSError, ValueError):
            return counters  # a damaged stats file must not break a build: start over
        counters.update(
            {k: v for k, v in stored.items() if k in counters and isinstance(v, (int, float))}
        )
        return counters

    def add(self, increments: Mapping[str, float]) -> None:
        unknown = set(increments) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown cache counters {sorted(unknown)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            counters = self.read()
            for name, amount in increments.items():
                counters[name] += amount
            temporary = self.path.with_suffix(f".tmp{os.getpid()}")
            temporary.write_text(json.dumps(counters, indent=1, sort_keys=True) + "\n")
            os.replace(temporary, self.path)
