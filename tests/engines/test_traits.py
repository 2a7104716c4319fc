"""The engine traits table agrees with what else knows an engine: the spec's argument
tables, the renderers, the templates' backends; and the builder speaks each engine's
arguments by the table's names."""

from __future__ import annotations

import pytest

from builder.engines.traits import ENGINES, TRAITS, traits
from builder.plan import placement, planner
from builder.plan.model import InstancePlacement, ModelPlan, Plan
from builder.render.context import PROJECT_ROOT
from builder.render.repository import ENGINE_RENDERERS
from builder.spec import ENGINES as SPEC_ENGINES
from builder.spec import ModelSpec
from builder.spec.engine_args import ENGINE_ARGS


def test_every_engine_the_spec_admits_has_traits_and_a_renderer():
    assert set(SPEC_ENGINES) == set(ENGINES) == set(ENGINE_RENDERERS) == set(ENGINE_ARGS)


@pytest.mark.parametrize("engine", ENGINES)
def test_each_named_argument_is_one_the_user_may_set(engine):
    """A misspelt trait would make the planner read an argument no spec can hold."""
    t = traits(engine)
    named = (
        t.tp_arg,
        t.pp_arg,
        t.batch_arg,
        t.capacity_arg,
        t.context_arg,
        t.memory_arg,
        t.kv_cache_dtype_arg,
        t.speculative_arg,
    )
    missing = [name for name in named if name is not None and name not in ENGINE_ARGS[engine]]
    assert not missing, f"{engine}: {missing} are not in builder/spec/engine_args.py"


@pytest.mark.parametrize("engine", [t.name for t in TRAITS.values() if t.python_backend])
def test_a_python_backend_engine_has_its_model_and_the_arguments_it_is_started_with(engine):
    t = traits(engine)
    assert (PROJECT_ROOT / "python_backends" / engine / "model.py").is_file()
    assert t.model_arg and t.tp_arg and t.pp_arg and not t.built


def _model(engine: str, **args) -> ModelSpec:
    return ModelSpec("m", engine, "builtin:tiny", engine_args=args)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_planner_and_placement_use_the_engines_own_names(engine):
    t = traits(engine)
    model = _model(
        engine,
        **{t.tp_arg: 2, t.pp_arg: 3, t.batch_arg: 5, t.context_arg: 77, t.memory_arg: 0.5},
    )
    assert planner.explicit_parallelism(model) == (2, 3)
    assert planner._targets(model) == (5, 77)
    assert planner.utilization(model) == 0.5
    plan = Plan(
        None, 0, None, {"m": ModelPlan("m", engine, "gpu", 2, 3, (InstancePlacement((0,)),))}
    )
    assert placement.parallel_engine_args(model, plan) == {t.tp_arg: 2, t.pp_arg: 3}


def test_a_built_engine_takes_no_parallel_arguments():
    model = _model("tensorrt_llm")
    plan = Plan(None, 0, None, {"m": ModelPlan("m", "tensorrt_llm", "model", 2, 1, ())})
    assert placement.parallel_engine_args(model, plan) == {}
    assert planner.utilization(model) == planner.DEFAULT_UTILIZATION
