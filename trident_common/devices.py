"""Turn a rendered device entry into what CUDA_VISIBLE_DEVICES needs on this machine.

GPU ordinals ("0", "0,1") pass through unchanged. A MIG slice is rendered as
`mig:<gpu>:<profile>:<n>` because slice UUIDs only exist once the MIG layout has been
applied on the box (mig-parted): it names the n-th slice of that profile on that GPU, in
the order `nvidia-smi -L` lists them, and resolves here to that slice's `MIG-<uuid>`.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

_GPU_LINE = re.compile(r"^GPU (\d+):")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)")


class DeviceError(RuntimeError):
    """A MIG entry that does not match the slices this machine has."""


def mig_devices(listing: str) -> dict[tuple[int, str], list[str]]:
    """`nvidia-smi -L` text → (gpu ordinal, profile) → slice UUIDs in listed order."""
    slices: dict[tuple[int, str], list[str]] = {}
    gpu = None
    for line in listing.splitlines():
        gpu_match = _GPU_LINE.match(line)
        if gpu_match:
            gpu = int(gpu_match.group(1))
            continue
        mig_match = _MIG_LINE.match(line)
        if mig_match and gpu is not None:
            slices.setdefault((gpu, mig_match.group(1)), []).append(mig_match.group(2))
    return slices


def resolve(entry: str, list_gpus: Callable[[], str]) -> str:
    """The CUDA_VISIBLE_DEVICES value for one INSTANCE_DEVICES entry."""
    if not entry.startswith("mig:"):
        return entry
    try:
        _, gpu, profile, index = entry.split(":")
        key, n = (int(gpu), profile), int(index)
    except ValueError:
        raise DeviceError(f"{entry!r}: expected mig:<gpu>:<profile>:<n>") from None
    uuids = mig_devices(list_gpus()).get(key, [])
    if n >= len(uuids):
        raise DeviceError(
            f"{entry!r}: GPU {key[0]} has {len(uuids)} {profile} MIG slice(s); "
            "apply the layout from `trident mig plan` first"
        )
    return uuids[n]


def nvidia_smi_list() -> str:
    return subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
