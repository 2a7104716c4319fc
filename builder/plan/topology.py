"""The GPU interconnect of a node, read from `nvidia-smi topo -m`.

`parse_topology` is pure: the matrix text in, a Topology out (links between every GPU
pair and each GPU's NUMA node). `load_topology` is the I/O around it: a saved file named
by the spec's `hardware.topology`, else the live `nvidia-smi topo -m` when nvidia-smi
exists, else a topology that knows nothing (every link "?"), which the planner treats as
uniform. `best_group` picks tensor-parallel groups: the fastest slowest-link first.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from builder import textfile
from builder.errors import EXIT_USAGE, TridentError, printable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_NAME = re.compile(r"^GPU(\d+)$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS)$")
UNKNOWN_LINK = "?"
MAX_TOPOLOGY_BYTES = 1 << 20  # `nvidia-smi topo -m` of 8 GPUs is about 2 KiB

# Link quality, higher is faster: NVLink (more bonded links is faster) beats any PCIe
# path; among PCIe paths, fewer bridges is faster; SYS crosses the CPU interconnect.
_PCIE_SCORES = {"PIX": 40, "PXB": 30, "PHB": 20, "NODE": 10, "SYS": 0, UNKNOWN_LINK: 10}
CROSS_NUMA_SCORE = _PCIE_SCORES["SYS"]


class TopologyError(TridentError):
    """Unreadable or inconsistent `nvidia-smi topo -m` output."""

    exit_code = EXIT_USAGE


def link_score(link: str) -> int:
    if link.startswith("NV"):
        return 100 + int(link[2:])
    return _PCIE_SCORES[link]


@dataclass(frozen=True)
class Topology:
    links: tuple[tuple[str, ...], ...]  # links[i][j], "X" on the diagonal
    numa: tuple[int | None, ...]  # NUMA node of each GPU (None: not reported)
    source: str  # where it came from, for messages

    @property
    def count(self) -> int:
        return len(self.links)

    @property
    def known(self) -> bool:
        return self.count < 2 or self.links[0][1] != UNKNOWN_LINK

    def score(self, a: int, b: int) -> int:
        return link_score(self.links[a][b])

    def group_score(self, group: Iterable[int]) -> tuple[int, int]:
        """(slowest link inside the group, sum of all its links): bigger is better."""
        members = sorted(group)
        pairs = [self.score(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
        return (min(pairs), sum(pairs)) if pairs else (1000, 0)

    def slowest_link(self, group: Iterable[int]) -> str:
        members = sorted(group)
        pairs = [
            (self.score(a, b), self.links[a][b])
            for i, a in enumerate(members)
            for b in members[i + 1 :]
        ]
        return min(pairs)[1] if pairs else "-"


def uniform_topology(count: int) -> Topology:
    """Nothing known about the links: every pair "?" (the planner then goes by ordinal)."""
    links = tuple(
        tuple("X" if i == j else UNKNOWN_LINK for j in range(count)) for i in range(count)
    )
    return Topology(links, (None,) * count, "unknown (no topology given, no nvidia-smi)")


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    """Parse `nvidia-smi topo -m` output (terminal escapes, NIC rows and legend allowed)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_index, header = _find_header(lines, source)
    gpu_columns = [c for c in header if _GPU_NAME.match(c)]
    if [f"GPU{i}" for i in range(len(gpu_columns))] != gpu_columns:
        raise TopologyError(f"{source}: GPU columns are not GPU0..GPUn: {gpu_columns}")
    numa_column = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    links: list[tuple[str, ...]] = []
    numa: list[int | None] = []
    for number, line in enumerate(lines[header_index + 1 :], header_index + 2):
        cells = _cells(line)
        gpu_row = _GPU_NAME.match(cells[0]) if cells else None
        if gpu_row is None:
            continue
        row = cells[1:]
        if int(gpu_row.group(1)) != len(links):
            raise TopologyError(f"{source}:{number}: expected row GPU{len(links)}")
        if len(row) < len(gpu_columns):
            raise TopologyError(
                f"{source}:{number}: {len(row)} cells, expected at least {len(gpu_columns)}"
            )
        for cell in row[: len(gpu_columns)]:
            if not _LINK.match(cell):
                raise TopologyError(
                    f"{source}:{number}: unknown link {cell!r} (expected X, "
                    "NV#, PIX, PXB, PHB, NODE or SYS)"
                )
        links.append(tuple(row[: len(gpu_columns)]))
        numa.append(_numa(row, numa_column))
    _check_matrix(links, len(gpu_columns), source)
    return Topology(tuple(links), tuple(numa), source)


def _cells(line: str) -> list[str]:
    """Tab-separated cells, stripped. Empty cells are kept: real output leaves e.g. an
    unknown CPU affinity empty, and the columns after it must stay in place."""
    return [c.strip() for c in line.split("\t")]


def _find_header(lines: list[str], source: str) -> tuple[int, list[str]]:
    for index, line in enumerate(lines):
        cells = _cells(line)
        if cells and not cells[0]:
            cells = cells[1:]  # the empty corner cell above the row names
        if cells and cells[0] == "GPU0":
            return index, cells
    raise TopologyError(
        f"{source}: no `nvidia-smi topo -m` header (a line starting with GPU0 columns)"
    )


def _numa(row: list[str], numa_column: int | None) -> int | None:
    if numa_column is None or numa_column >= len(row):
        return None
    value = row[numa_column]
    return int(value) if value.isdigit() else None


def _check_matrix(links: list[tuple[str, ...]], count: int, source: str) -> None:
    if len(links) != count:
        raise TopologyError(f"{source}: {count} GPU columns but {len(links)} GPU rows")
    for i in range(count):
        if links[i][i] != "X":
            raise TopologyError(f"{source}: GPU{i} row does not have X on the diagonal")
        for j in range(count):
            if links[i][j] != links[j][i]:
                raise TopologyError(
                    f"{source}: GPU{i}-GPU{j} is {links[i][j]} but GPU{j}-GPU{i} is {links[j][i]}"
                )


def best_group(
    topology: Topology, free: Iterable[int], size: int, min_score: int | None = None
) -> tuple[int, ...] | None:
    """The `size` free GPUs with the fastest slowest link (then the most total bandwidth,
    then one NUMA node, then the lowest ordinals); None if no such group exists. With
    `min_score`, groups whose slowest link is below it do not count (e.g. TP must not
    cross NUMA nodes).

    Greedy from every seed: add the GPU whose slowest link to the group is fastest.
    Exact for the hierarchical topologies nvidia-smi reports (switch trees, NVSwitch,
    bridged pairs), and linear in the GPU count."""
    free = sorted(set(free))
    if size < 1 or size > len(free):
        return None
    best: tuple | None = None
    for seed in free:
        group = [seed]
        while len(group) < size:
            candidates = [g for g in free if g not in group]
            group.append(
                max(
                    candidates,
                    key=lambda g: (
                        min(topology.score(g, m) for m in group),
                        sum(topology.score(g, m) for m in group),
                        topology.numa[g] == topology.numa[seed],
                        -g,
                    ),
                )
            )
        same_numa = len({topology.numa[g] for g in group}) == 1
        ranked = (topology.group_score(group), same_numa, [-g for g in sorted(group)])
        if best is None or ranked > best[0]:
            best = (ranked, tuple(sorted(group)))
    if best is None or (min_score is not None and best[0][0][0] < min_score):
        return None
    return best[1]


def read_live(
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> Topology | None:
    """`nvidia-smi topo -m` on this machine, or None without nvidia-smi."""
    if which("nvidia-smi") is None:
        return None
    result = run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise TopologyError(
            f"nvidia-smi topo -m failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    return parse_topology(result.stdout, "nvidia-smi topo -m")


def load_topology(
    path: str | None, count: int, spec_file: str, live: Callable[[], Topology | None] = read_live
) -> Topology:
    """The topology for a spec: its `hardware.topology` file (relative paths are tried
    against the current directory, then the spec's directory), else the live one, else
    uniform. Its GPU count must match `hardware.count`."""
    if path:
        topology = parse_topology(_read(path, spec_file), path)
    else:
        topology = live() or uniform_topology(count)
    if topology.count != count:
        raise TopologyError(
            f"{spec_file}: hardware.count is {count} but the topology "
            f"({topology.source}) has {topology.count} GPUs"
        )
    return topology


def topology_candidates(path: str | None, spec_file: str) -> list[Path]:
    """Where a spec's `hardware.topology` may be, in the order it is looked up."""
    if not path:
        return []
    candidates = [Path(path)]
    if not Path(path).is_absolute():
        candidates.append(Path(spec_file).parent / path)
    return candidates


def _read(path: str, spec_file: str) -> str:
    candidates = topology_candidates(path, spec_file)
    for candidate in candidates:
        # Whatever exists and is not a directory is the user's file: a pipe or a device
        # there is refused by textfile (not read) instead of being called missing.
        if candidate.exists() and not candidate.is_dir():
            try:
                return textfile.read_text(candidate, MAX_TOPOLOGY_BYTES)
            except (textfile.NotText, OSError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else e
                raise TopologyError(
                    f"{spec_file}: hardware.topology: {printable(str(candidate))}: {reason}"
                ) from None
    tried = " or ".join(printable(str(c)) for c in candidates)
    raise TopologyError(f"{spec_file}: hardware.topology: no such file ({tried})")
