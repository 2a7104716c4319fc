"""router.json, typed: the one file the builder writes for the router and the router
reads at load.

Both sides go through this module: the builder (builder/render/router_json.py) makes a
RouterConfig and writes `to_dict()`; the router (model.py) reads it back with `load`,
which checks every field and fails the model's load with one line naming the field
(`router.json: backends.chat.capacity: expected ...`) instead of a KeyError deep inside
the first request. Everything the router needs about a backend is here, written by the
builder from the spec and the plan: its engine, its replicas, and its capacity (the
sequences its engine runs at once over all its instances), so the router never reads
another model's files.

It imports nothing but the standard library: the builder imports it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

FILE_NAME = "router.json"


class RouterConfigError(ValueError):
    """router.json does not say what the router needs; the message names the field.
    `detail` is the message without the file's name (for callers that name the file
    by its path)."""

    def __init__(self, detail: str):
        super().__init__(f"{FILE_NAME}: {detail}")
        self.detail = detail


@dataclass(frozen=True)
class BackendConfig:
    """One model the router may send requests to."""

    engine: str  # the spec's engine: how the router speaks to it (adapters.py)
    family: str = ""
    tasks: tuple[str, ...] = ()
    speculative: bool = False
    adapters: tuple[str, ...] = ()  # the LoRA adapters it holds
    policy: str | None = None  # how its replicas are chosen (None: the default)
    # Sequences one of its Triton models runs at once (a replica's, or the model's over
    # all its instances); None when the spec leaves it to the engine.
    capacity: int | None = None
    replicas: tuple[str, ...] = ()  # the Triton models it is served by, if split


@dataclass(frozen=True)
class MatchConfig:
    """A rule's `match`: the request features it asks for (policy._matches); None is
    not asked, and left out of router.json."""

    hint: str | None = None
    family: str | None = None
    task: str | None = None
    min_turns: int | None = None
    max_turns: int | None = None
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None
    tenant: str | None = None
    tier: str | None = None
    shared_prefix: bool | None = None


@dataclass(frozen=True)
class RuleConfig:
    name: str
    match: MatchConfig
    backends: tuple[str, ...]
    policy: str | None = None  # replica policy for the requests it routes


@dataclass(frozen=True)
class BreakerConfig:
    """router.json's `breaker`: when a backend's circuit breaker opens (breaker.py). The
    defaults are the router's own; the spec takes its defaults from here."""

    error_rate: float = 0.05
    window_s: float = 30.0
    min_requests: int = 20
    consecutive_failures: int = 5
    cooldown_s: float = 10.0


@dataclass(frozen=True)
class TenantLimitsConfig:
    """One tenant's entry of router.json's `tenants` (or its `default`): what tenants.py
    admits it by. A limit of None is no limit."""

    tier: str
    priority: int  # vLLM's request priority for the tier (lower is scheduled first)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None

    def limit(self, name: str) -> int | None:
        """The limit a refusal names (tenant_store's reasons are these fields' names)."""
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "max_concurrent": self.max_concurrent,
        }[name]


@dataclass(frozen=True)
class TenantsConfig:
    """router.json's `tenants` (builder/spec/tenants.py writes it, tenants.py enforces it):
    no secret, only where the router finds the Redis password."""

    namespace: str  # the deployment's name: the prefix of its Redis keys
    on_redis_error: str  # ON_REDIS_ERROR: when Redis is down or slow
    default: TenantLimitsConfig  # a tenant not under `limits`
    limits: Mapping[str, TenantLimitsConfig]
    unknown: str  # UNKNOWN: what a tenant not under `limits` gets
    share_prefix_cache: tuple[str, ...] = ()  # tenants that share one prefix cache
    redis: str | None = None  # None: the counters are this router's own
    username: str | None = None
    password_env: str | None = None
    password_file: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> TenantsConfig:
        """The section alone (as router.json's `tenants` holds it), checked as `load`
        checks it; RouterConfigError names the field."""
        tenants = _tenants(data, "tenants")
        if tenants is None:
            raise _error("tenants", "expected a JSON object, got null")
        return tenants


ON_REDIS_ERROR = ("allow", "deny")
UNKNOWN = ("default", "reject")


@dataclass(frozen=True)
class RouterConfig:
    name: str
    backends: Mapping[str, BackendConfig]
    default: tuple[str, ...]
    rules: tuple[RuleConfig, ...]
    fallback: Mapping[str, tuple[str, ...]]
    breaker: BreakerConfig
    short_prompt_tokens: int
    deadline_s: float
    first_token_timeout_s: float
    max_inflight_per_backend: int
    tenants: TenantsConfig | None = None  # None: no tenant gate (tenants.py)
    instances: int = 1  # the router's instances: each takes its share of a limit
    _rules_by_name: Mapping[str, RuleConfig] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rules_by_name", {r.name: r for r in self.rules})

    def rule(self, name: str) -> RuleConfig | None:
        return self._rules_by_name.get(name)

    @classmethod
    def from_dict(cls, data: Any) -> RouterConfig:
        """Check and type router.json's content; RouterConfigError names the first
        field that is missing or wrong."""
        top = _Fields(data, "")
        backends = _mapping(top.get("backends"), "backends")
        typed = {name: _backend(entry, f"backends.{name}") for name, entry in backends.items()}
        known = set(typed)
        config = cls(
            name=top.text("name"),
            backends=MappingProxyType(typed),
            default=_names(top.get("default"), "default", known),
            rules=tuple(
                _rule(entry, f"rules[{i}]", known)
                for i, entry in enumerate(_list(top.get("rules"), "rules"))
            ),
            fallback=MappingProxyType(
                {
                    _known(name, "fallback", known): _names(chain, f"fallback.{name}", known)
                    for name, chain in _mapping(top.get("fallback"), "fallback").items()
                }
            ),
            breaker=_breaker(top.get("breaker"), "breaker"),
            short_prompt_tokens=top.count("short_prompt_tokens", minimum=0),
            deadline_s=top.seconds("deadline_s"),
            first_token_timeout_s=top.seconds("first_token_timeout_s"),
            max_inflight_per_backend=top.count("max_inflight_per_backend"),
            tenants=_tenants(top.get("tenants", None), "tenants"),
            instances=top.count("instances", default=1),
        )
        top.done()
        return config

    def to_dict(self) -> dict[str, Any]:
        """router.json's content: what `from_dict` reads back as an equal config."""
        return {
            "name": self.name,
            "backends": {name: _backend_dict(b) for name, b in self.backends.items()},
            "default": list(self.default),
            "rules": [
                {
                    "name": r.name,
                    "match": _match_dict(r.match),
                    "backends": list(r.backends),
                    "policy": r.policy,
                }
                for r in self.rules
            ],
            "fallback": {name: list(chain) for name, chain in self.fallback.items()},
            "breaker": _breaker_dict(self.breaker),
            "short_prompt_tokens": self.short_prompt_tokens,
            "deadline_s": self.deadline_s,
            "first_token_timeout_s": self.first_token_timeout_s,
            "max_inflight_per_backend": self.max_inflight_per_backend,
            "tenants": None if self.tenants is None else _tenants_dict(self.tenants),
            "instances": self.instances,
        }


def load(path: str) -> RouterConfig:
    """The RouterConfig in a router.json file; RouterConfigError (one line) when the
    file cannot be read or says something the router cannot use."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise RouterConfigError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, RecursionError) as e:
        raise RouterConfigError(f"not JSON: {e}") from None
    return RouterConfig.from_dict(data)


# -- checks -------------------------------------------------------------------------------
def _error(where: str, reason: str) -> RouterConfigError:
    return RouterConfigError(f"{where}: {reason}" if where else reason)


_MISSING = object()


class _Fields:
    """One JSON object's fields, taken one by one; `done` refuses the ones left over
    (a field this router does not know: a router older than its builder)."""

    def __init__(self, data: Any, where: str):
        self.data = _mapping(data, where)
        self.where = where
        self.taken: set[str] = set()

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: Any = _MISSING) -> Any:
        self.taken.add(key)
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise _error(self._path(key), "is missing")
        return default

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise _error(self._path(key), f"expected a string, got {_kind(value)}")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self.get(key, None)
        return None if value is None else self.text(key)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise _error(self._path(key), f"expected true or false, got {_kind(value)}")
        return value

    def count(self, key: str, minimum: int = 1, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if not _is_int(value) or value < minimum:
            raise _error(self._path(key), f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def optional_count(self, key: str) -> int | None:
        return None if self.get(key, None) is None else self.count(key)

    def seconds(self, key: str) -> float:
        value = _number(self.get(key), self._path(key))
        if value <= 0:
            raise _error(self._path(key), f"expected seconds > 0, got {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.text(key)
        if value not in choices:
            raise _error(self._path(key), f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.taken)
        if unknown:
            raise _error(self._path(unknown[0]), "unknown field (a router older than its builder?)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(where, f"expected a number, got {_kind(value)}")
    return value  # as written: an int stays an int, so a re-render is byte-identical


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _error(where, f"expected a JSON object, got {_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _error(where, f"expected a list, got {_kind(value)}")
    return value


def _texts(value: Any, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise _error(f"{where}[{i}]", f"expected a string, got {_kind(item)}")
    return tuple(items)


def _known(name: str, where: str, known: set[str]) -> str:
    if name not in known:
        raise _error(where, f"{name!r} is not one of the backends ({', '.join(sorted(known))})")
    return name


def _names(value: Any, where: str, known: set[str]) -> tuple[str, ...]:
    names = _texts(value, where)
    for i, name in enumerate(names):
        _known(name, f"{where}[{i}]", known)
    return names


def _backend(data: Any, where: str) -> BackendConfig:
    f = _Fields(data, where)
    backend = BackendConfig(
        engine=f.text("engine"),
        family=f.text("family", ""),
        tasks=_texts(f.get("tasks", []), f"{where}.tasks"),
        speculative=f.flag("speculative", False),
        adapters=_texts(f.get("adapters", []), f"{where}.adapters"),
        policy=f.optional_text("policy"),
        capacity=f.optional_count("capacity"),
        replicas=_texts(f.get("replicas", []), f"{where}.replicas"),
    )
    f.done()
    return backend


def _rule(data: Any, where: str, known: set[str]) -> RuleConfig:
    f = _Fields(data, where)
    rule = RuleConfig(
        name=f.text("name"),
        match=_match(f.get("match"), f"{where}.match"),
        backends=_names(f.get("backends"), f"{where}.backends", known),
        policy=f.optional_text("policy"),
    )
    f.done()
    return rule


_MATCH_TEXTS = ("hint", "family", "task", "tenant", "tier")
_MATCH_COUNTS = ("min_turns", "max_turns", "min_prompt_tokens", "max_prompt_tokens")


def _match(data: Any, where: str) -> MatchConfig:
    f = _Fields(data, where)
    values: dict[str, Any] = {key: f.optional_text(key) for key in _MATCH_TEXTS}
    for key in _MATCH_COUNTS:
        values[key] = None if f.get(key, None) is None else f.count(key, minimum=0)
    if f.get("shared_prefix", None) is not None:
        values["shared_prefix"] = f.flag("shared_prefix", False)
    f.done()
    return MatchConfig(**values)


def _match_dict(m: MatchConfig) -> dict[str, Any]:
    """Only what the rule asks, in MatchConfig's order (the spec's)."""
    return {
        key: value
        for key in MatchConfig.__dataclass_fields__
        if (value := getattr(m, key)) is not None
    }


def _backend_dict(b: BackendConfig) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "engine": b.engine,
        "family": b.family,
        "tasks": list(b.tasks),
        "speculative": b.speculative,
        "adapters": list(b.adapters),
        "policy": b.policy,
        "capacity": b.capacity,
    }
    if b.replicas:  # only a backend split into replicas names them
        entry["replicas"] = list(b.replicas)
    return entry


def _breaker(data: Any, where: str) -> BreakerConfig:
    f = _Fields(data, where)
    error_rate = _number(f.get("error_rate"), f"{where}.error_rate")
    if not 0 < error_rate <= 1:
        raise _error(f"{where}.error_rate", f"expected a fraction in (0, 1], got {error_rate!r}")
    breaker = BreakerConfig(
        error_rate=error_rate,
        window_s=f.seconds("window_s"),
        min_requests=f.count("min_requests"),
        consecutive_failures=f.count("consecutive_failures"),
        cooldown_s=f.seconds("cooldown_s"),
    )
    f.done()
    return breaker


def _breaker_dict(b: BreakerConfig) -> dict[str, Any]:
    return {
        "error_rate": b.error_rate,
        "window_s": b.window_s,
        "min_requests": b.min_requests,
        "consecutive_failures": b.consecutive_failures,
        "cooldown_s": b.cooldown_s,
    }


def _tenant_limits(data: Any, where: str) -> TenantLimitsConfig:
    f = _Fields(data, where)
    limits = TenantLimitsConfig(
        tier=f.text("tier"),
        requests_per_minute=f.optional_count("requests_per_minute"),
        tokens_per_minute=f.optional_count("tokens_per_minute"),
        max_concurrent=f.optional_count("max_concurrent"),
        priority=f.count("priority", minimum=0),
    )
    f.done()
    return limits


def _tenants(data: Any, where: str) -> TenantsConfig | None:
    if data is None:
        return None
    f = _Fields(data, where)
    limits = _mapping(f.get("limits"), f"{where}.limits")
    tenants = TenantsConfig(
        namespace=f.text("namespace"),
        redis=f.optional_text("redis"),
        username=f.optional_text("username"),
        password_env=f.optional_text("password_env"),
        password_file=f.optional_text("password_file"),
        on_redis_error=f.choice("on_redis_error", ON_REDIS_ERROR),
        default=_tenant_limits(f.get("default"), f"{where}.default"),
        limits=MappingProxyType(
            {
                name: _tenant_limits(entry, f"{where}.limits.{name}")
                for name, entry in limits.items()
            }
        ),
        unknown=f.choice("unknown", UNKNOWN),
        share_prefix_cache=_texts(f.get("share_prefix_cache"), f"{where}.share_prefix_cache"),
    )
    f.done()
    return tenants


def _tenant_limits_dict(t: TenantLimitsConfig) -> dict[str, Any]:
    return {
        "tier": t.tier,
        "requests_per_minute": t.requests_per_minute,
        "tokens_per_minute": t.tokens_per_minute,
        "max_concurrent": t.max_concurrent,
        "priority": t.priority,
    }


def _tenants_dict(t: TenantsConfig) -> dict[str, Any]:
    return {
        "namespace": t.namespace,
        "redis": t.redis,
        "username": t.username,
        "password_env": t.password_env,
        "password_file": t.password_file,
        "on_redis_error": t.on_redis_error,
        "default": _tenant_limits_dict(t.default),
        "limits": {name: _tenant_limits_dict(entry) for name, entry in t.limits.items()},
        "unknown": t.unknown,
        "share_prefix_cache": list(t.share_prefix_cache),
    }
