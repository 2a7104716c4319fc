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

router.json (the router's and the forwarder's) gives each backend its replica `policy`
and `capacity` (sequences one of its Triton models runs at once, from its engine
arguments; null when the spec leaves it to the engine), and a backend with replicas its
`replicas`; each rule its own `policy` (null: the backend's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bls.policy import router_config  # the router owns the shape of its own config
from builder.engines.traits import traits
from builder.plan import replicas as replicas_plan
from builder.plan.model import Plan
from builder.plan.router_instances import router_instances
from builder.render.context import (
    BLS_DIR,
    VERSION,
    RenderContext,
    copy_tree,
    render_router_json,
    render_template,
)
from builder.spec import ModelSpec
from builder.spec.router_policy import backend_policy

# (context, model as served, the spec's model, plan) → that engine model's files.
EngineRenderer = Callable[[RenderContext, ModelSpec, ModelSpec, Plan], dict[str, bytes]]
# (context, model directory) → the trident_common package copied into it.
CommonPackage = Callable[[str], dict[str, bytes]]


def capacity(model: ModelSpec, instances: int) -> int | None:
    """Sequences a Triton model of `instances` instances of `model` runs at once."""
    key = traits(model.engine).capacity_arg
    per_instance = model.engine_args.get(key) if key else None
    if not isinstance(per_instance, int) or isinstance(per_instance, bool):
        return None
    return per_instance * instances


def router_json(ctx: RenderContext) -> dict[str, Any]:
    """The router's router.json: bls/policy.py's config, each backend's replicas,
    policy and capacity, each rule's policy, and this router's instance count."""
    spec, router = ctx.spec, ctx.spec.router
    # Only a spec with a router renders one (or replicas, which the spec requires one for).
    assert router is not None
    config = router_config(spec)
    routed = replicas_plan.routed_replicas(spec, ctx.plan)
    for model in spec.models:
        entry = config["backends"][model.name]
        entry["policy"] = backend_policy(router, model.name)
        if model.name in routed:  # each replica has one instance
            entry["capacity"] = capacity(model, 1)
            entry["replicas"] = list(routed[model.name])
        else:
            entry["capacity"] = capacity(model, model.instances)
    for rule, rendered in zip(router.rules, config["rules"], strict=True):
        rendered["policy"] = rule.policy
    # Each instance is its own stub with its own in-flight counts: the router divides
    # each backend's limit among them (docs/router.md, "Router instances").
    instances = router_instances(spec)
    assert instances is not None  # None only for a spec without a router
    config["instances"] = instances.count
    return config


def forwarder_json(router: dict, model: str) -> dict:
    """`<model>`'s router.json: the router's, narrowed to the one backend, no rules and
    no fallback (a direct call names the model: another model must never answer it),
    one instance."""
    return {
        **router,
        "name": model,
        "backends": {model: router["backends"][model]},
        "default": [model],
        "rules": [],
        "fallback": {},
        "instances": 1,
    }


def render(
    ctx: RenderContext, model: ModelSpec, engine_files: EngineRenderer, common: CommonPackage
) -> dict[str, bytes]:
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
    config = forwarder_json(router_json(ctx), model.name)
    files[f"{model.name}/config.pbtxt"] = render_template(
        "router/config.pbtxt.j2",
        router={"name": model.name},
        instances=1,
        spec_file=ctx.spec.file,
        purpose=f"Answers direct calls to {model.name}: the router's code, choosing among "
        f"its {model.instances} replicas ({model.name}__r0 ...).",
    )
    files[f"{model.name}/{VERSION}/router.json"] = render_router_json(config)
    files.update(copy_tree(BLS_DIR, f"{model.name}/{VERSION}"))
    files.update(common(model.name))
    return files
