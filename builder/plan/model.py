"""The plan: where each model's instances run (GPUs or MIG slices), with which TP × PP,
and how much memory that takes; what the renderer, `trident plan` and the Kubernetes
resources read. Made by builder.plan.planner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from builder.plan import memory, mig
from builder.plan import topology as topo
from builder.plan.gpus import GpuType, MigProfile


@dataclass(frozen=True)
class InstancePlacement:
    devices: tuple[int, ...] = ()  # GPU ordinals, pipeline stage by stage
    slice: mig.Assignment | None = None  # its MIG slice, if on MIG

    @property
    def visible_devices(self) -> str:
        """What CUDA_VISIBLE_DEVICES gets in this instance's stub process."""
        return self.slice.device if self.slice else ",".join(map(str, self.devices))


@dataclass(frozen=True)
class ModelPlan:
    name: str
    engine: str
    kind: str  # cpu | gpu | model (Triton instance kind)
    tp: int = 1
    pp: int = 1
    instances: tuple[InstancePlacement, ...] = ()
    mig_profile: MigProfile | None = None
    need: memory.MemoryNeed | None = None  # per GPU or slice; None: size unknown
    usable_gib: float | None = None  # per GPU or slice
    link: str = "-"  # slowest link inside an instance
    nodes: int = 1  # nodes one instance spans (devices: per node)

    @property
    def free_gib(self) -> float | None:
        if self.need is None or self.usable_gib is None:
            return None
        return self.usable_gib - self.need.total_gib

    @property
    def kubernetes_resources(self) -> dict[str, int]:
        """Per instance: the extended resources a pod running it requests (for an
        instance spanning nodes, each of its pods: one node's share)."""
        if self.kind == "cpu":
            return {}
        if self.mig_profile is not None:
            return {self.mig_profile.kubernetes_resource: 1}
        return {"nvidia.com/gpu": self.tp * self.pp // self.nodes}


@dataclass(frozen=True)
class Plan:
    gpu: GpuType | None  # None on the CPU
    count: int
    topology: topo.Topology | None
    models: Mapping[str, ModelPlan]
    mig_layouts: Mapping[int, tuple[mig.Slice, ...]] = field(default_factory=dict)

    def model(self, name: str) -> ModelPlan:
        return self.models[name]

    @property
    def used_gpus(self) -> set[int]:
        """GPUs taken on the node the single-node models share (a model spanning nodes
        takes nodes of its own)."""
        used = {
            d for m in self.models.values() if m.nodes == 1 for i in m.instances for d in i.devices
        }
        return used | set(self.mig_layouts)
