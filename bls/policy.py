"""The routing policy: (request features, backend health) → ordered candidate backends.

Pure: no Triton, no clock. The router model extracts RequestFeatures from a request once,
asks `Policy.candidates`, and tries the candidates in order. The policy's config is
router.json's RouterConfig (router_config.py), which `trident repo` renders beside the
router (builder/render/router_json.py) and the router reads once at load.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bls.router_config import MatchConfig, RouterConfig, RuleConfig

CHARS_PER_TOKEN = 4  # prompt length estimate without a tokenizer (English text ≈ 4)
# Where a request names its LoRA adapter: in its sampling_parameters tensor (JSON), or
# `lora_name` among its request parameters. The router collects both with the hints.
ADAPTER_KEYS = ("sampling_parameters", "lora_name")
# How a backend's replicas are chosen (replica_policy.py): the spec offers these names
# (builder/spec/router_policy.py reads them here) and router.json carries one.
REPLICA_POLICIES = ("round_robin", "least_loaded", "prefix_aware")
# A conversation's next turn resends its history, and the replica that served the last
# turn holds it; on prompts that share nothing prefix_aware degrades to the load.
DEFAULT_REPLICA_POLICY = "prefix_aware"


class UnknownRoute(ValueError):
    """A route hint that names neither a rule nor a backend: a client error (400) whose
    parameter is `param` (error_classes.py)."""

    param = "route"


class UnknownAdapter(UnknownRoute):
    """A LoRA adapter (sampling_parameters.lora_name) that no backend of the route holds."""

    param = "lora_name"


@dataclass(frozen=True)
class RequestFeatures:
    hint: str | None = None
    family: str | None = None
    task: str | None = None
    turns: int = 0  # user messages in a chat request (0: plain text)
    prompt_tokens: int = 0
    tenant: str | None = None
    tier: str | None = None
    shared_prefix: bool = False
    conversation_id: str | None = None
    adapter: str | None = None  # the LoRA adapter the request names (lora_name)


def estimate_tokens(text_length: int) -> int:
    return (text_length + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def features_from(
    text: str | None, messages: list[Any] | None, hints: dict[str, Any]
) -> RequestFeatures:
    """RequestFeatures from a request's prompt or chat messages and its routing hints
    (tensors or request parameters: route, task, family, tenant, tier, conversation_id,
    shared_prefix)."""
    if messages is not None:
        # Malformed entries are skipped here: the backend rejects them with a clear error.
        valid = [m for m in messages if isinstance(m, dict)]
        turns = sum(1 for m in valid if m.get("role") == "user")
        length = sum(len(m["content"]) for m in valid if isinstance(m.get("content"), str))
        has_system = any(m.get("role") == "system" for m in valid)
    else:
        turns, length, has_system = 0, len(text or ""), False
    conversation = hints.get("conversation_id") or None
    shared = hints.get("shared_prefix")
    if isinstance(shared, str):
        shared = shared.lower() in ("1", "true", "yes")
    return RequestFeatures(
        hint=hints.get("route") or None,
        family=hints.get("family") or None,
        task=hints.get("task") or None,
        turns=turns,
        prompt_tokens=estimate_tokens(length),
        tenant=hints.get("tenant") or None,
        tier=hints.get("tier") or None,
        shared_prefix=bool(shared)
        if shared is not None
        else (has_system or turns > 1 or conversation is not None),
        conversation_id=conversation,
        adapter=adapter_name(hints),
    )


def adapter_name(hints: dict[str, Any]) -> str | None:
    """The adapter a request names: `lora_name` in its sampling_parameters tensor, else
    among its request parameters (vllm_backend's dialects; the tensor wins, as in
    request.parse_generate). Malformed JSON names none here: the backend says why."""
    text = hints.get("sampling_parameters")
    if text is None:
        name = hints.get("lora_name")
    else:
        try:
            loaded = json.loads(text) if isinstance(text, str) and text else None
        except (ValueError, RecursionError):
            return None
        name = loaded.get("lora_name") if isinstance(loaded, dict) else None
    return name if isinstance(name, str) and name else None


def _matches(m: MatchConfig, f: RequestFeatures) -> bool:
    """Whether the request has every feature the rule asks for (None: not asked)."""
    return (
        (m.hint is None or f.hint == m.hint)
        and (m.family is None or f.family == m.family)
        and (m.task is None or f.task == m.task)
        and (m.min_turns is None or f.turns >= m.min_turns)
        and (m.max_turns is None or f.turns <= m.max_turns)
        and (m.min_prompt_tokens is None or f.prompt_tokens >= m.min_prompt_tokens)
        and (m.max_prompt_tokens is None or f.prompt_tokens <= m.max_prompt_tokens)
        and (m.tenant is None or f.tenant == m.tenant)
        and (m.tier is None or f.tier == m.tier)
        and (m.shared_prefix is None or f.shared_prefix == m.shared_prefix)
    )


class Policy:
    def __init__(self, config: RouterConfig):
        self.backends = config.backends
        self.default = config.default
        self.rules: tuple[RuleConfig, ...] = config.rules
        self.fallback = config.fallback
        self.short_prompt_tokens = config.short_prompt_tokens
        self._rule_by_name = {r.name: r for r in self.rules}

    def routes(self) -> list[str]:
        """Valid route hints: rule names and backend names."""
        return sorted(set(self._rule_by_name) | set(self.backends))

    def primary(self, f: RequestFeatures) -> tuple[str, list[str]]:
        """(route name, backends) before fallback and health."""
        if f.hint is not None:
            if f.hint in self._rule_by_name:
                return f.hint, list(self._rule_by_name[f.hint].backends)
            if f.hint in self.backends:
                return f.hint, [f.hint]
            matched = [r for r in self.rules if r.match.hint == f.hint]
            if not matched:
                raise UnknownRoute(
                    f"unknown route {f.hint!r} (valid routes: {', '.join(self.routes())})"
                )
        for rule in self.rules:
            if _matches(rule.match, f):
                return rule.name, list(rule.backends)
        return "default", list(self.default)

    def pinned(self, f: RequestFeatures) -> bool:
        """Whether the request names a backend (route hint = a backend's name, not a rule's):
        then only that backend may answer it."""
        return f.hint is not None and f.hint not in self._rule_by_name and f.hint in self.backends

    def candidates(
        self, f: RequestFeatures, available: Callable[[str], bool] = lambda name: True
    ) -> tuple[str, list[str]]:
        """(route name, backends to try in order): primaries each followed by their
        fallback chain (a pinned backend alone), unavailable (breaker open, full)
        backends left out, and speculative backends skipped for short prompts when a
        healthy plain backend of the same family is still on the list."""
        route, primaries = self.primary(f)
        if f.conversation_id and len(primaries) > 1:
            primaries = _affinity_order(primaries, f.conversation_id)
        ordered: list[str] = []
        if self.pinned(f):
            # A client that names a backend asked for that model: its fallback answering
            # would be another model's answer. That backend, or an error (overloaded,
            # unavailable, failed), never a substitute.
            ordered = list(primaries)
        else:
            for name in primaries:
                self._append_chain(name, ordered)
        if f.adapter is not None:
            route, ordered = self._holders(f, route, ordered)
        # Health first: a plain backend that is down must not push out its speculative twin.
        healthy = [name for name in ordered if available(name)]
        if f.prompt_tokens < self.short_prompt_tokens:
            healthy = self._skip_speculative(healthy)
        return route, healthy

    def _holders(self, f: RequestFeatures, route: str, ordered: list[str]) -> tuple[str, list[str]]:
        """Only backends holding the adapter, in the route's order (fallbacks included).
        A route without any: every holder, in spec order, unless the client named the
        backend or rule itself."""
        holders = [n for n, b in self.backends.items() if f.adapter in b.adapters]
        if not holders:
            raise UnknownAdapter(
                f"unknown adapter {f.adapter!r}: no backend holds it "
                f"(adapters: {self._adapter_list()})"
            )
        kept = [n for n in ordered if n in holders]
        if kept:
            return route, kept
        if f.hint is not None:
            raise UnknownAdapter(
                f"route {route!r} has no backend holding adapter "
                f"{f.adapter!r} (held by: {', '.join(holders)})"
            )
        return f"adapter:{f.adapter}", holders

    def _adapter_list(self) -> str:
        held = [f"{a} ({n})" for n, b in self.backends.items() for a in b.adapters]
        return ", ".join(held) or "none"

    def _append_chain(self, name: str, ordered: list[str]) -> None:
        if name in ordered:
            return
        ordered.append(name)
        for nxt in self.fallback.get(name, ()):
            self._append_chain(nxt, ordered)

    def _skip_speculative(self, ordered: list[str]) -> list[str]:
        """Speculative decoding slows short prompts down: prefer a plain backend of the
        same model family when the list has one."""
        backends = self.backends
        plain_families = {
            backends[n].family
            for n in ordered
            if not backends[n].speculative and backends[n].family
        }
        return [
            n
            for n in ordered
            if not (backends[n].speculative and backends[n].family in plain_families)
        ]


def _affinity_order(backends: list[str], conversation_id: str) -> list[str]:
    """Rotate so one conversation always starts on the same backend (prefix-cache hits),
    while different conversations spread across the group."""
    start = zlib.crc32(conversation_id.encode()) % len(backends)
    return backends[start:] + backends[:start]
