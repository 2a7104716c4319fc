"""Loading models one by one (builder.serve.loading) and the restart policy of `trident
serve` (builder.serve.keeper.Restarts): pure, no server."""

from __future__ import annotations

import pytest

from builder.serve.keeper import Restarts
from builder.serve.loading import dependencies, load_order, load_stage
from tests.helpers.servers import render

TWO_ENGINES = {
    "name": "two",
    "hardware": {"gpu": "cpu"},
    "models": [
        {"name": "zeta", "engine": "sglang", "model": "/models/test-double"},
        {"name": "alpha", "engine": "sglang", "model": "/models/test-double"},
    ],
    "router": {"name": "aaa-router", "default": ["zeta"], "fallback": {"zeta": ["alpha"]}},
}


def test_a_rendered_router_depends_on_its_backends(tmp_path):
    repo = render(TWO_ENGINES, tmp_path / "repo")
    assert dependencies(repo) == {"aaa-router": {"alpha", "zeta"}, "alpha": set(), "zeta": set()}


def test_an_ensemble_depends_on_its_steps(tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.pbtxt").write_text(
        'name: "llama"\nplatform: "ensemble"\nensemble_scheduling {\n step [\n'
        '  { model_name: "preprocessing" model_version: -1 },\n'
        '  { model_name: "tensorrt_llm" model_version: -1 } ] }\n'
    )
    assert dependencies(tmp_path) == {"llama": {"preprocessing", "tensorrt_llm"}}


def test_engine_models_load_before_the_router_that_calls_them():
    # alphabetically the router would come first
    deps = {"aaa-router": {"alpha", "zeta"}, "alpha": set(), "zeta": set()}
    assert load_order(["zeta", "aaa-router", "alpha"], deps) == ["alpha", "zeta", "aaa-router"]


def test_only_the_wanted_models_load():
    deps = {"router": {"a", "b"}, "a": set(), "b": set()}
    assert load_order(["router"], deps) == ["router"]
    assert load_order(["router", "b"], deps) == ["b", "router"]


def test_a_chain_and_a_cycle_still_give_every_model_once():
    assert load_order(["c", "b", "a"], {"c": {"b"}, "b": {"a"}}) == ["a", "b", "c"]
    assert load_order(["x", "y", "z"], {"x": {"y"}, "y": {"x"}}) == ["z", "x", "y"]


LOG = [
    'I1201 16:16:19.873663 8423 model_lifecycle.cc:472] "loading: other:1"',
    'I1201 16:16:20.106202 8423 model_lifecycle.cc:472] "loading: primary:1"',
    'I1201 16:16:20.107311 8423 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: '
    'primary_0_0 (CPU device 0)"',
    'I1201 16:16:20.328875 8423 log.py:48] "[vllm] Starting the engine of model primary"',
    "INFO 12-01 16:16:25 [core.py:93] Initializing a V1 LLM engine",
    'I1201 16:16:40.330426 8423 log.py:48] "[vllm] The engine of model primary is ready"',
]


@pytest.mark.parametrize(
    "lines, stubs, expected",
    [
        (LOG[:1], [], "tritonserver has not begun loading it (no stub process running)"),
        (LOG[:2], [], "tritonserver is preparing it, no instance created yet"),
        (
            LOG[:3],
            [77],
            "instance primary_0_0 created, not yet loaded (its stub process 77 "
            "running); the model has logged nothing",
        ),
        (
            LOG,
            [77],
            "instance primary_0_0 created, not yet loaded (its stub process 77 "
            "running); the model's last log line: '[vllm] The engine of model primary "
            "is ready'",
        ),
        (
            LOG[:5],
            [],
            "instance primary_0_0 created, but its stub exited or never started (no "
            "stub process running); the model's last log line: '[vllm] Starting the "
            "engine of model primary'",
        ),
    ],
)
def test_a_stuck_load_is_described_from_the_log_and_the_stubs(lines, stubs, expected):
    assert load_stage("primary", lines, stubs).startswith(expected)


def test_restarts_back_off_then_give_up():
    policy = Restarts(limit=3, first_delay_s=1, max_delay_s=3, stable_s=100)
    assert [policy.after_death("m", t) for t in (0, 5, 10, 15)] == [1, 2, 3, None]
    assert policy.after_death("other", 15) == 1  # counted per model


def test_a_model_that_served_long_enough_starts_counting_afresh():
    policy = Restarts(limit=2, first_delay_s=1, max_delay_s=30, stable_s=100)
    assert policy.after_death("m", 0) == 1
    policy.came_back("m", 2)
    assert policy.after_death("m", 50) == 2  # died again soon: backs off
    policy.came_back("m", 53)
    assert policy.after_death("m", 200) == 1  # served 147 s: a fresh start
