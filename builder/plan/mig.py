"""MIG layouts: which slice profiles go on which GPU, at which legal placement.

Pure logic: `place_on_gpu` finds a legal placement for a set of profiles on one GPU (or
says why there is none), `pack` spreads slice requests over GPUs first-fit-decreasing,
and `mig_parted_config` writes the layout in NVIDIA mig-parted's format. Legality is the
MIG user guide's: each profile at one of its listed start slices, no two placements
sharing a memory slice, no more instances of a profile than the GPU allows, and no more
compute slices than the GPU has.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from builder.errors import TridentError, printable
from builder.plan.gpus import GpuType, MigProfile

# A count is ASCII digits (str.isdigit also takes "²", which int() refuses), and two
# of them at most: no GPU holds more than 7 slices. check_layout compares the counts
# with the GPU's own limits before it expands them into one slice each.
MAX_COUNT = 99
_COUNT = re.compile(r"[0-9]{1,2}")


class MigError(TridentError):
    """A MIG layout that cannot exist, with the reason."""


@dataclass(frozen=True)
class Slice:
    """One GPU instance: a profile at a placement (first memory slice)."""

    profile: MigProfile
    start: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)


def profile_named(gpu: GpuType, name: str) -> MigProfile:
    if not gpu.mig_profiles:
        raise MigError(f"{gpu.name} does not support MIG")
    profile = gpu.mig_profile(name)
    if profile is None:
        raise MigError(
            f"{gpu.name} has no MIG profile {name!r} (profiles: "
            f"{', '.join(p.name for p in gpu.mig_profiles)})"
        )
    return profile


def parse_profile_counts(text: str) -> list[tuple[str, int]]:
    """`4g.40gb=1,3g.40gb=1` → [("4g.40gb", 1), ("3g.40gb", 1)]; a bare name counts 1."""
    counts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, count = item.partition("=")
        if not name.strip():
            raise MigError(
                f"{printable(item)[:60]!r}: expected PROFILE=COUNT, the profile is missing"
            )
        count = count.strip() or "1"
        if not _COUNT.fullmatch(count) or int(count) < 1:
            raise MigError(
                f"{printable(item)[:60]!r}: expected PROFILE=COUNT with COUNT "
                f"from 1 to {MAX_COUNT} (no GPU holds more than 7 MIG slices)"
            )
        counts.append((name.strip(), int(count)))
    if not counts:
        raise MigError("no profiles given (expected e.g. 3g.40gb=2,1g.10gb=1)")
    return counts


def check_limits(gpu: GpuType, profiles: Sequence[MigProfile]) -> None:
    """The counting rules, each with its own reason; placement is checked after."""
    for name, count in Counter(p.name for p in profiles).items():
        limit = profile_named(gpu, name).max_count
        if count > limit:
            raise MigError(f"{count} × {name} is more than the {limit} one {gpu.name} can hold")
    compute = sum(p.compute_slices for p in profiles)
    if compute > gpu.compute_slices:
        raise MigError(
            f"{_describe(profiles)} needs {compute} compute slices but "
            f"one {gpu.name} has {gpu.compute_slices}"
        )
    memory = sum(p.memory_slices for p in profiles)
    if memory > gpu.memory_slices:
        raise MigError(
            f"{_describe(profiles)} needs {memory} memory slices but "
            f"one {gpu.name} has {gpu.memory_slices}"
        )


def place_on_gpu(gpu: GpuType, profiles: Sequence[MigProfile]) -> tuple[Slice, ...]:
    """A legal placement of all `profiles` on one GPU, ordered by start; MigError if none."""
    check_limits(gpu, profiles)
    # Biggest first: they have the fewest legal starts, so the search stays tiny.
    ordered = sorted(profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    placed = _search(ordered, frozenset())
    if placed is None:
        raise MigError(
            f"no legal placement of {_describe(profiles)} on one {gpu.name}: "
            + "; ".join(
                f"{p.name} can only start at memory slice {'/'.join(map(str, p.starts))}"
                for p in sorted(set(ordered), key=ordered.index)
            )
        )
    return tuple(sorted(placed, key=lambda s: s.start))


def _search(todo: Sequence[MigProfile], used: frozenset[int]) -> list[Slice] | None:
    if not todo:
        return []
    profile, rest = todo[0], todo[1:]
    for start in profile.starts:
        candidate = Slice(profile, start)
        if used.isdisjoint(candidate.memory_slices):
            tail = _search(rest, used | set(candidate.memory_slices))
            if tail is not None:
                return [candidate, *tail]
    return None


def check_layout(gpu: GpuType, counts: Iterable[tuple[str, int]]) -> tuple[Slice, ...]:
    """`trident mig check`: names and counts → a legal placement, or MigError."""
    totals: Counter[str] = Counter()
    for name, count in counts:
        totals[name] += count
    for name, count in totals.items():  # before expanding counts into slices
        limit = profile_named(gpu, name).max_count
        if count > limit:
            raise MigError(f"{count} × {name} is more than the {limit} one {gpu.name} can hold")
    profiles = [profile_named(gpu, name) for name, count in totals.items() for _ in range(count)]
    return place_on_gpu(gpu, profiles)


@dataclass(frozen=True)
class SliceRequest:
    """One model instance that wants one slice of a profile."""

    owner: str  # model name
    instance: int
    profile: MigProfile


@dataclass(frozen=True)
class Assignment:
    request: SliceRequest
    gpu: int
    slice: Slice
    index: int  # among this GPU's slices of the same profile, by placement

    @property
    def device(self) -> str:
        """The INSTANCE_DEVICES entry: resolved to a MIG UUID on the live box (the
        `index`-th MIG device of this profile on GPU `gpu`, as `nvidia-smi -L` lists
        them), since UUIDs only exist once mig-parted has applied the layout."""
        return f"mig:{self.gpu}:{self.slice.profile.name}:{self.index}"


def pack(
    gpu: GpuType, requests: Sequence[SliceRequest], gpus: Sequence[int]
) -> tuple[dict[int, tuple[Slice, ...]], list[Assignment]]:
    """Place every request on one of `gpus`, first fit, biggest slices first.

    Returns each used GPU's slices and each request's slice. MigError names the first
    request that fits nowhere."""
    per_gpu: dict[int, list[SliceRequest]] = {}
    ordered = sorted(requests, key=lambda r: (-r.profile.memory_slices, -r.profile.compute_slices))
    for request in ordered:
        for ordinal in gpus:
            trial = per_gpu.get(ordinal, []) + [request]
            try:
                place_on_gpu(gpu, [r.profile for r in trial])
            except MigError:
                continue
            per_gpu[ordinal] = trial
            break
        else:
            raise MigError(
                f"{request.owner} instance {request.instance}: no room for a "
                f"{request.profile.name} slice on the {len(gpus)} GPU(s) left for MIG "
                f"({', '.join(map(str, gpus)) or 'none'}) after {len(requests)} slice "
                "request(s) were packed biggest first"
            )
    return _assign(gpu, per_gpu)


def _assign(gpu: GpuType, per_gpu: dict[int, list[SliceRequest]]):
    layouts: dict[int, tuple[Slice, ...]] = {}
    assignments: list[Assignment] = []
    for ordinal in sorted(per_gpu):
        slices = place_on_gpu(gpu, [r.profile for r in per_gpu[ordinal]])
        layouts[ordinal] = slices
        # Requests of one profile are interchangeable: hand them out in placement order.
        waiting = sorted(per_gpu[ordinal], key=lambda r: (r.owner, r.instance))
        seen: Counter = Counter()
        for s in slices:
            request = next(r for r in waiting if r.profile == s.profile)
            waiting.remove(request)
            assignments.append(Assignment(request, ordinal, s, seen[s.profile.name]))
            seen[s.profile.name] += 1
    return layouts, assignments


def mig_parted_config(
    config_name: str, gpu_count: int, layouts: dict[int, tuple[Slice, ...]]
) -> dict:
    """NVIDIA mig-parted config (`version: v1`): GPUs with equal layouts share an entry,
    GPUs without slices have MIG disabled."""
    entries: list[dict] = []
    by_layout: dict[tuple, list[int]] = {}
    for ordinal in range(gpu_count):
        counts = Counter(s.profile.name for s in layouts.get(ordinal, ()))
        by_layout.setdefault(tuple(sorted(counts.items())), []).append(ordinal)
    for layout, devices in by_layout.items():
        entry: dict = {"devices": devices, "mig-enabled": bool(layout)}
        if layout:
            entry["mig-devices"] = dict(layout)
        entries.append(entry)
    return {
        "version": "v1",
        "mig-configs": {
            config_name: entries,
            "all-disabled": [{"devices": "all", "mig-enabled": False}],
        },
    }


def _describe(profiles: Sequence[MigProfile]) -> str:
    counts = Counter(p.name for p in profiles)
    return ",".join(f"{name}={count}" for name, count in counts.items())
