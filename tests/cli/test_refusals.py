"""Inputs the command line must refuse at once, in one line, without touching a file:
`mig plan --out` over a user's file or the spec's topology file, a named pipe as a spec,
absurd MIG counts, and files that are not UTF-8 (topology, config.pbtxt)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.helpers import hostile_specs as hs

ROOT = Path(__file__).resolve().parents[2]
H100X8 = ROOT / "deploy/examples/h100x8.yaml"
TOPOLOGY = ROOT / "tests/fixtures/topo/hgx-h100x8.txt"


def one_line_refusal(argv: list[str], code: int, *words: str) -> str:
    got, stderr = hs.call_cli(argv)
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert got == code, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def h100_spec(tmp_path) -> Path:
    """h100x8.yaml beside its own copy of the topology file (relative path)."""
    shutil.copy(TOPOLOGY, tmp_path / "topo.txt")
    data = yaml.safe_load(H100X8.read_text())
    data["hardware"]["topology"] = "topo.txt"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


# ---------------------------------------------------------------------------------------
# mig plan --out: the guard of repo/k8s/monitoring, for one file


def test_mig_plan_never_writes_over_the_topology_file(h100_spec, tmp_path):
    before = (tmp_path / "topo.txt").read_bytes()
    one_line_refusal(
        ["mig", "plan", "--spec", str(h100_spec), "--out", str(tmp_path / "topo.txt")],
        2,
        "topo.txt",
    )
    assert (tmp_path / "topo.txt").read_bytes() == before


def test_mig_plan_never_writes_over_a_users_file(h100_spec, tmp_path):
    users = tmp_path / "mig.yaml"
    users.write_text("version: v1\nmig-configs: {mine: []}\n")
    one_line_refusal(
        ["mig", "plan", "--spec", str(h100_spec), "--out", str(users)], 2, "not written by trident"
    )
    assert users.read_text() == "version: v1\nmig-configs: {mine: []}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mig.yaml", "spec.yaml", "topo.txt"]


def test_mig_plan_replaces_its_own_file(h100_spec, tmp_path):
    out = tmp_path / "mig.yaml"
    for _ in range(2):  # the second run replaces the first one's file
        code, stderr = hs.call_cli(["mig", "plan", "--spec", str(h100_spec), "--out", str(out)])
        assert code == 0, stderr
    assert yaml.safe_load(out.read_text())["version"] == "v1"


def test_mig_plan_refuses_a_named_pipe_as_out(h100_spec, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    one_line_refusal(
        ["mig", "plan", "--spec", str(h100_spec), "--out", str(tmp_path / "pipe")], 2, "pipe"
    )


# ---------------------------------------------------------------------------------------
# Inputs that used to hang


def test_a_named_pipe_as_spec_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "spec.yaml")
    one_line_refusal(
        ["repo", "--spec", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "out")],
        2,
        "spec.yaml",
        "not a regular file",
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "profiles", ["1g.10gb=99999999999999999999", "1g.10gb=8000000", "1g.10gb=\u00b2"]
)
def test_absurd_mig_counts_are_bad_input(profiles):
    one_line_refusal(
        ["mig", "check", "--gpu", "H100-80GB", "--profiles", profiles],
        2,
        "--profiles",
        "COUNT from 1 to 99",
    )


def test_counts_of_one_profile_add_up_before_expanding():
    code, stderr = hs.call_cli(
        ["mig", "check", "--gpu", "H100-80GB", "--profiles", "1g.10gb=7,1g.10gb=7"]
    )
    assert code == 1 and "14 × 1g.10gb is more than the 7" in stderr


# ---------------------------------------------------------------------------------------
# Files that are not UTF-8


@pytest.mark.parametrize("command", ["plan", "repo", "k8s", "mig plan"])
def test_non_utf8_topology_is_one_line_naming_the_file(h100_spec, tmp_path, command):
    (tmp_path / "topo.txt").write_bytes(TOPOLOGY.read_bytes().replace(b"NV18", b"NV\xff8", 1))
    argv = [*command.split(), "--spec", str(h100_spec)]
    if command != "plan":
        argv += ["--out", str(tmp_path / "out")]
    one_line_refusal(argv, 2, "topo.txt", "not UTF-8")
    assert not (tmp_path / "out").exists()


def test_a_named_pipe_as_topology_is_one_line_saying_so(h100_spec, tmp_path):
    (tmp_path / "topo.txt").unlink()
    os.mkfifo(tmp_path / "topo.txt")
    one_line_refusal(["plan", "--spec", str(h100_spec)], 2, "topo.txt", "not a regular file")


def test_validate_names_a_non_utf8_config(tmp_path):
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_bytes(b'name: "m"\nbackend: "python"\n# caf\xe9\n')
    code, stderr = hs.call_cli(["validate", str(tmp_path / "repo")])
    assert code == 1 and "Traceback" not in stderr, stderr
    assert "m/config.pbtxt: line 3: not UTF-8" in stderr
