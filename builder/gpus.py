"""GPU types trident knows: memory, SM architecture and interconnect.

The placement planner extends this table with MIG profiles; names are the ones used on the
CLI and in the spec's `hardware.gpu`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gib: float
    sm: str            # compute capability as TensorRT names it, e.g. "90"
    nvlink: str        # interconnect generation ("" for none)


GPU_TYPES: dict[str, GpuType] = {g.name: g for g in (
    GpuType("A30-24GB", 24, "80", "NVLink3"),
    GpuType("A100-40GB", 40, "80", "NVLink3"),
    GpuType("A100-80GB", 80, "80", "NVLink3"),
    GpuType("H100-80GB", 80, "90", "NVLink4"),
    GpuType("H100-PCIE-80GB", 80, "90", "NVLink4"),
    GpuType("H100-94GB", 94, "90", "NVLink4"),
    GpuType("H200-141GB", 141, "90", "NVLink4"),
)}
