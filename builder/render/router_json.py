"""What router.json tells the router, from the spec: built here as bls/router_config.py's
typed RouterConfig, the one place the builder decides it; `RouterConfig.to_dict` is the
one writer of the file's shape and `RouterConfig.from_dict` its one reader.

Each backend gets its replica `policy` and `capacity` (sequences one of its Triton models
runs at once, from its engine arguments; None when the spec leaves it to the engine),
and a backend split into replicas its `replicas`; each rule its own `policy` (None: the
backend's). The renderer (builder/render/replicas.py) passes the replicas the plan
routes to and the router's instance count; a test may leave both out (no replicas, one
instance).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from bls.router_config import (
    BackendConfig,
    BreakerConfig,
    MatchConfig,
    RouterConfig,
    RuleConfig,
)
from builder.engines.traits import traits
from builder.spec import DeploymentSpec, ModelSpec
from builder.spec.router_policy import backend_policy

NO_REPLICAS: Mapping[str, Sequence[str]] = MappingProxyType({})


def capacity(model: ModelSpec, instances: int) -> int | None:
    """Sequences a Triton model of `instances` instances of `model` runs at once."""
    key = traits(model.engine).capacity_arg
    per_instance = model.engine_args.get(key) if key else None
    if not isinstance(per_instance, int) or isinstance(per_instance, bool):
        return None
    return per_instance * instances


def router_config(
    spec: DeploymentSpec, routed: Mapping[str, Sequence[str]] = NO_REPLICAS, instances: int = 1
) -> RouterConfig:
    """The router's config: `routed` names each backend's replicas (the plan's), and
    `instances` the router's instances (each takes its share of a limit)."""
    router = spec.router
    assert router is not None  # only a spec with a router renders one
    backends = {}
    for model in spec.models:
        replicas = tuple(routed.get(model.name, ()))
        backends[model.name] = BackendConfig(
            engine=model.engine,
            family=model.family,
            tasks=tuple(model.tasks),
            speculative=model.speculative,
            adapters=tuple(sorted(model.extra.get("adapters", ()))),
            policy=backend_policy(router, model.name),
            # A replica is one instance; a model without replicas runs all of its own.
            capacity=capacity(model, 1 if replicas else model.instances),
            replicas=replicas,
        )
    return RouterConfig(
        name=router.name,
        backends=MappingProxyType(backends),
        default=tuple(router.default),
        rules=tuple(
            RuleConfig(
                name=rule.name,
                match=MatchConfig(**dataclasses.asdict(rule.match)),
                backends=tuple(rule.backends),
                policy=rule.policy,
            )
            for rule in router.rules
        ),
        fallback=MappingProxyType({k: tuple(v) for k, v in router.fallback.items()}),
        breaker=BreakerConfig(**dataclasses.asdict(router.breaker)),
        short_prompt_tokens=router.short_prompt_tokens,
        deadline_s=router.deadline_s,
        first_token_timeout_s=router.first_token_timeout_s,
        max_inflight_per_backend=router.max_inflight_per_backend,
        # No secret: only where the router finds the Redis password.
        tenants=spec.tenants.router_config(spec.name) if spec.tenants else None,
        instances=instances,
    )


def forwarder_config(router: RouterConfig, model: str) -> RouterConfig:
    """`<model>`'s router.json: the router's, narrowed to the one backend, no rules and
    no fallback (a direct call names the model: another model must never answer it),
    one instance."""
    return dataclasses.replace(
        router,
        name=model,
        backends=MappingProxyType({model: router.backends[model]}),
        default=(model,),
        rules=(),
        fallback=MappingProxyType({}),
        instances=1,
    )
