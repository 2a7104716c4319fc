"""`nvidia-smi topo -m` parsing and tensor-parallel group choice, on real-format fixtures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builder.plan import topology as topo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topo"


def load(name: str) -> topo.Topology:
    return topo.parse_topology((FIXTURES / name).read_text(), name)


def test_hgx_board_every_pair_nvswitch():
    t = load("hgx-h100x8.txt")  # saved with terminal escapes and NIC rows
    assert t.count == 8
    assert all(t.links[i][j] == "NV18" for i in range(8) for j in range(8) if i != j)
    assert t.numa == (0, 0, 0, 0, 1, 1, 1, 1)
    assert topo.best_group(t, range(8), 2) == (0, 1)
    assert topo.best_group(t, range(8), 4) == (0, 1, 2, 3)  # same NUMA node first
    assert topo.best_group(t, [2, 3, 4, 5, 6], 3) == (4, 5, 6)  # ...even if not lowest
    assert topo.best_group(t, range(8), 8) == tuple(range(8))


def test_pcie_box_groups_follow_the_switches():
    t = load("pcie-2numa-x8.txt")
    assert t.links[0][1] == "PIX" and t.links[2][3] == "PXB" and t.links[0][2] == "NODE"
    assert t.links[3][4] == "SYS"
    assert topo.best_group(t, range(8), 2) == (0, 1)  # PIX pair
    assert topo.best_group(t, [2, 3, 4, 5], 2) == (4, 5)  # PIX beats PXB
    assert topo.best_group(t, [2, 3, 6, 7], 2) == (2, 3)  # PXB, lowest ordinals
    assert topo.best_group(t, range(8), 4) == (0, 1, 2, 3)  # one NUMA node
    no_cross_numa = topo.CROSS_NUMA_SCORE + 1
    assert topo.best_group(t, range(8), 8, no_cross_numa) is None
    assert topo.best_group(t, [0, 1, 2, 4], 4, no_cross_numa) is None
    assert topo.best_group(t, [0, 4], 2) == (0, 4)  # allowed without limit


def test_nvlink_bridged_pairs():
    t = load("nvlink-bridge-x4.txt")
    assert t.count == 4 and t.numa == (0, 0, 0, 0)
    assert topo.best_group(t, range(4), 2) == (0, 1)
    assert topo.best_group(t, [1, 2, 3], 2) == (2, 3)  # the bridged pair
    assert t.slowest_link((0, 1, 2, 3)) == "NODE"
    assert topo.link_score("NV12") > topo.link_score("PIX") > topo.link_score("SYS")


def test_empty_cpu_affinity_keeps_numa_column_in_place():
    # Real boxes report an unknown CPU affinity as an empty cell ("\t\t0"), and an empty
    # cell sits before "GPU NUMA ID" on every row.
    text = (
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\tPIX\t\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tNODE\t1\t1\t\tN/A\n"
        "NIC0\tPIX\tNODE\t X \t\t\t\t\n"
    )
    t = topo.parse_topology(text)
    assert t.links == (("X", "NV18"), ("NV18", "X")) and t.numa == (0, 1)


def test_indented_output_without_a_corner_cell():
    # As pasted by tools that print the matrix indented (e.g. environment reports).
    text = (
        "    GPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
        "    GPU0\t X \tSYS\t0-7\t0\n"
        "    GPU1\tSYS\t X \t8-15\t1\n"
    )
    t = topo.parse_topology(text)
    assert t.links[0][1] == "SYS" and t.numa == (0, 1)
    assert topo.best_group(t, range(2), 2, topo.CROSS_NUMA_SCORE + 1) is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("no matrix here\n", "no `nvidia-smi topo -m` header"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tQPI\t X \n", "unknown link 'QPI'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tPIX\t X \n", "GPU0-GPU1 is NV4 but GPU1-GPU0 is PIX"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\n", "2 GPU columns but 1 GPU rows"),
        ("\tGPU0\tGPU2\nGPU0\t X \tNV4\n", "not GPU0..GPUn"),
    ],
)
def test_bad_matrices_are_rejected(text, message):
    with pytest.raises(topo.TopologyError, match=message):
        topo.parse_topology(text, "t.txt")


def test_load_topology_checks_count_and_paths(tmp_path):
    spec_file = str(tmp_path / "spec.yaml")
    (tmp_path / "topo.txt").write_text((FIXTURES / "nvlink-bridge-x4.txt").read_text())
    assert topo.load_topology("topo.txt", 4, spec_file).count == 4  # beside the spec
    with pytest.raises(topo.TopologyError, match="hardware.count is 8 but the topology"):
        topo.load_topology("topo.txt", 8, spec_file)
    with pytest.raises(topo.TopologyError, match="hardware.topology: no such file"):
        topo.load_topology("missing.txt", 4, spec_file)


def test_a_named_pipe_as_topology_is_not_called_missing(tmp_path):
    # Before: is_file() is false for a pipe, so an existing file was "no such file".
    spec_file = str(tmp_path / "spec.yaml")
    os.mkfifo(tmp_path / "topo.txt")
    for path in ("topo.txt", str(tmp_path / "topo.txt")):  # beside the spec; absolute
        with pytest.raises(topo.TopologyError) as error:
            topo.load_topology(path, 4, spec_file)
        assert str(error.value) == (
            f"{spec_file}: hardware.topology: {tmp_path}/topo.txt: "
            "not a regular file (a pipe, device or socket); give a "
            "file"
        )


def test_live_detection_is_injected():
    text = (FIXTURES / "nvlink-bridge-x4.txt").read_text()
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    live = topo.read_live(run=run, which=lambda name: "/usr/bin/nvidia-smi")
    assert calls == [["nvidia-smi", "topo", "-m"]] and live.count == 4
    assert topo.read_live(run=run, which=lambda name: None) is None
    uniform = topo.load_topology(None, 3, "s.yaml", live=lambda: None)
    assert not uniform.known and uniform.count == 3
    assert topo.best_group(uniform, range(3), 2) == (0, 1)


def test_live_failure_is_reported():
    def run(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 9, stdout="", stderr="NVML: driver gone")

    with pytest.raises(topo.TopologyError, match="driver gone"):
        topo.read_live(run=run, which=lambda name: "/usr/bin/nvidia-smi")
