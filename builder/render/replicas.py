"""The Triton models of a model with replicas, and what router.json says about them.

A vLLM or SGLang model with `instances: N` behind a router (builder/plan/replicas.py)
renders as:
- `<model>__r0` ... `<model>__r<N-1>`: each the engine model as any other, with one
  instance placed on instance i of the plan (its GPUs, INSTANCE_DEVICES entry or MIG
  slice), its own engine and KV cache; the same engine arguments for all. On the CPU a
  vLLM replica also gets CPU_SHARE ("i/N"), so each binds its own cores.
- `<model>`: another instance of the router's own code (bls/) whose router.json has the
  one backend `<model>` and its replicas, so a direct call is chosen for by the same
  chooser, under the same tenant checks, as a call through the router. No new runtime
  code: the router and the forwarder differ only in their router.json.

router.json (the router's and the forwarder's) is built by builder/render/router_json.py,
given the replicas the plan routes to and the router's instance count.
"""

from __future__ import annotations

from collections.abc import Callable

from bls.router_config import RouterConfig
from builder.plan import replicas as replicas_plan
from builder.plan.model import Plan
from builder.plan.router_instances import router_instances
from builder.render.context import (
    ROUTER_PACKAGES,
    VERSION,
    RenderContext,
    python_model,
    render_router_json,
    render_template,
)
from builder.render.router_json import forwarder_config, router_config
from builder.spec import ModelSpec

# (context, model as served, the spec's model, plan) → that engine model's files.
EngineRenderer = Callable[[RenderContext, ModelSpec, ModelSpec, Plan], dict[str, bytes]]


def router_json(ctx: RenderContext) -> RouterConfig:
    """The router's router.json: the spec's router, the replicas the plan routes to,
    and this router's instance count."""
    # Each instance is its own stub with its own in-flight counts: the router divides
    # each backend's limit among them (docs/router.md, "Router instances").
    instances = router_instances(ctx.spec)
    assert instances is not None  # None only for a spec without a router
    routed = replicas_plan.routed_replicas(ctx.spec, ctx.plan)
    return router_config(ctx.spec, routed, instances.count)


def render(ctx: RenderContext, model: ModelSpec, engine_files: EngineRenderer) -> dict[str, bytes]:
    """Every file of a model with replicas: its replicas and its forwarder."""
    files: dict[str, bytes] = {}
    for index in range(model.instances):
        served, plan = replicas_plan.replica(model, ctx.plan, index)
        replica_files = engine_files(ctx, served, model, plan)
        share = replicas_plan.cpu_share(model, ctx.plan, index)
        if share:  # the replica's own CPU cores (vLLM on the CPU): one more parameter
            replica_files[f"{served.name}/config.pbtxt"] += render_template(
                "python_llm/parameters.pbtxt.j2", parameters=share
            )
        files.update(replica_files)
    config = forwarder_config(router_json(ctx), model.name)
    files[f"{model.name}/config.pbtxt"] = render_template(
        "router/config.pbtxt.j2",
        router={"name": model.name},
        instances=1,
        spec_file=ctx.spec.file,
        purpose=f"Answers direct calls to {model.name}: the router's code, choosing among "
        f"its {model.instances} replicas ({model.name}__r0 ...).",
    )
    files[f"{model.name}/{VERSION}/router.json"] = render_router_json(config)
    files.update(python_model(f"{model.name}/{VERSION}", "bls.model", ROUTER_PACKAGES))
    return files
