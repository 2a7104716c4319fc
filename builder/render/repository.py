"""Spec + plan → every file of the Triton model repository, as {relative path: bytes}.

Pure: `render_files` reads the templates and backend sources, never the machine; the
plan comes in with the context (builder.pipeline plans first). Writing the files is
builder.render.write's job.
"""

from __future__ import annotations

from collections.abc import Callable

from builder.engines.traits import traits
from builder.plan import placement as placement_mod
from builder.plan.model import Plan
from builder.plan.replicas import has_replicas
from builder.plan.router_instances import router_instances
from builder.render import replicas as replicas_repo
from builder.render import trtllm as trtllm_repo
from builder.render.context import (
    COMMON_PACKAGE,
    ROUTER_PACKAGES,
    VERSION,
    RenderContext,
    RenderError,
    python_model,
    render_router_json,
    render_template,
)
from builder.spec import ModelSpec, RouterSpec, thaw
from builder.spec import adapters as adapters_spec
from builder.spec import tenants as tenants_spec


def _render_python_llm(ctx: RenderContext, model: ModelSpec) -> dict[str, bytes]:
    """vLLM and SGLang: a decoupled Python-backend model running the engine in its stub;
    behind a router, one such model per instance (builder/render/replicas.py)."""
    if has_replicas(ctx.spec, model, ctx.plan):
        return replicas_repo.render(ctx, model, _engine_model)
    return _engine_model(ctx, model, model, ctx.plan)


def _engine_model(
    ctx: RenderContext, served: ModelSpec, model: ModelSpec, plan: Plan
) -> dict[str, bytes]:
    """The engine model `served` (the spec's `model`, or one replica of it, named and
    placed by `plan`); the engine arguments are the spec's model's."""
    engine_args = {
        **thaw(model.engine_args),
        **placement_mod.parallel_engine_args(served, plan),
        **_model_path_arg(model, ctx),
        **tenants_spec.engine_args(ctx.spec.tenants, model.engine, model.engine_args),
        **adapters_spec.engine_args(ctx.spec.file, model),
    }
    view = {
        "name": served.name,
        "instance_groups": placement_mod.instance_groups(served, plan),
        "parameters": placement_mod.instance_parameters(served, plan),
    }
    files = {
        f"{served.name}/config.pbtxt": render_template(
            "python_llm/config.pbtxt.j2",
            model=view,
            spec_file=ctx.spec.file,
            engine_title=traits(model.engine).title,
        ),
        f"{served.name}/{VERSION}/model.json": render_template(
            "python_llm/model.json.j2", engine_args=engine_args
        ),
    }
    engine_package = f"python_backends.{model.engine}"
    files.update(
        python_model(
            f"{served.name}/{VERSION}",
            f"{engine_package}.model",
            (engine_package, COMMON_PACKAGE),
        )
    )
    return files


def _model_path_arg(model: ModelSpec, ctx: RenderContext) -> dict[str, str]:
    name = traits(model.engine).model_arg
    return {name: ctx.resolved_models.get(model.name, model.model)} if name else {}


def _render_router(ctx: RenderContext, router: RouterSpec) -> dict[str, bytes]:
    placed = router_instances(ctx.spec)
    assert placed is not None  # None only for a spec without a router
    instances = placed.count
    config = replicas_repo.router_json(ctx)
    files = {
        f"{router.name}/config.pbtxt": render_template(
            "router/config.pbtxt.j2", router=router, instances=instances, spec_file=ctx.spec.file
        ),
        f"{router.name}/{VERSION}/router.json": render_router_json(config),
    }
    files.update(python_model(f"{router.name}/{VERSION}", "bls.model", ROUTER_PACKAGES))
    return files


ENGINE_RENDERERS: dict[str, Callable[[RenderContext, ModelSpec], dict[str, bytes]]] = {
    "vllm": _render_python_llm,
    "sglang": _render_python_llm,
    "tensorrt_llm": trtllm_repo.render,
}


def render_files(ctx: RenderContext) -> dict[str, bytes]:
    """Every file of the repository, keyed by relative path; deterministic."""
    files: dict[str, bytes] = {}
    for model in ctx.spec.models:
        for path, data in ENGINE_RENDERERS[model.engine](ctx, model).items():
            if path in files:
                raise RenderError(f"{path} is rendered twice (model {model.name})")
            files[path] = data
    if ctx.spec.router is not None:
        for path, data in _render_router(ctx, ctx.spec.router).items():
            if path in files:
                raise RenderError(f"{path} is rendered twice (router)")
            files[path] = data
    return dict(sorted(files.items()))
