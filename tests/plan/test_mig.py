"""MIG: profile tables, legal placements, packing over GPUs, mig-parted config, CLI."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builder.cli.main import main
from builder.plan import mig
from builder.plan.gpus import GPU_TYPES

H100 = GPU_TYPES["H100-80GB"]


def assert_legal(gpu, slices):
    """The MIG user guide's rules, checked independently of the planner's search."""
    used = []
    for s in slices:
        assert s.start in s.profile.starts, s
        used += list(s.memory_slices)
    assert len(used) == len(set(used)), "two slices share a memory slice"
    assert max(used, default=0) < gpu.memory_slices
    for name, count in Counter(s.profile.name for s in slices).items():
        assert count <= gpu.mig_profile(name).max_count
    assert sum(s.profile.compute_slices for s in slices) <= gpu.compute_slices


def exists_by_brute_force(gpu, profiles) -> bool:
    """Oracle: try every combination of legal starts."""
    if any(c > gpu.mig_profile(n).max_count for n, c in Counter(p.name for p in profiles).items()):
        return False
    if sum(p.compute_slices for p in profiles) > gpu.compute_slices:
        return False
    for starts in itertools.product(*(p.starts for p in profiles)):
        used = [
            m for p, s in zip(profiles, starts, strict=True) for m in range(s, s + p.memory_slices)
        ]
        if len(used) == len(set(used)):
            return True
    return False


def test_tables_follow_the_mig_user_guide():
    assert [p.name for p in H100.mig_profiles] == [
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ]
    assert H100.mig_profile("3g.40gb").starts == (0, 4)
    assert H100.mig_profile("1g.10gb").max_count == 7
    assert GPU_TYPES["A100-40GB"].mig_profile("1g.5gb").memory_gib == 5
    assert GPU_TYPES["H200-141GB"].mig_profile("7g.141gb").memory_slices == 8
    assert GPU_TYPES["H100-94GB"].mig_profile("3g.47gb").max_count == 2
    a30 = GPU_TYPES["A30-24GB"]
    assert (a30.memory_slices, a30.compute_slices) == (4, 4)
    assert a30.mig_profile("2g.12gb").starts == (0, 2)
    assert H100.mig_profile("3g.40gb").kubernetes_resource == "nvidia.com/mig-3g.40gb"


@pytest.mark.parametrize(
    "counts, starts",
    [
        ([("4g.40gb", 1), ("3g.40gb", 1)], [("4g.40gb", 0), ("3g.40gb", 4)]),
        ([("3g.40gb", 2)], [("3g.40gb", 0), ("3g.40gb", 4)]),
        ([("1g.10gb", 7)], [("1g.10gb", s) for s in range(7)]),
        (
            [("2g.20gb", 3), ("1g.10gb", 1)],
            [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)],
        ),
        ([("7g.80gb", 1)], [("7g.80gb", 0)]),
    ],
)
def test_legal_layouts(counts, starts):
    slices = mig.check_layout(H100, counts)
    assert [(s.profile.name, s.start) for s in slices] == starts
    assert_legal(H100, slices)


@pytest.mark.parametrize(
    "counts, reason",
    [
        ([("1g.10gb", 8)], "8 × 1g.10gb is more than the 7 one H100-80GB can hold"),
        ([("3g.40gb", 3)], "3 × 3g.40gb is more than the 2"),
        (
            [("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)],
            "needs 8 compute slices but one H100-80GB has 7",
        ),
        ([("2g.10gb", 1)], "H100-80GB has no MIG profile '2g.10gb'"),
        ([("7g.80gb", 1), ("1g.10gb", 1)], "needs 8 compute slices"),
        (
            [("4g.40gb", 1), ("1g.20gb", 2), ("1g.10gb", 1)],
            "needs 9 memory slices but one H100-80GB has 8",
        ),
    ],
)
def test_illegal_layouts_say_why(counts, reason):
    with pytest.raises(mig.MigError, match=reason.replace("(", r"\(")):
        mig.check_layout(H100, counts)


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("4g.40gb=1,3g.40gb=1", [("4g.40gb", 1), ("3g.40gb", 1)]),
        ("3g.40gb", [("3g.40gb", 1)]),
        (" 1g.10gb=7 , ", [("1g.10gb", 7)]),
    ],
)
def test_parse_profile_counts(text, parsed):
    assert mig.parse_profile_counts(text) == parsed


@pytest.mark.parametrize("text", ["", "3g.40gb=0", "3g.40gb=x"])
def test_parse_profile_counts_rejects(text):
    with pytest.raises(mig.MigError):
        mig.parse_profile_counts(text)


gpu_names = st.sampled_from(sorted(GPU_TYPES))


@settings(max_examples=300, deadline=None)
@given(gpu_names, st.data())
def test_place_on_gpu_is_legal_and_complete(gpu_name, data):
    gpu = GPU_TYPES[gpu_name]
    profiles = data.draw(st.lists(st.sampled_from(gpu.mig_profiles), min_size=1, max_size=4))
    possible = exists_by_brute_force(gpu, profiles)
    try:
        slices = mig.place_on_gpu(gpu, profiles)
    except mig.MigError:
        assert not possible, f"rejected a layout that exists: {[p.name for p in profiles]}"
        return
    assert possible
    assert sorted(s.profile.name for s in slices) == sorted(p.name for p in profiles)
    assert_legal(gpu, slices)


@settings(max_examples=200, deadline=None)
@given(gpu_names, st.data())
def test_pack_assigns_every_request_to_a_legal_slice(gpu_name, data):
    gpu = GPU_TYPES[gpu_name]
    plain = [p for p in gpu.mig_profiles if "+" not in p.name]
    wanted = data.draw(st.lists(st.sampled_from(plain), min_size=1, max_size=12))
    gpus = list(range(data.draw(st.integers(1, 3))))
    requests = [mig.SliceRequest("m", k, p) for k, p in enumerate(wanted)]
    try:
        layouts, assignments = mig.pack(gpu, requests, gpus)
    except mig.MigError as e:
        assert "no room" in str(e)
        if len(gpus) == 1:  # on one GPU first fit is exact: it fails only if nothing fits
            with pytest.raises(mig.MigError):
                mig.place_on_gpu(gpu, wanted)
        return
    assert sorted(a.request.instance for a in assignments) == list(range(len(wanted)))
    for ordinal, slices in layouts.items():
        assert ordinal in gpus
        assert_legal(gpu, slices)
    for a in assignments:
        assert a.slice in layouts[a.gpu] and a.slice.profile == a.request.profile
    devices = [a.device for a in assignments]
    assert len(devices) == len(set(devices)), "two instances share a slice"


def test_pack_fails_when_slices_outnumber_gpus():
    one_g = H100.mig_profile("1g.10gb")
    requests = [mig.SliceRequest("small", k, one_g) for k in range(8)]
    with pytest.raises(mig.MigError, match="small instance .*no room for a 1g.10gb slice"):
        mig.pack(H100, requests, [0])
    layouts, _ = mig.pack(H100, requests, [0, 1])
    assert [len(layouts[0]), len(layouts[1])] == [7, 1]


def test_mig_parted_config_groups_equal_gpus():
    three_g = H100.mig_profile("3g.40gb")
    layouts = {
        6: (mig.Slice(three_g, 0), mig.Slice(three_g, 4)),
        7: (mig.Slice(three_g, 0), mig.Slice(three_g, 4)),
    }
    config = mig.mig_parted_config("trident-x", 8, layouts)
    assert config["version"] == "v1"
    assert config["mig-configs"]["trident-x"] == [
        {"devices": [0, 1, 2, 3, 4, 5], "mig-enabled": False},
        {"devices": [6, 7], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
    ]


def test_cli_mig_check_exit_codes(capsys):
    assert main(["mig", "check", "--gpu", "H100-80GB", "--profiles", "4g.40gb=1,3g.40gb=1"]) == 0
    assert "legal on H100-80GB: 4g.40gb@0, 3g.40gb@4" in capsys.readouterr().out
    assert main(["mig", "check", "--gpu", "H100-80GB", "--profiles", "1g.10gb=8"]) == 1
    assert "more than the 7" in capsys.readouterr().err
    assert main(["mig", "check", "--gpu", "H100-80GB", "--profiles", "2g.10gb=1"]) == 1
    assert "no MIG profile '2g.10gb'" in capsys.readouterr().err
    assert main(["mig", "check", "--gpu", "V100", "--profiles", "1g.10gb=1"]) == 2
    assert "'V100' is not one of" in capsys.readouterr().err
    # Issue 34: an entry without a profile was "no MIG profile ''", exit 1.
    assert main(["mig", "check", "--gpu", "H100-80GB", "--profiles", "=,=,"]) == 2
    assert "--profiles: '=': expected PROFILE=COUNT, the profile is missing" in (
        capsys.readouterr().err
    )
