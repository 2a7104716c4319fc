"""How many requests each backend holds, counted over all of a router's instances.

Each router instance is a stub process of its own, and Triton does not spread requests
evenly over them: with a backend's limit split 1/N per instance, four instances at 256
streams answered `overloaded` while the router as a whole had room (bench gpu_rate,
`--router-instances 4`). So the instances share their counts, and a backend's limit
holds for the router as a whole.

They share one small file, mapped into each instance's memory: one 64-bit slot per
backend and instance, each written by its own instance only, so no lock is taken; a
reader sums the backend's slots. Two instances claiming at the same moment may both pass
the check: the limit can be exceeded by at most instances - 1 requests. An instance
zeroes its own slots when it starts (a killed stub's requests died with it). The file
lives in `trident serve`'s drain folder (removed when serve exits), else in the temporary
folder, named by tritonserver's process, the router and the layout (backends and
instance count: a reload that changes them uses a new file while the old instances
drain). With one instance nothing is shared.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import tempfile
from collections.abc import Iterator, Mapping

SLOT_BYTES = 8


def instance_slot(instance_name: str | None, instances: int) -> int | None:
    """This instance's slot from Triton's instance name (`router_0_1`: group 0, index 1),
    or None when it cannot be told (then the instance counts alone)."""
    found = re.search(r"_(\d+)$", instance_name or "")
    if found is None or int(found.group(1)) >= instances:
        return None
    return int(found.group(1))


def shared_path(folder: str | None, router: str, names: list[str], instances: int) -> str:
    layout = hashlib.sha256(repr((names, instances)).encode()).hexdigest()[:12]
    name = f"trident-inflight-{os.getppid()}-{router}-{layout}"
    where = folder if folder and os.path.isdir(folder) else tempfile.gettempdir()
    return os.path.join(where, name)


class Inflight(Mapping[str, int]):
    """backend -> requests in flight over all instances; `add` changes this instance's."""

    def __init__(
        self, names: list[str], instances: int = 1, slot: int = 0, path: str | None = None
    ):
        self.index = {name: i for i, name in enumerate(names)}
        self.instances, self.slot = instances, slot
        size = max(1, len(names) * instances) * SLOT_BYTES
        if path is None or instances == 1:
            self.instances, self.slot = 1, 0
            self.memory: bytearray | mmap.mmap = bytearray(max(1, len(names)) * SLOT_BYTES)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                self.memory = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self.counts = memoryview(self.memory).cast("q")
        for name in names:
            self.counts[self._own(name)] = 0

    @classmethod
    def shared(
        cls,
        names: list[str],
        instances: int,
        instance_name: str | None,
        folder: str | None,
        router: str,
    ) -> Inflight:
        slot = instance_slot(instance_name, instances)
        if instances == 1 or slot is None:
            return cls(names)
        return cls(names, instances, slot, shared_path(folder, router, names, instances))

    def _own(self, name: str) -> int:
        return self.index[name] * self.instances + self.slot

    def add(self, name: str, delta: int) -> None:
        self.counts[self._own(name)] += delta

    def __getitem__(self, name: str) -> int:
        first = self.index[name] * self.instances
        return sum(self.counts[first : first + self.instances])

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def close(self) -> None:
        self.counts.release()
        if isinstance(self.memory, mmap.mmap):
            self.memory.close()
