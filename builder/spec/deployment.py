"""The deployment spec: YAML in, typed frozen objects out.

Every error is a SpecError that names the file, the field path and the reason, so the
CLI can print one line and exit 2. Parsing goes through `_Node`, which tracks the path
of the value it wraps and rejects keys nobody asked for (unknown keys are errors).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from bls.router_config import BreakerConfig
from builder.engines import assets
from builder.engines.traits import ENGINES, REPLICA_ENGINES, TRAITS, traits
from builder.plan import gpus
from builder.plan.memory import DTYPE_BYTES
from builder.spec import engine_args as engine_args_schema
from builder.spec import trtllm as trtllm_spec
from builder.spec import yaml_loader
from builder.spec.cache_spec import EngineCacheSpec, parse_engine_cache
from builder.spec.node import _REQUIRED, SpecError, _Node, frozen_mapping
from builder.spec.router_policy import (
    DEFAULT_POLICY,
    POLICIES,
    REPLICA_NAME,
    check_model_name,
    parse_backend_policies,
)
from builder.spec.rules import Rule, rule, rule_of
from builder.spec.tenants import TenantsSpec, parse_tenants

INSTANCE_KINDS = ("auto", "cpu", "gpu", "model")
# Engines that load `model:` (TRT-LLM has checkpoint:).
NEEDS_MODEL = tuple(t.name for t in TRAITS.values() if t.needs_model)
# Engines that load `model:` as given from this machine's disk when it is a path (TRT-LLM
# builds from its checkpoint section instead).
LOCAL_MODEL_ENGINES = ("vllm", "sglang")
MAX_GPUS = MAX_NODES = 64
MAX_ROUTER_INSTANCES = 64  # as a model's instances: a stub process each
MAX_SECONDS = 86400.0  # a day: no timeout, window or cooldown of the router is longer
# Model and router names: safe as a Triton model, a path and a metric label, and not
# ending as a replica's name does (<model>__r0, ...).
_NAME = {"pattern": r"[A-Za-z][A-Za-z0-9_-]{0,63}", "excludes": REPLICA_NAME.pattern}
# Ranges the spec's fields share (the keywords of builder.spec.rules.Rule).
_PORT = {"minimum": 1, "maximum": 65535}
_SECONDS = {"minimum": 0, "above": True, "maximum": MAX_SECONDS}


# ---------------------------------------------------------------------------------------
# The typed spec


@dataclass(frozen=True)
class ServerSpec:
    http_port: int = field(default=8000, metadata=rule(**_PORT))
    grpc_port: int = field(default=8001, metadata=rule(**_PORT))
    metrics_port: int = field(default=8002, metadata=rule(**_PORT))
    # The OpenAI frontend's port in a deployment (`trident k8s`): None, no frontend.
    openai_port: int | None = field(default=None, metadata=rule(**_PORT))
    # On SIGTERM (or `trident drain`) the server refuses new work and gives the answers in
    # flight this long to finish; what is still running then is ended with an error.
    # Spot nodes get about 2 minutes' notice: the bound leaves room for the exit after it.
    drain_timeout_s: float = field(default=30.0, metadata=rule(minimum=0, maximum=600))


@dataclass(frozen=True)
class HardwareSpec:
    # A GPU type or "cpu".
    gpu: str = field(default="cpu", metadata=rule(choices=("cpu", *gpus.GPU_TYPES)))
    count: int = field(default=0, metadata=rule(minimum=0, maximum=MAX_GPUS))  # GPUs on each node
    topology: str | None = None  # path to saved `nvidia-smi topo -m` output, or None
    # Identical nodes; a model may span them (LeaderWorkerSet).
    nodes: int = field(default=1, metadata=rule(minimum=1, maximum=MAX_NODES))


@dataclass(frozen=True)
class PlacementSpec:
    kind: str = field(default="auto", metadata=rule(choices=INSTANCE_KINDS))
    # Explicit GPU ordinals (else the planner chooses).
    devices: tuple[int, ...] = field(default=(), metadata=rule(unique=True, item=Rule(minimum=0)))
    mig: str | None = None  # a MIG profile such as "3g.40gb", or "auto"
    # Memory-math inputs for the planner (builder.plan.planner); None: from the engine args.
    # The weights' precision, e.g. "fp8" (builder.plan.memory), in any case.
    dtype: str | None = field(
        default=None, metadata=rule(choices=tuple(sorted(DTYPE_BYTES)), ignore_case=True)
    )
    # Sequences one instance serves at once.
    max_batch: int | None = field(default=None, metadata=rule(minimum=1))
    # Tokens per sequence (prompt + output).
    max_context: int | None = field(default=None, metadata=rule(minimum=1))


@dataclass(frozen=True)
class ModelSpec:
    name: str = field(metadata=rule(**_NAME))
    engine: str = field(metadata=rule(choices=ENGINES))
    model: str = ""  # builtin:NAME, a path, or an HF id
    instances: int = field(default=1, metadata=rule(minimum=1, maximum=64))
    engine_args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    family: str = ""  # e.g. "llama"; used by routing rules
    tasks: tuple[str, ...] = ()  # e.g. ("chat", "rag")
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def speculative(self) -> bool:
        """Whether the engine decodes speculatively, each engine by its own switch (the
        router sends short prompts to a plain twin instead): vLLM's speculative_config,
        SGLang's speculative_algorithm, the speculative section of TRT-LLM's served
        profile (the engine `trident repo` serves was built with it)."""
        engine = traits(self.engine)
        if engine.built:
            return trtllm_spec.serving_profile(self.extra).speculative is not None
        return bool(engine.speculative_arg and self.engine_args.get(engine.speculative_arg))


@dataclass(frozen=True)
class MatchSpec:
    hint: str | None = None
    family: str | None = None
    task: str | None = None
    min_turns: int | None = field(default=None, metadata=rule(minimum=0))
    max_turns: int | None = field(default=None, metadata=rule(minimum=0))
    min_prompt_tokens: int | None = field(default=None, metadata=rule(minimum=0))
    max_prompt_tokens: int | None = field(default=None, metadata=rule(minimum=0))
    tenant: str | None = None
    tier: str | None = None
    shared_prefix: bool | None = None


@dataclass(frozen=True)
class RuleSpec:
    name: str
    match: MatchSpec
    backends: tuple[str, ...] = field(metadata=rule(min_items=1))
    # The replica policy of this rule's requests (router_policy).
    policy: str | None = field(default=None, metadata=rule(choices=POLICIES))


_BREAKER = BreakerConfig()  # the router's own defaults (bls/router_config.py, pure Python)


@dataclass(frozen=True)
class BreakerSpec:
    error_rate: float = field(
        default=_BREAKER.error_rate, metadata=rule(minimum=0, above=True, maximum=1)
    )
    window_s: float = field(default=_BREAKER.window_s, metadata=rule(**_SECONDS))
    min_requests: int = field(default=_BREAKER.min_requests, metadata=rule(minimum=1))
    consecutive_failures: int = field(
        default=_BREAKER.consecutive_failures, metadata=rule(minimum=1)
    )
    cooldown_s: float = field(default=_BREAKER.cooldown_s, metadata=rule(**_SECONDS))


@dataclass(frozen=True)
class RouterSpec:
    name: str = field(default="router", metadata=rule(**_NAME))
    default: tuple[str, ...] = field(default=(), metadata=rule(min_items=1))
    rules: tuple[RuleSpec, ...] = ()
    fallback: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}), metadata=rule(item=Rule(min_items=1))
    )
    breaker: BreakerSpec = field(default_factory=BreakerSpec)
    short_prompt_tokens: int = field(default=256, metadata=rule(minimum=0))
    deadline_s: float = field(default=300.0, metadata=rule(**_SECONDS))
    first_token_timeout_s: float = field(default=60.0, metadata=rule(**_SECONDS))
    max_inflight_per_backend: int = field(default=256, metadata=rule(minimum=1))
    # Router model instances (stub processes); None: derived from the target host
    # (builder/plan/router_instances.py).
    instances: int | None = field(
        default=None, metadata=rule(minimum=1, maximum=MAX_ROUTER_INSTANCES)
    )
    # How the router chooses among a backend's replicas (builder/spec/router_policy.py).
    policy: str = field(default=DEFAULT_POLICY, metadata=rule(choices=POLICIES))
    backend_policies: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), metadata=rule(item=Rule(choices=POLICIES))
    )


@dataclass(frozen=True)
class DeploymentSpec:
    file: str
    name: str
    server: ServerSpec
    hardware: HardwareSpec
    engine_cache: EngineCacheSpec
    models: tuple[ModelSpec, ...] = field(metadata=rule(min_items=1))
    router: RouterSpec | None
    tenants: TenantsSpec | None = None  # builder/spec/tenants.py

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)


# ---------------------------------------------------------------------------------------
# Parsing


def load_spec(path: str | Path) -> DeploymentSpec:
    """Read and validate a spec file; raises SpecError (never anything else) on defects."""
    file = str(path)
    try:
        data = yaml_loader.load(yaml_loader.read_text(path))
    except FileNotFoundError:
        raise SpecError(file, "", "no such file") from None
    except IsADirectoryError:
        raise SpecError(file, "", "is a directory, not a spec file") from None
    except OSError as e:
        raise SpecError(file, "", f"cannot read: {e.strerror}") from None
    except yaml_loader.YamlLimitError as e:
        raise SpecError(file, "", str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(file, "", f"invalid YAML: {where}{getattr(e, 'problem', e)}") from None
    return parse_spec(data, file)


def parse_spec(data: Any, file: str = "<spec>") -> DeploymentSpec:
    root = _Node(data, "", file)
    name = root.get("name", str, Path(file).stem)
    server = _parse_server(root.child("server"))
    hardware = _parse_hardware(root.child("hardware"))
    cache = parse_engine_cache(root.child("engine_cache"))
    model_items = root.list("models")
    least = rule_of(DeploymentSpec, "models").min_items or 0
    if len(model_items) < least:
        raise root.error(f"must list at least {_models(least)}", "models")
    models = tuple(_parse_model(_Node(item, path, file)) for path, item in model_items)
    _check_unique_names(models, file)
    _check_devices(models, hardware, file)
    router = None
    if "router" in root.data:
        router = _parse_router(root.child("router"), models)
    else:
        root.child("router")  # mark as seen
    tenants = parse_tenants(root, router is not None)
    root.done()
    if router and router.name in {m.name for m in models}:
        raise SpecError(file, "router.name", f"{router.name!r} is also a model name")
    _check_tenant_counters(models, router, tenants, file)
    return DeploymentSpec(file, name, server, hardware, cache, models, router, tenants)


def _check_tenant_counters(
    models: tuple[ModelSpec, ...],
    router: RouterSpec | None,
    tenants: TenantsSpec | None,
    file: str,
) -> None:
    """Without tenants.redis each process that admits tenants keeps its own counters, so
    a limit holds once per process: refused wherever there would be more than one. That
    is several router instances, and a model rendered as replicas, whose `<model>` is a
    router of its own (builder/render/replicas.py) with the same tenant checks: a tenant
    alternating between `router` and `<model>` would get each limit twice
    (docs/security.md)."""
    if router is None or not tenants or tenants.redis is not None:
        return
    if (router.instances or 1) > 1:
        raise SpecError(
            file,
            "router.instances",
            f"{router.instances} router instances "
            "would each count tenants on their own (tenants.redis is not "
            "set): set tenants.redis or router.instances: 1",
        )
    for i, m in enumerate(models):
        if m.engine in REPLICA_ENGINES and m.instances > 1:
            raise SpecError(
                file,
                f"models[{i}].instances",
                f"{m.instances} replicas of {m.name!r} behind the router: direct calls to "
                f"{m.name!r} would count tenants apart from the router (tenants.redis is "
                "not set): set tenants.redis or instances: 1",
            )


def _parse_server(node: _Node) -> ServerSpec:
    ports = {key: node.field(ServerSpec, key) for key in ("http_port", "grpc_port", "metrics_port")}
    openai_port = node.field(ServerSpec, "openai_port")
    drain_timeout_s = node.field(ServerSpec, "drain_timeout_s")
    node.done()
    used = [*ports.values(), *([openai_port] if openai_port is not None else [])]
    if len(set(used)) != len(used):
        raise node.error("http_port, grpc_port, metrics_port and openai_port must differ")
    return ServerSpec(**ports, openai_port=openai_port, drain_timeout_s=drain_timeout_s)


def _parse_hardware(node: _Node) -> HardwareSpec:

    gpu = node.field(HardwareSpec, "gpu")
    count = node.field(HardwareSpec, "count", 0 if gpu == "cpu" else 1)
    topology = node.get("topology", str, None)
    nodes = node.field(HardwareSpec, "nodes")
    node.done()
    if gpu != "cpu" and count == 0:
        raise node.error("must be >= 1 when a GPU type is given", "count")
    if gpu == "cpu" and nodes > 1:
        raise node.error("more than one node needs a GPU type", "nodes")
    return HardwareSpec(gpu, count, topology, nodes)


def _check_name(node: _Node, key: str, value: str) -> str:
    if not re.fullmatch(_NAME["pattern"], value):  # fullmatch: `$` would accept "name\n"
        raise node.error(
            f"{value!r} is not a safe model name (letters, digits, '_' and '-', "
            "starting with a letter, at most 64 characters)",
            key,
        )
    check_model_name(node, value)  # the rule's `excludes`: a replica could take the name
    return value


def _parse_model(node: _Node) -> ModelSpec:

    name = _check_name(node, "name", node.field(ModelSpec, "name"))
    engine = node.field(ModelSpec, "engine")
    model = node.get("model", str, "")
    instances = node.field(ModelSpec, "instances")
    family = node.get("family", str, "")
    tasks = node.str_list("tasks")
    args_node = node.child("engine_args")
    args = engine_args_schema.validate(engine, args_node.data, args_node.path, node.file)
    placement = _parse_placement(node.child("placement"))
    extra = {}
    for key in engine_args_schema.EXTRA_SECTIONS.get(engine, ()):
        extra_node = node.child(key)
        if key in node.data:
            extra[key] = engine_args_schema.validate_extra(engine, key, extra_node)
    node.done()
    engine_args_schema.check_model(engine, args, extra, node)
    if engine in NEEDS_MODEL and not model:
        raise node.error(f"is required for engine {engine}", "model")
    if model:
        _check_model_ref(node, engine, model)
    tp, pp = traits(engine).parallelism(args)
    if placement.kind == "cpu" and (tp or 1) * (pp or 1) > 1:
        raise node.error(
            "a model with tensor or pipeline parallelism > 1 cannot run on cpu", "placement.kind"
        )
    return ModelSpec(
        name,
        engine,
        model,
        instances,
        frozen_mapping(args),
        placement,
        family,
        tasks,
        frozen_mapping(extra),
    )


# Where an engine may load weights from besides a path or a Hugging Face id: object
# stores (vLLM's Run:ai streamer reads s3:// and gs://).
_MODEL_URL_SCHEMES = ("s3", "gs")


def _check_model_ref(node: _Node, engine: str, model: str) -> None:
    """`model:` names something an engine can load: a known builtin, a Hugging Face id, a
    path no engine would take for a model refused (a URL, `~`, a folder that exists here
    without a config.json)."""
    if model.startswith(assets.BUILTIN_PREFIX):
        name = model[len(assets.BUILTIN_PREFIX) :]
        if name not in assets.BUILDERS:
            known = ", ".join(assets.BUILDERS)
            raise node.error(f"unknown builtin model {name!r} (known: {known})", "model")
        return
    scheme = model.split("://", 1)[0] if "://" in model else None
    if scheme is not None and scheme not in _MODEL_URL_SCHEMES:
        raise node.error(
            f"{scheme}:// is not a place an engine loads weights from: give a path, a "
            "Hugging Face id or builtin:NAME",
            "model",
        )
    if model.startswith("~"):
        raise node.error(
            "is a relative path ('~' is expanded by no engine): give an absolute path", "model"
        )
    local = Path(model)
    if engine in LOCAL_MODEL_ENGINES and local.is_absolute() and local.exists():
        if local.is_dir() and not (local / "config.json").is_file():
            raise node.error(f"{model} is a folder without config.json, not a model", "model")
        if local.is_file() and local.suffix != ".gguf":
            raise node.error(f"{model} is a file, not a model folder or a .gguf file", "model")


def _check_devices(models: tuple[ModelSpec, ...], hardware: HardwareSpec, file: str) -> None:
    """A model placed on a GPU the hardware does not have is refused here, not at start."""
    for i, m in enumerate(models):
        if hardware.gpu == "cpu" and m.placement.kind == "gpu":
            raise SpecError(
                file, f"models[{i}].placement.kind", "is gpu, but hardware.gpu is cpu (no GPUs)"
            )
        beyond = [d for d in m.placement.devices if d >= hardware.count]
        if beyond:
            raise SpecError(
                file,
                f"models[{i}].placement.devices",
                f"GPU {beyond[0]} does not exist: hardware.count is {hardware.count}",
            )


def _parse_placement(node: _Node) -> PlacementSpec:
    kind = node.field(PlacementSpec, "kind")
    devices = []
    ordinal = rule_of(PlacementSpec, "devices").item or Rule()
    for path, item in node.list("devices"):
        if not isinstance(item, int) or isinstance(item, bool) or ordinal.range_problem(item):
            raise SpecError(
                node.file, path, f"expected a GPU ordinal >= {ordinal.minimum}, got {item!r}"
            )
        devices.append(item)
    mig = node.get("mig", str, None)
    dtype = node.get("dtype", str, None)
    max_batch = node.field(PlacementSpec, "max_batch")
    max_context = node.field(PlacementSpec, "max_context")
    node.done()
    if len(set(devices)) != len(devices):
        raise node.error("lists a device twice", "devices")
    # After done(): a misspelt key is the first thing to tell.
    problem = dtype is not None and rule_of(PlacementSpec, "dtype").choice_problem(dtype)
    if problem:
        raise node.error(problem, "dtype")
    return PlacementSpec(kind, tuple(devices), mig, dtype, max_batch, max_context)


def _check_unique_names(models: tuple[ModelSpec, ...], file: str) -> None:
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        if m.name in seen:
            raise SpecError(
                file, f"models[{i}].name", f"{m.name!r} is already used by models[{seen[m.name]}]"
            )
        seen[m.name] = i


def _parse_router(node: _Node, models: tuple[ModelSpec, ...]) -> RouterSpec:
    names = tuple(m.name for m in models)
    name = _check_name(node, "name", node.field(RouterSpec, "name"))
    default = _backends(node, "default", rule_of(RouterSpec, "default"), names, names[:1])
    rules = _parse_rules(node, names)
    fallback = _parse_fallback(node.child("fallback"), names)
    breaker = _parse_breaker(node.child("breaker"))
    router = RouterSpec(
        name=name,
        default=default,
        rules=rules,
        fallback=MappingProxyType(fallback),
        breaker=breaker,
        **{
            key: node.field(RouterSpec, key)
            for key in (
                "short_prompt_tokens",
                "deadline_s",
                "first_token_timeout_s",
                "max_inflight_per_backend",
                "instances",
                "policy",
            )
        },
        backend_policies=parse_backend_policies(
            node, names, (rule_of(RouterSpec, "backend_policies").item or Rule()).choices or ()
        ),
    )
    node.done()
    return router


def _backends(
    n: _Node, key: str, rule: Rule, names: tuple[str, ...], default: Any = _REQUIRED
) -> tuple[str, ...]:
    """A list of model names under `key` (each one of `names`), at least as many as
    `rule` asks; `default` when the key is absent, if one is given."""
    if default is not _REQUIRED and key not in n.data:
        n.get(key, list, None)
        return default
    values = n.str_list(key)
    for i, value in enumerate(values):
        if value not in names:
            raise SpecError(
                n.file,
                f"{n.child_path(key)}[{i}]",
                f"{value!r} is not a model (models: {', '.join(names)})",
            )
    if len(values) < (rule.min_items or 0):
        raise n.error(f"must name at least {_models(rule.min_items or 0)}", key)
    return values


def _parse_rules(node: _Node, names: tuple[str, ...]) -> tuple[RuleSpec, ...]:
    rules: list[RuleSpec] = []
    for path, item in node.list("rules"):
        rule = _Node(item, path, node.file)
        rule_name = rule.get("name", str, f"rule{len(rules)}")
        match = _parse_match(rule.child("match"))
        rules.append(
            RuleSpec(
                rule_name,
                match,
                _backends(rule, "backends", rule_of(RuleSpec, "backends"), names),
                rule.field(RuleSpec, "policy"),
            )
        )
        rule.done()
    if len({r.name for r in rules}) != len(rules):
        raise node.error("rule names must be unique", "rules")
    return tuple(rules)


def _parse_fallback(fb_node: _Node, names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    fallback = {}
    for key in list(fb_node.data):
        if key not in names:
            raise fb_node.error(f"{key!r} is not a model (models: {', '.join(names)})", key)
        item_rule = rule_of(RouterSpec, "fallback").item or Rule()
        fallback[key] = _backends(fb_node, key, item_rule, names)
    fb_node.done()
    return fallback


def _models(count: int) -> str:
    return "one model" if count == 1 else f"{count} models"


def _parse_match(node: _Node) -> MatchSpec:
    def get_str(key: str) -> Any:
        return node.get(key, str, None)

    def get_int(key: str) -> Any:
        return node.field(MatchSpec, key)

    match = MatchSpec(
        hint=get_str("hint"),
        family=get_str("family"),
        task=get_str("task"),
        min_turns=get_int("min_turns"),
        max_turns=get_int("max_turns"),
        min_prompt_tokens=get_int("min_prompt_tokens"),
        max_prompt_tokens=get_int("max_prompt_tokens"),
        tenant=get_str("tenant"),
        tier=get_str("tier"),
        shared_prefix=node.get("shared_prefix", bool, None),
    )
    node.done()
    for low, high in (("min_turns", "max_turns"), ("min_prompt_tokens", "max_prompt_tokens")):
        lo, hi = getattr(match, low), getattr(match, high)
        if lo is not None and hi is not None and lo > hi:
            raise node.error(f"{low} {lo} > {high} {hi}: the rule can never match", low)
    return match


def _parse_breaker(node: _Node) -> BreakerSpec:
    breaker = BreakerSpec(
        **{f: node.field(BreakerSpec, f) for f in BreakerSpec.__dataclass_fields__}
    )
    node.done()
    return breaker
