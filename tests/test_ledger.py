"""The run's ledger (tests/helpers/ledger.py) reads engine loads from real Triton log
lines and counts a model loaded again in the same server's repository as a reload, and
one loaded again after the pool swapped the repository (tests/helpers/pool.py) as a
load. A start is recorded before its server writes its log, as in a run."""

from __future__ import annotations

import pytest

from tests.helpers import ledger

# Lines as the Python backend's logger writes them into tritonserver's log.
LOG = """\
I1204 00:02:11.500893 15230 log.py:58] "[vllm] Starting the engine of model backup"
(EngineCore pid=15286) INFO 12-04 00:02:35 [core.py:133] Initializing a V1 LLM engine
I1204 00:02:47.084372 15230 log.py:58] "[vllm] The engine of model backup is ready"
I1204 00:02:47.329913 15230 log.py:58] "[vllm] Starting the engine of model primary"
I1204 00:03:28.545910 15230 log.py:58] "[vllm] The engine of model primary is ready"
I1204 00:03:30.000000 15230 log.py:58] "[sglang] Starting the engine of model qwen"
I1204 00:03:32.500000 15230 log.py:58] "[sglang] The engine of model qwen is ready"
I1204 23:59:50.000000 15230 log.py:58] "[vllm] Starting the engine of model primary"
I1205 00:00:30.000000 15230 log.py:58] "[vllm] The engine of model primary is ready"
I1205 00:01:00.000000 15230 log.py:58] "[vllm] Starting the engine of model backup"
"""
# The paced AsyncLLM double's load (support/engine_doubles), and a model that fails.
DOUBLE_LOG = """\
I1204 01:00:00.000000 15230 log.py:58] "[vllm] Starting the engine of model smollm2"
[vllm double] the paced AsyncLLM double stands in for vLLM
I1204 01:00:01.500000 15230 log.py:58] "[vllm] The engine of model smollm2 is ready"
I1204 01:00:02.000000 15230 log.py:58] "[vllm] Starting the engine of model ghost"
"""


def test_loads_reloads_and_a_load_that_never_finished(tmp_path, monkeypatch):
    log = tmp_path / "tritonserver.log"
    runs = ledger.Ledger()
    runs.record("tritonserver", "fallback0/repo", log).ready()
    log.write_text(LOG)
    loads = ledger.engine_loads(log)
    assert [(e.engine, e.model, e.seconds) for e in loads] == [
        ("vllm", "backup", pytest.approx(35.583479)),
        ("vllm", "primary", pytest.approx(41.215997)),
        ("sglang", "qwen", 2.5),
        ("vllm", "primary", 40.0),  # across midnight
        ("vllm", "backup", None),  # the log ends before it was ready
    ]
    runs.record("trident serve", "a subprocess", None, tritonservers=2)
    counts = runs.counts()
    assert counts == {  # the load that never finished is listed, not counted
        "tritonserver starts": 3,
        "repository swaps": 0,
        "real vLLM loads": 2,
        "vLLM reloads": 1,
        "engine double loads": 1,
    }
    assert any("never ready" in line for line in runs.summary())
    monkeypatch.setattr(ledger, "BUDGET", {"tritonserver starts": 3, "real vLLM loads": 1})
    assert runs.over_budget() == ["real vLLM loads: 2 > budget 1 (tests/helpers/ledger.py)"]
    every = runs.every_start()  # what an over-budget run prints: each start and its test
    assert len(every) == 2 and "x2 a subprocess" in every[1]


def test_the_vllm_doubles_loads_and_failed_loads_are_no_real_vllm_loads(tmp_path):
    log = tmp_path / "tritonserver.log"
    runs = ledger.Ledger()
    runs.record("tritonserver", "vllm-double0/repo", log).ready()
    log.write_text(DOUBLE_LOG)
    assert [(e.engine, e.model, e.seconds) for e in ledger.engine_loads(log)] == [
        ("vllm double", "smollm2", 1.5),
        ("vllm", "ghost", None),
    ]
    assert runs.counts() == {
        "tritonserver starts": 1,
        "repository swaps": 0,
        "real vLLM loads": 0,
        "vLLM reloads": 0,
        "engine double loads": 1,
    }


def test_a_workers_ledger_joins_the_controllers(tmp_path):
    """pytest-xdist: each worker's starts and engine loads count in the run's ledger."""
    log = tmp_path / "tritonserver.log"
    worker = ledger.Ledger()
    worker.record("tritonserver", "fallback0/repo", log).ready()
    log.write_text(LOG)
    worker.engine_without_server("vllm", "kv-events", 30.0)
    run = ledger.Ledger()
    run.record("trident serve", "a subprocess", None, tritonservers=2)
    run.merge(worker.to_json())
    assert run.counts() == {
        "tritonserver starts": 3,
        "repository swaps": 0,
        "real vLLM loads": 3,
        "vLLM reloads": 1,
        "engine double loads": 1,
    }


def test_a_swapped_repositorys_loads_are_its_own(tmp_path):
    """One process, two repositories in turn: `primary` loaded in each is two loads, and
    each load is listed under the repository it served."""
    log = tmp_path / "tritonserver.log"
    runs = ledger.Ledger()
    runs.record("tritonserver", "default0/repo", log).ready()
    first, second = LOG.splitlines(keepends=True)[3:5], LOG.splitlines(keepends=True)[7:9]
    log.write_text("".join(first))
    runs.record("repository swap", "lora0/repo", log, tritonservers=0).ready()
    with open(log, "a") as more:
        more.write("".join(second))
    assert runs.counts() == {
        "tritonserver starts": 1,
        "repository swaps": 1,
        "real vLLM loads": 2,
        "vLLM reloads": 0,
        "engine double loads": 0,
    }
    assert [(e.model, e.where) for e in runs.engine_loads()] == [
        ("primary", "default0/repo"),
        ("primary", "lora0/repo"),
    ]
