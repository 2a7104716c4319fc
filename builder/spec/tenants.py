"""The spec's `tenants:` section: per-tenant quotas, rate limits, priority tiers and
prefix-cache isolation, enforced by the router (bls/tenants.py).

A tenant's entry under `limits` overrides `default` field by field (`bob: {}` is the
default). Counters are shared through Redis when `redis` is given; its password comes
from an environment variable or a file, never from the spec, so nothing secret is ever
rendered into the repository.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from bls.router_config import TenantLimitsConfig, TenantsConfig
from bls.tenant_names import TENANT_NAME
from builder.spec.node import SpecError, _Node
from builder.spec.rules import Rule, rule, rule_of
from engine_cache.urls import REDIS_URL, redis_url_problem

# Tier → vLLM request priority (lower is scheduled first, vLLM's convention).
TIERS = {"premium": 0, "standard": 1, "batch": 2}
ON_REDIS_ERROR = ("allow", "deny")
UNKNOWN = ("default", "reject")
LIMIT_KEYS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
# Tenant names (TENANT_NAME) become Redis keys and metric labels: the router's pattern.
_ENV = r"[A-Za-z_][A-Za-z0-9_]*"
_USER = r"[!-~]{1,128}"


@dataclass(frozen=True)
class TenantLimits:
    tier: str = field(default="standard", metadata=rule(choices=tuple(TIERS)))
    # None: unlimited.
    requests_per_minute: int | None = field(default=None, metadata=rule(minimum=1))
    # Prompt + completion tokens.
    tokens_per_minute: int | None = field(default=None, metadata=rule(minimum=1))
    # Streams open at once.
    max_concurrent: int | None = field(default=None, metadata=rule(minimum=1))


@dataclass(frozen=True)
class TenantsSpec:
    # redis://host[:port][/db]; None: counters per router. Checked by engine_cache/urls.py
    # (the cache's own check), whose pattern the schema states.
    redis: str | None = field(default=None, metadata=rule(pattern=REDIS_URL))
    # A Redis ACL user (not secret); None: the default user.
    username: str | None = field(default=None, metadata=rule(pattern=_USER))
    # An environment variable's name.
    password_env: str | None = field(default=None, metadata=rule(pattern=_ENV))
    password_file: str | None = None  # a path read by the router at start
    # When Redis is down or slow.
    on_redis_error: str = field(default="allow", metadata=rule(choices=ON_REDIS_ERROR))
    default: TenantLimits = field(default_factory=TenantLimits)
    limits: Mapping[str, TenantLimits] = field(
        default_factory=lambda: MappingProxyType({}), metadata=rule(keys=TENANT_NAME)
    )
    # A tenant not under `limits`.
    unknown: str = field(default="default", metadata=rule(choices=UNKNOWN))
    share_prefix_cache: tuple[str, ...] = field(
        default=(), metadata=rule(item=Rule(pattern=TENANT_NAME))
    )

    def tiers(self) -> set[str]:
        return {self.default.tier} | {t.tier for t in self.limits.values()}

    def router_config(self, namespace: str) -> TenantsConfig:
        """The router's `tenants` config (router.json): no secret, only where to find
        one; `namespace` (the deployment's name) prefixes its Redis keys."""

        def limits(entry: TenantLimits) -> TenantLimitsConfig:
            return TenantLimitsConfig(
                tier=entry.tier,
                priority=TIERS[entry.tier],
                requests_per_minute=entry.requests_per_minute,
                tokens_per_minute=entry.tokens_per_minute,
                max_concurrent=entry.max_concurrent,
            )

        return TenantsConfig(
            namespace=namespace,
            redis=self.redis,
            username=self.username,
            password_env=self.password_env,
            password_file=self.password_file,
            on_redis_error=self.on_redis_error,
            default=limits(self.default),
            limits=MappingProxyType({name: limits(e) for name, e in self.limits.items()}),
            unknown=self.unknown,
            share_prefix_cache=tuple(self.share_prefix_cache),
        )


SCHEMA_CLASSES = (TenantLimits, TenantsSpec)
# The rules across fields, as the parser applies them below.
SCHEMA_OBJECT_RULES: dict[type, dict[str, Any]] = {
    TenantsSpec: {
        "not": {"required": ["password_env", "password_file"]},
        "dependentRequired": {
            key: ["redis"] for key in ("username", "password_env", "password_file")
        },
    }
}


def parse_tenants(root: _Node, has_router: bool) -> TenantsSpec | None:
    """The `tenants:` section of the spec's root, or None when it is absent."""
    if "tenants" not in root.data:
        root.child("tenants")  # mark as seen
        return None
    node = root.child("tenants")
    if not has_router:
        raise node.error("needs a router: the router enforces tenants' limits")
    redis = _redis_url(node)
    username, password_env, password_file = _redis_credentials(node, redis)
    on_error = node.field(TenantsSpec, "on_redis_error")
    default = _parse_limits(node.child("default"), TenantLimits())
    limits = _tenant_limits(node.child("limits"), default)
    unknown = node.field(TenantsSpec, "unknown")
    shared = node.str_list("share_prefix_cache")
    node.done()
    shared_name = rule_of(TenantsSpec, "share_prefix_cache").item or Rule()
    for i, name in enumerate(shared):
        if not shared_name.matches(name):
            raise SpecError(
                node.file,
                f"{node.child_path('share_prefix_cache')}[{i}]",
                f"{name!r} is not a tenant name",
            )
    return TenantsSpec(
        redis,
        username,
        password_env,
        password_file,
        on_error,
        default,
        MappingProxyType(limits),
        unknown,
        shared,
    )


def _redis_credentials(node: _Node, redis: str | None) -> tuple[str | None, str | None, str | None]:
    """(username, password_env, password_file): each needs a redis URL."""
    username = node.get("username", str, None)
    if username is not None and not rule_of(TenantsSpec, "username").matches(username):
        raise node.error(
            "is not a Redis ACL user name (1 to 128 printable characters, no spaces)", "username"
        )
    if username is not None and redis is None:
        raise node.error("a Redis username needs a redis URL", "redis")
    password_env = node.get("password_env", str, None)
    if password_env is not None and not rule_of(TenantsSpec, "password_env").matches(password_env):
        # Not echoed: what is pasted here instead of a name is usually the password.
        raise node.error(
            "must be an environment variable name (letters, digits and "
            "'_', not starting with a digit) that holds the password, not "
            "the password itself",
            "password_env",
        )
    password_file = node.get("password_file", str, None)
    if password_env and password_file:
        raise node.error("give password_env or password_file, not both", "password_file")
    if (password_env or password_file) and redis is None:
        raise node.error("a Redis password needs a redis URL", "redis")
    return username, password_env, password_file


def _tenant_limits(limits_node: _Node, default: TenantLimits) -> dict[str, TenantLimits]:
    """Each named tenant's limits, the default's where a tenant leaves one out."""
    limits = {}
    tenant_name = rule_of(TenantsSpec, "limits").keys or ""
    for name in list(limits_node.data):
        if not isinstance(name, str) or not re.fullmatch(tenant_name, name):
            raise limits_node.error(
                "a tenant name is letters, digits, '_', '.', '@' and '-' (at most 128 characters)",
                str(name),
            )
        limits[name] = _parse_limits(limits_node.child(name), default)
    limits_node.done()
    return limits


def _redis_url(node: _Node) -> str | None:
    url = node.get("redis", str, None)
    # The one check of a Redis URL (engine_cache/urls.py): the URL is never echoed, as
    # a password may sit in its userinfo, query, fragment or where the db number goes.
    problem = url is not None and redis_url_problem(url)
    if problem:
        raise node.error(problem, "redis")
    return url


def _parse_limits(node: _Node, base: TenantLimits) -> TenantLimits:
    """A tenant's limits: each field given here, else the base's."""
    values = {
        key: node.field(TenantLimits, key, getattr(base, key)) for key in ("tier", *LIMIT_KEYS)
    }
    node.done()
    return replace(base, **values)


# -- what the rest of trident reads from it ---------------------------------------------
def engine_args(tenants: TenantsSpec | None, engine: str, args: Mapping) -> dict:
    """Engine arguments the tenants section implies: vLLM schedules by priority when the
    tenants' tiers differ (unless the spec chose a policy itself)."""
    if (
        tenants is None
        or engine != "vllm"
        or len(tenants.tiers()) < 2
        or "scheduling_policy" in args
    ):
        return {}
    return {"scheduling_policy": "priority"}
