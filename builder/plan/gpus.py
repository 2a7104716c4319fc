"""GPU types trident knows: memory, SM architecture, interconnect and MIG profiles.

Names are the ones used on the CLI and in the spec's `hardware.gpu`. MIG profiles and
their legal placements follow NVIDIA's MIG user guide ("Supported MIG Profiles"): a GPU
has a number of memory slices (8 on A100/H100/H200, 4 on A30) and compute slices (7 or 4).
A profile occupies `memory_slices` consecutive memory slices starting at one of its
legal `starts` (what `nvidia-smi mig -lgipp` prints as `{0,2,4}:2`), and at most
`max_count` instances of it fit on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "3g.40gb"
    compute_slices: int  # the "3g"
    memory_slices: int  # consecutive memory slices it occupies
    starts: tuple[int, ...]  # legal first memory slice of a placement
    max_count: int  # instances of this profile one GPU can hold
    memory_gib: float  # its share of the GPU's memory

    @property
    def kubernetes_resource(self) -> str:
        """The extended resource the GPU operator's mixed strategy advertises."""
        return f"nvidia.com/mig-{self.name}"


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gib: float
    sm: str  # compute capability as TensorRT names it, e.g. "90"
    nvlink: str  # interconnect generation ("" for none)
    memory_slices: int = 0  # MIG memory slices (0: no MIG)
    compute_slices: int = 0  # MIG compute slices
    mig_profiles: tuple[MigProfile, ...] = ()

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


def _seven_slice_profiles(memory_gib: float, gb: tuple[int, ...]) -> tuple[MigProfile, ...]:
    """The A100/H100/H200 geometry: 8 memory slices, 7 compute slices. `gb` holds the
    memory figures of the profile names in the order 1g, 1g (two slices), 2g, 3g, 4g, 7g,
    e.g. (10, 20, 20, 40, 40, 80) for an 80 GB part."""
    slice_gib = memory_gib / 8
    rows = (  # (compute, memory slices, starts, max count, name memory)
        ("1g", 1, (0, 1, 2, 3, 4, 5, 6), 7, gb[0], ""),
        ("1g", 1, (0, 1, 2, 3, 4, 5, 6), 1, gb[0], "+me"),
        ("1g", 2, (0, 2, 4, 6), 4, gb[1], ""),
        ("2g", 2, (0, 2, 4), 3, gb[2], ""),
        ("3g", 4, (0, 4), 2, gb[3], ""),
        ("4g", 4, (0,), 1, gb[4], ""),
        ("7g", 8, (0,), 1, gb[5], ""),
    )
    return tuple(
        MigProfile(
            f"{c}.{name_gb}gb{suffix}", int(c[0]), mem, starts, count, round(mem * slice_gib, 2)
        )
        for c, mem, starts, count, name_gb, suffix in rows
    )


def _a30_profiles() -> tuple[MigProfile, ...]:
    """A30-24GB: 4 memory slices, 4 compute slices."""
    return (
        MigProfile("1g.6gb", 1, 1, (0, 1, 2, 3), 4, 6.0),
        MigProfile("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, 6.0),
        MigProfile("2g.12gb", 2, 2, (0, 2), 2, 12.0),
        MigProfile("2g.12gb+me", 2, 2, (0, 2), 1, 12.0),
        MigProfile("4g.24gb", 4, 4, (0,), 1, 24.0),
    )


def _gpu(name: str, memory_gib: float, sm: str, nvlink: str, mig_gb: tuple[int, ...]) -> GpuType:
    return GpuType(name, memory_gib, sm, nvlink, 8, 7, _seven_slice_profiles(memory_gib, mig_gb))


GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        GpuType("A30-24GB", 24, "80", "NVLink3", 4, 4, _a30_profiles()),
        _gpu("A100-40GB", 40, "80", "NVLink3", (5, 10, 10, 20, 20, 40)),
        _gpu("A100-80GB", 80, "80", "NVLink3", (10, 20, 20, 40, 40, 80)),
        _gpu("H100-80GB", 80, "90", "NVLink4", (10, 20, 20, 40, 40, 80)),
        _gpu("H100-PCIE-80GB", 80, "90", "NVLink4", (10, 20, 20, 40, 40, 80)),
        _gpu("H100-94GB", 94, "90", "NVLink4", (12, 24, 24, 47, 47, 94)),
        _gpu("H200-141GB", 141, "90", "NVLink4", (18, 35, 35, 71, 71, 141)),
    )
}


def gpu_type_for(product_name: str, memory_mib: float) -> GpuType | None:
    """The table entry for a GPU as `nvidia-smi --query-gpu=name,memory.total` reports
    it (e.g. "NVIDIA H100 80GB HBM3", 81559), or None for a GPU trident does not know."""
    name = product_name.upper()
    gib = memory_mib / 1024
    if "A30" in name:
        return GPU_TYPES["A30-24GB"]
    if "A100" in name:
        return GPU_TYPES["A100-40GB" if gib < 60 else "A100-80GB"]
    if "H200" in name:
        return GPU_TYPES["H200-141GB"]
    if "H100" in name:
        if gib > 85 or "NVL" in name:
            return GPU_TYPES["H100-94GB"]
        return GPU_TYPES["H100-PCIE-80GB" if "PCIE" in name else "H100-80GB"]
    return None
