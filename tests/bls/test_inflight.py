"""bls/inflight.py: a router's instances (stub processes) share their in-flight counts,
so a backend's limit holds for the router as a whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from bls.inflight import Inflight, instance_slot, shared_path

NAMES = ["primary", "backup"]
ROOT = Path(__file__).resolve().parents[2]


def test_one_instance_counts_alone_in_its_own_memory(tmp_path):
    counts = Inflight.shared(NAMES, 1, "router_0_0", str(tmp_path), "router")
    counts.add("primary", 2)
    assert dict(counts) == {"primary": 2, "backup": 0}
    assert list(tmp_path.iterdir()) == []  # nothing shared, nothing written


def test_another_process_sees_this_instances_requests_and_its_own(tmp_path):
    path = shared_path(str(tmp_path), "router", NAMES, 2)
    mine = Inflight(NAMES, 2, 0, path)
    mine.add("primary", 3)
    # The other instance: a process of its own, as each router stub is.
    other = textwrap.dedent(
        f"""
        from bls.inflight import Inflight
        counts = Inflight({NAMES!r}, 2, 1, {path!r})
        counts.add("primary", 2)
        counts.add("backup", 1)
        print(counts["primary"], counts["backup"])
        """
    )
    seen = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
    assert seen.stdout.split() == ["5", "1"], seen.stderr
    assert mine["primary"] == 5 and mine["backup"] == 1
    mine.add("primary", -3)
    assert mine["primary"] == 2  # only the other instance's are left


def test_an_instance_that_starts_again_forgets_only_its_own_requests(tmp_path):
    path = shared_path(str(tmp_path), "router", NAMES, 2)
    first, second = Inflight(NAMES, 2, 0, path), Inflight(NAMES, 2, 1, path)
    first.add("backup", 4)
    second.add("backup", 1)
    # A killed stub's requests died with it: its successor starts from 0 in its slot.
    Inflight(NAMES, 2, 1, path)
    assert first["backup"] == 4


def test_a_layout_change_uses_another_file_and_an_unknown_slot_counts_alone(tmp_path):
    assert shared_path(str(tmp_path), "r", NAMES, 2) != shared_path(str(tmp_path), "r", NAMES, 3)
    assert shared_path(None, "r", NAMES, 2) != shared_path(str(tmp_path), "r", NAMES, 2)
    assert instance_slot("router_0_1", 2) == 1
    assert instance_slot("router_0_2", 2) is None and instance_slot(None, 2) is None
    counts = Inflight.shared(NAMES, 2, "odd-name", str(tmp_path), "router")
    assert counts.instances == 1 and list(tmp_path.iterdir()) == []
