"""The stub-liveness rules of `trident serve` (builder.serve.watch): pure, no server."""

from __future__ import annotations

import pytest

from builder.serve.watch import Stub, StubWatch, parse_stub, runs_in_stub, unhealthy_engines

STUB_ARGS = [
    b"/opt/tritonserver/backends/python/triton_python_backend_stub",
    b"/srv/repo/primary/1/model.py",
    b"triton_python_backend_shm_region_d4656d5f",
    b"1048576",
    b"1048576",
    b"4331",
    b"/opt/tritonserver/backends/python",
    b"336",
    b"primary_0_0",
    b"DEFAULT",
]
STAT = (
    "4347 (triton_python_b) S 4331 4331 4331 0 -1 4194560 "
    + " ".join(["0"] * 12)
    + " 987654 2000 300"
)


def test_parse_stub_reads_model_instance_and_start_time():
    assert parse_stub(4347, b"\0".join(STUB_ARGS) + b"\0", STAT) == Stub(
        4347, "primary", "primary_0_0", 987654
    )


@pytest.mark.parametrize(
    "cmdline",
    [
        b"",  # a dead stub not yet reaped
        b"/usr/bin/python3\0-m\0vllm\0",  # another process of the group
        b"\0".join(STUB_ARGS[:5]),  # not a stub command line
    ],
)
def test_parse_stub_ignores_other_processes(cmdline):
    assert parse_stub(1, cmdline, STAT) is None


def test_unhealthy_engines_reads_the_gauge():
    text = (
        "# TYPE trident_engine_healthy gauge\n"
        'trident_engine_healthy{model="primary"} 0\n'
        'trident_engine_healthy{model="backup"} 1\n'
        'trident_requests_total{model="other"} 0\n'
    )
    assert unhealthy_engines(text) == {"primary"}
    assert unhealthy_engines("") == set()


def stub(pid, instance, started=None):
    return Stub(pid, instance.rsplit("_", 2)[0], instance, started or pid)


def stubs(*items):
    return {s.pid: s for s in items}


def check(watch, *step):
    """One snapshot through the watch; what it found, as lines (None: nothing)."""
    return "; ".join(map(str, watch.check(*step))) or None


def checks(watch, *steps):
    """Run (alive, ready[, unhealthy]) snapshots through the watch; the first finding."""
    for step in steps:
        answer = check(watch, *step)
        if answer:
            return answer
    return None


A0, A1 = stub(10, "qwen_0_0"), stub(11, "qwen_0_1")
B0, B1 = stub(20, "qwen_0_0"), stub(21, "qwen_0_1")
R = stub(12, "router_0_0")


def test_a_killed_stub_of_a_ready_model_is_dead_once_seen_twice():
    watch = StubWatch(stubs(A0, R))
    assert check(watch, stubs(R), {"qwen", "router"}) is None  # seen once
    assert check(watch, stubs(R), {"qwen", "router"}) == (
        "the stub of model 'qwen' (instance qwen_0_0) died"
    )


def test_a_ready_model_without_any_stub_is_dead_once_seen_twice():
    watch = StubWatch(stubs(R))  # qwen's stub died before a check saw it
    assert checks(watch, (stubs(R), {"qwen", "router"}), (stubs(R), {"qwen", "router"})) == (
        "the stub of model 'qwen' died"
    )


def test_runs_in_stub_reads_the_backend():
    assert runs_in_stub('name: "router"\nbackend: "python"\nmax_batch_size: 0\n')
    assert not runs_in_stub('name: "llama"\nbackend: "tensorrtllm"\n')
    assert not runs_in_stub('name: "ensemble"\nplatform: "ensemble"\n')


def test_one_dead_instance_of_two_is_noticed():
    watch = StubWatch(stubs(A0, A1))
    assert "instance qwen_0_1" in checks(watch, (stubs(A0), {"qwen"}), (stubs(A0), {"qwen"}))


@pytest.mark.parametrize(
    "steps",
    [
        # unload: the model leaves READY, then its stub exits
        [(stubs(R), {"router"})] * 3,
        # unload seen half-way: the stub is gone while the index still said READY once
        [(stubs(R), {"qwen", "router"}), (stubs(R), {"router"}), (stubs(R), {"router"})],
        # load again: the new stub starts before the old one exits
        [(stubs(A0, B0, R), {"qwen", "router"}), (stubs(B0, R), {"qwen", "router"})]
        + [(stubs(B0, R), {"qwen", "router"})] * 2,
        # load again between two checks
        [(stubs(B0, R), {"qwen", "router"})] * 3,
    ],
)
def test_unloads_and_reloads_are_not_deaths(steps):
    assert checks(StubWatch(stubs(A0, R)), *steps) is None


def test_a_reload_with_fewer_instances_is_not_a_death():
    watch = StubWatch(stubs(A0, A1))
    assert (
        checks(watch, (stubs(A0, A1, B0), {"qwen"}), (stubs(B0), {"qwen"}), (stubs(B0), {"qwen"}))
        is None
    )


def test_a_failed_reload_is_not_a_death():
    watch = StubWatch(stubs(A0))  # the new stub dies while loading; the old one serves on
    assert (
        checks(watch, (stubs(A0, B0), {"qwen"}), (stubs(A0), {"qwen"}), (stubs(A0), {"qwen"}))
        is None
    )


def test_an_engine_reporting_itself_dead_counts_once_seen_twice():
    watch = StubWatch(stubs(A0, R))
    alive, ready = stubs(A0, R), {"qwen", "router"}
    assert check(watch, alive, ready, {"qwen"}) is None
    assert check(watch, alive, ready, {"qwen"}) == (
        "the engine of model 'qwen' died (trident_engine_healthy is 0)"
    )


def test_a_zero_gauge_of_a_model_not_ready_is_ignored():
    watch = StubWatch(stubs(R))  # qwen was unloaded; its series keeps its last value
    assert checks(watch, *[(stubs(R), {"router"}, {"qwen"})] * 3) is None


def test_two_models_dead_at_once_are_both_named_with_their_model():
    q0, r0 = stub(10, "qwen_0_0"), stub(30, "rag_0_0")
    watch = StubWatch(stubs(q0, r0, R))
    assert watch.check(stubs(R), {"qwen", "rag", "router"}) == []
    deaths = watch.check(stubs(R), {"qwen", "rag", "router"})
    assert [d.model for d in deaths] == ["qwen", "rag"]
    assert str(deaths[1]) == "the stub of model 'rag' (instance rag_0_0) died"


def test_a_model_that_unloaded_itself_with_a_dead_engine_is_dead():
    # vLLM's health check unloads the model when its engine dies: it leaves READY with its
    # gauge at 0, possibly before any check saw the gauge.
    watch = StubWatch(stubs(A0, R))
    assert check(watch, stubs(A0, R), {"qwen", "router"}) is None
    assert check(watch, stubs(R), {"router"}, {"qwen"}) == (
        "the engine of model 'qwen' died (trident_engine_healthy is 0) and the model "
        "unloaded itself"
    )


def test_a_stale_heartbeat_of_a_watched_stub_is_a_hang_and_nothing_else_is(tmp_path):
    """hung_stubs judges only the stubs of watched (READY, not reloading) models that beat:
    a stub without a heartbeat file (loading, finalising, not trident's) never hangs."""
    import os

    from builder.serve.watch import forget_heartbeat, heartbeats, hung_stubs

    stubs = {
        10: Stub(10, "router", "router_0", 1),  # stale: hung
        11: Stub(11, "qa", "qa_0", 1),  # fresh
        12: Stub(12, "qb", "qb_0", 1),  # stale, but its model is reloading (not watched)
        13: Stub(13, "qc", "qc_0", 1),  # no heartbeat at all
    }
    now = 1_000_000.0
    for pid, age_s in ((10, 31.0), (11, 0.5), (12, 99.0), (99, 500.0)):  # 99: no stub
        path = tmp_path / f"alive.{pid}"
        path.touch()
        os.utime(path, (now - age_s, now - age_s))
    (tmp_path / "alive.x").touch()  # not a pid: ignored
    beats = heartbeats(tmp_path)
    assert set(beats) == {10, 11, 12, 99}
    watched = {"router", "qa", "qc"}
    assert hung_stubs(stubs, beats, watched, now, 30.0) == [(stubs[10], 31.0)]
    assert hung_stubs(stubs, beats, watched, now, 32.0) == []
    forget_heartbeat(tmp_path, 10)
    forget_heartbeat(tmp_path, 10)  # twice: nothing to forget is fine
    assert hung_stubs(stubs, heartbeats(tmp_path), watched, now, 30.0) == []
