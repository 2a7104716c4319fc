"""Per-tenant admission in the router: quotas, rate limits, priority tiers and
prefix-cache isolation (the spec's `tenants:` section, builder/spec/tenants.py).

Every request is admitted or refused before the router tries a backend, so a refusal
never reaches a backend nor counts against one. The tenant is the `tenant` routing hint
(an input tensor or a request parameter). An admitted request holds a concurrency lease
until its stream ends, however it ends (`run` releases it in a `finally`), and is charged
its real prompt + completion tokens then. The counters live in tenant_store (in this
process, or in Redis shared by every router); when Redis is down or slow, the spec's
on_redis_error decides, and the decision is counted. The release and the charge are
written off the request's path and retried until the store takes them (tenant_outbox);
a lease the router never releases (it died) expires with the request's deadline.

The tier comes from the spec, never from the request: it replaces the client's `tier`
routing hint (what the policy's rules match) and becomes vLLM's request `priority`; a
`cache_salt` per tenant keeps tenants' prefix caches apart unless they are listed in
share_prefix_cache. Both travel to the engine model as input tensors.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.adapters import string_tensor
from bls.router_config import TenantLimitsConfig, TenantsConfig
from bls.tenant_names import TENANT_RE
from bls.tenant_outbox import Outbox
from bls.tenant_store import (
    CHOICE_TAKEN,
    FanOut,
    Limits,
    LocalStore,
    RedisStore,
    Store,
    StoreUnavailable,
)
from trident_common.error_classes import CLIENT, FORBIDDEN, RATE_LIMIT, UNAVAILABLE
from trident_common.faults import BadRequest
from trident_common.interface import (
    CACHE_SALT,
    FAN_OUT_GROUP,
    FAN_OUT_INDEX,
    FAN_OUT_N,
    PRIORITY,
)
from trident_common.metrics import COUNTER, GAUGE
from trident_common.trust import tenant_salt

if TYPE_CHECKING:
    from bls.inbound import Inbound

_T = TypeVar("_T")
# A metric family: (name, description, metric kind), as RouterMetrics.FAMILIES has them.
Family = tuple[str, str, str]
Labels = tuple[tuple[str, str], ...]

# A lease outlives the router's deadline by this much: the router ends a request at its
# deadline (checked every STREAM_WATCH_S, later on a loaded loop), then releases it. A
# lease a dead router never releases blocks its tenant no longer than that.
LEASE_MARGIN_S = 5.0
CLOSE_FLUSH_S = 2.0  # at unload, how long queued releases and charges may take
ANONYMOUS = "_anonymous"  # the bucket of requests that name no tenant
OTHER = "_other"  # metric label of tenants not in the spec (clients pick names)
FAN_OUT_KEYS = (FAN_OUT_GROUP, FAN_OUT_N, FAN_OUT_INDEX)
MAX_GROUP_CHARS = 64  # the frontend's group ids are 32 hex digits
UNITS = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "max_concurrent": "concurrent requests (max_concurrent)",
}


class Series(Protocol):
    """One labelled series of the router's metrics (router_metrics.Series)."""

    def increment(self, value: float) -> None: ...

    def set(self, value: float) -> None: ...


class MetricSource(Protocol):
    """Where the tenant metrics' series come from (router_metrics.RouterMetrics)."""

    def metric(self, kind: str, labels: Labels, *, families: Mapping[str, Family]) -> Series: ...


class Tenant:
    __slots__ = ("name", "label", "limits", "quota", "tier", "priority", "salt")

    def __init__(self, name: str, label: str, entry: TenantLimitsConfig, shared: bool) -> None:
        self.name, self.label = name, label
        self.quota = entry  # the spec's numbers, for messages
        self.limits = Limits(
            entry.requests_per_minute, entry.tokens_per_minute, entry.max_concurrent
        )
        self.tier = entry.tier
        self.priority = entry.priority
        # Secret: a keyed HMAC of the name (trust.py), so no one can compute another's.
        self.salt = None if shared else tenant_salt(name)

    def most_at_once(self) -> tuple[int, str] | None:
        """The most requests this tenant can ever have admitted at once, and the limit
        that says so (None: no limit does): max_concurrent, and requests_per_minute,
        whose bucket holds a minute's requests when full. tokens_per_minute is charged
        after the answers and bounds no count of requests."""
        bounds = [
            (limit, reason)
            for limit, reason in (
                (self.limits.max_concurrent, "max_concurrent"),
                (self.limits.rpm, "requests_per_minute"),
            )
            if limit
        ]
        return min(bounds) if bounds else None


class Ticket:
    """One admitted request: its tenant and concurrency lease."""

    __slots__ = ("tenant", "lease_id")

    def __init__(self, tenant: Tenant, lease_id: str) -> None:
        self.tenant, self.lease_id = tenant, lease_id


class Refused(Exception):
    def __init__(self, label: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.label, self.reason = label, reason


class Admission:
    """A tenant's admission still under way (Tenants.run, a remote store): the request's
    work awaits `wait` before it calls a backend; `settle` ends it whatever the work did."""

    __slots__ = ("decision", "started", "ticket", "refusal")

    def __init__(self, decision: Coroutine[Any, Any, Ticket]) -> None:
        self.decision = decision
        self.started = False
        self.ticket: Ticket | None = None
        self.refusal: Refused | None = None

    async def wait(self) -> Ticket:
        """The Ticket; raises Refused. Awaiting again gives the same answer."""
        if not self.started:
            self.started = True
            try:
                self.ticket = await self.decision
            except Refused as e:
                self.refusal = e
        if self.refusal is not None:
            raise self.refusal
        if self.ticket is None:  # the first wait was cancelled mid-way
            raise asyncio.CancelledError
        return self.ticket

    async def settle(self) -> Ticket | None:
        """The Ticket to finish once the work is over, None when there is none: the
        tenant was refused, or the wait was cancelled (its lease then expires). A work
        that ended before it waited (a bad request, no backend) waits here: a store's
        call once sent must be answered, and an admitted lease released."""
        if not self.started:
            try:
                return await self.wait()
            except (Refused, asyncio.CancelledError):
                return None
        return self.ticket


def fan_out_of(parameters: Mapping[str, Any] | None) -> FanOut | None:
    """The fan-out a request belongs to, from its request parameters (the frontend's, one
    call per choice of an OpenAI request's n); None when it names none. Raises BadRequest
    naming the parameter for a malformed one: all three or none, n >= 1, 0 <= index < n."""
    if not parameters or not any(key in parameters for key in FAN_OUT_KEYS):
        return None
    group, n, index = (parameters.get(key) for key in FAN_OUT_KEYS)
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
        raise BadRequest(
            f"{FAN_OUT_GROUP} must be a text of 1 to {MAX_GROUP_CHARS} characters with "
            f"{FAN_OUT_N} and {FAN_OUT_INDEX}",
            FAN_OUT_GROUP,
        )
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadRequest(f"{FAN_OUT_N} must be an integer of 1 or more", FAN_OUT_N)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        raise BadRequest(
            f"{FAN_OUT_INDEX} must be an integer from 0 to {FAN_OUT_N} - 1 ({n - 1})",
            FAN_OUT_INDEX,
        )
    return FanOut(group, n, index)


def read_password(config: TenantsConfig) -> str | None:
    """The Redis password from the environment or a file; raises if named but absent."""
    if config.password_env:
        value = os.environ.get(config.password_env)
        if not value:
            raise RuntimeError(
                f"tenants.password_env: the environment variable {config.password_env} is not set"
            )
        return value
    if config.password_file:
        try:
            with open(config.password_file) as f:
                return f.read().strip()
        except OSError as e:
            raise RuntimeError(
                f"tenants.password_file: cannot read {config.password_file}: {e.strerror}"
            ) from None
    return None


class Tenants:
    """The router's tenant gate; a no-op when the spec has no `tenants:` section."""

    def __init__(
        self,
        config: TenantsConfig | None,
        router_metrics: MetricSource,
        deadline_s: float,
        store: Store | None = None,
        warn: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.enabled = config is not None
        self.warn = warn  # the router's log: what the store said when it failed
        self.store_trouble = ""  # the last store error logged (each said once)
        if config is None:
            return
        # Only an enabled gate has one: no method reads it when the gate is disabled.
        self.config = config
        self.lease_ms = (deadline_s + LEASE_MARGIN_S) * 1000.0
        shared = set(config.share_prefix_cache)
        self.known = {
            name: Tenant(name, name, entry, name in shared) for name, entry in config.limits.items()
        }
        self.metrics = TenantMetrics(router_metrics)
        if store is None and config.redis:
            store = RedisStore(
                config.redis,
                read_password(config),
                config.namespace,
                username=config.username,
            )
        self.store = store or LocalStore()
        self.outbox = Outbox(
            self.store,
            on_retry=lambda: self.metrics.redis_failure("retry"),
            on_lost=lambda: self.metrics.redis_failure("lost"),
        )

    def close(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """At unload: write the releases and charges still queued (bounded wait)."""
        if self.enabled:
            self.outbox.flush(loop, CLOSE_FLUSH_S)

    def set_tier(self, hints: dict[str, Any]) -> None:
        """Replace the client's `tier` routing hint with its tenant's tier from the spec
        (the default's for a tenant the spec does not name), before the router computes
        the request's routing features: a client cannot route itself as another tier."""
        if not self.enabled:
            return
        name = hints.get("tenant")
        tenant = self.known.get(str(name)) if name else None
        hints["tier"] = tenant.tier if tenant is not None else self.config.default.tier

    def identify(self, name: object) -> Tenant:
        """The request's Tenant; raises Refused (unknown or malformed name)."""
        if name is None or name == "":
            name = ANONYMOUS
        name = str(name)
        tenant = self.known.get(name)
        if tenant is not None:
            return tenant
        label = ANONYMOUS if name == ANONYMOUS else OTHER
        if name != ANONYMOUS and not TENANT_RE.fullmatch(name):
            raise Refused(
                label,
                "bad_tenant",
                CLIENT.mark(
                    f"tenant {name[:64]!r} is not a tenant name (letters, digits, '_', '.', "
                    "'@', '-')",
                    "tenant",
                ),
            )
        if self.config.unknown == "reject":
            what = (
                "the request names no tenant (give the `tenant` input or parameter)"
                if name == ANONYMOUS
                else f"tenant {name!r} is not known"
            )
            raise Refused(label, "unknown_tenant", FORBIDDEN.mark(what))
        tenant = Tenant(name, label, self.config.default, name in self.config.share_prefix_cache)
        return tenant

    def check_fan_out(self, tenant: Tenant, fan_out: FanOut) -> None:
        """Raises Refused (the client's error, naming `n`) for a fan-out of more choices
        than the tenant can ever have at once: waiting would never admit it."""
        most = tenant.most_at_once()
        if most is None or fan_out.n <= most[0]:
            return
        limit, reason = most
        raise Refused(
            tenant.label,
            "too_many_choices",
            CLIENT.mark(
                f"n is {fan_out.n}, and each choice is a request of its own: tenant "
                f"{tenant.name!r} may never have more than {limit} at once (its {reason} "
                f"is {limit}); ask for n of {limit} or fewer",
                "n",
            ),
        )

    async def admit(self, name: object, fan_out: FanOut | None = None) -> Ticket:
        """A Ticket, or raises Refused naming the tenant and the limit. A fan-out's call
        is admitted with its group (all n or none; tenant_store.FanOut)."""
        return await self.decide(*self.ask(name, fan_out), fan_out)

    def ask(self, name: object, fan_out: FanOut | None) -> tuple[Tenant, str, Awaitable[str]]:
        """The request's tenant, its lease id and the store's verdict to await (a remote
        store's call is on its way when this returns); raises Refused for a tenant
        refused by name or a fan-out it can never have."""
        tenant = self.identify(name)
        if fan_out is not None:
            self.check_fan_out(tenant, fan_out)
            lease_id = fan_out.lease(fan_out.index)
        else:
            lease_id = secrets.token_hex(8)
        verdict = self.store.admit(tenant.name, tenant.limits, lease_id, self.lease_ms, fan_out)
        return tenant, lease_id, verdict

    async def decide(
        self, tenant: Tenant, lease_id: str, verdict: Awaitable[str], fan_out: FanOut | None
    ) -> Ticket:
        """The Ticket once the store's verdict admits; raises Refused otherwise."""
        try:
            reason = await verdict
        except StoreUnavailable as e:
            decision = self.config.on_redis_error
            self.metrics.redis_failure(decision)
            if str(e) != self.store_trouble:
                self.store_trouble = str(e)
                self.warn(f"tenant store: {e}; admitting by on_redis_error: {decision}")
            if decision == "deny":
                # The store's error (Redis's address, its words) is the operator's: in
                # the router's log. The client learns it may retry, not where Redis is.
                raise Refused(
                    tenant.label,
                    "redis_unavailable",
                    UNAVAILABLE.mark(
                        f"cannot check the limits of tenant {tenant.name!r} now (the tenant "
                        "store is unavailable); refused (on_redis_error: deny)"
                    ),
                ) from None
            reason = ""
        if reason == CHOICE_TAKEN and fan_out is not None:
            raise Refused(
                tenant.label,
                reason,
                CLIENT.mark(
                    f"choice {fan_out.index} of fan-out {fan_out.group[:MAX_GROUP_CHARS]!r} "
                    "was admitted already",
                    FAN_OUT_INDEX,
                ),
            )
        if reason:
            limit = tenant.quota.limit(reason)
            over = f"tenant {tenant.name!r} is over {limit} {UNITS[reason]}"
            if fan_out is not None:
                over += f" with {fan_out.n} choices (n), admitted together or not at all"
            raise Refused(tenant.label, reason, RATE_LIMIT.mark(over))
        self.metrics.admitted(tenant.label)
        return Ticket(tenant, lease_id)

    async def run(
        self,
        name: object,
        work: Callable[[Admission | None], Coroutine[Any, Any, _T]],
        attempts: Sequence[object],
        sender: pb_utils.ResponseSender,
        fail: Callable[[pb_utils.ResponseSender, str, str], _T],
        fan_out: FanOut | None = None,
    ) -> _T:
        """Run `work` (the request's attempts) if the tenant is admitted, else answer
        with `fail` (the router's); release the ticket however the request ends.
        `fan_out`: the fan-out the request is one call of.

        With a remote store the verdict is a round trip (about 0.25 ms in a serving
        stub, docs/router.md "Tenants"): `work` starts at once with the Admission, to
        prepare the backend request meanwhile, and must await it before any backend is
        called; a refusal raised there is answered here. Otherwise `work` gets None and
        starts once the tenant is admitted."""
        if not self.enabled:
            return await work(None)
        if not self.store.remote:
            try:
                ticket = await self.admit(name, fan_out)
            except Refused as e:
                return self.refused(e, sender, fail)
            try:
                return await work(None)
            finally:
                self.finish(ticket, attempts)
        try:
            tenant, lease_id, verdict = self.ask(name, fan_out)
        except Refused as e:
            return self.refused(e, sender, fail)
        admission = Admission(self.decide(tenant, lease_id, verdict, fan_out))
        try:
            # One loop turn: the store's sender writes the call before `work` prepares.
            await asyncio.sleep(0)
            return await work(admission)
        except Refused as e:  # from admission.wait(), before any backend
            return self.refused(e, sender, fail)
        finally:
            settled = await admission.settle()
            if settled is not None:
                self.finish(settled, attempts)

    def refused(
        self,
        refusal: Refused,
        sender: pb_utils.ResponseSender,
        fail: Callable[[pb_utils.ResponseSender, str, str], _T],
    ) -> _T:
        self.metrics.rejected(refusal.label, refusal.reason)
        return fail(sender, str(refusal), "tenant")

    def finish(self, ticket: Ticket, attempts: Sequence[object]) -> None:
        """Release the lease and charge the tokens, off the request's path."""
        tenant = ticket.tenant
        prompt, completion = _token_counts(attempts)
        self.metrics.finished(tenant.label, prompt, completion)
        self.outbox.put(tenant.name, tenant.limits, ticket.lease_id, prompt + completion)

    def of(self, inbound: Inbound) -> Tenant | None:
        """The request's Tenant; None without tenants."""
        if not self.enabled:
            return None
        name = inbound.features.tenant
        tenant = self.known.get(str(name)) if name else None
        return tenant if tenant is not None else self.identify(name)  # admitted: no raise

    def inputs(self, tenant: Tenant | None, inbound: Inbound) -> list[pb_utils.Tensor]:
        """The engine inputs for the request's tenant (`of`): priority and cache_salt,
        and the token-count flags a Tally needs (they replace the client's own)."""
        if tenant is None:
            return []
        tensors = [pb_utils.Tensor(PRIORITY, np.array([tenant.priority], dtype=np.int32))]
        if tenant.salt is not None:
            tensors.append(string_tensor(CACHE_SALT, tenant.salt))
        if inbound.returns is not None:
            tensors += [pb_utils.Tensor(flag, np.array([True])) for flag in Tally.FLAGS]
        return tensors

    def tally(self, inbound: Inbound) -> Tally | None:
        """A Tally for a request whose return_* flags would hide or split the token
        counts the router charges; None when the engine's running totals will do."""
        if not self.enabled or inbound.returns is None:
            return None
        return Tally(
            {
                name
                for name, flag in zip(Tally.OUTPUTS, Tally.FLAGS, strict=True)
                if not inbound.returns.get(flag)
            }
        )


class Tally:
    """Token counts of a request sent with vllm_backend's return_* flags. The router asks
    the engine for both counts (then each response carries that response's own output
    tokens), adds them up, and removes the counts the client did not ask for."""

    OUTPUTS = ("num_input_tokens", "num_output_tokens")
    FLAGS = tuple(f"return_{name}" for name in OUTPUTS)

    def __init__(self, hidden: set[str]) -> None:
        self.hidden = hidden
        self.prompt = self.completion = 0

    def take(self, response: pb_utils.InferenceResponse) -> pb_utils.InferenceResponse:
        """Count one response; the response the client gets (without hidden outputs)."""
        tensors = response.output_tensors()
        for tensor in tensors:
            name = tensor.name()
            if name == "num_input_tokens":
                self.prompt = int(tensor.as_numpy().reshape(-1)[0])
            elif name == "num_output_tokens":
                self.completion += int(tensor.as_numpy().reshape(-1)[0])
        if not self.hidden:
            return response
        return pb_utils.InferenceResponse(
            output_tensors=[t for t in tensors if t.name() not in self.hidden]
        )


def _token_counts(attempts: Sequence[object]) -> tuple[int, int]:
    """(prompt, completion) tokens of the attempt that answered: its Tally's, else from
    its last response (the engines report running totals); zeros when none did or it
    reports none."""
    for relay in reversed(attempts):
        tally = getattr(relay, "tally", None)
        if tally is not None and getattr(relay, "last", None) is not None:
            return tally.prompt, tally.completion
        response = getattr(relay, "last", None)
        if response is None:
            continue
        prompt, completion = (
            0 if tensor is None else int(tensor.as_numpy().reshape(-1)[0])
            for tensor in (
                pb_utils.get_output_tensor_by_name(response, name)
                for name in ("num_input_tokens", "num_output_tokens")
            )
        )
        return prompt, completion
    return 0, 0


class TenantMetrics:
    FAMILIES: ClassVar[dict[str, Family]] = {
        "admitted": ("trident_tenant_admitted_total", "Requests admitted, by tenant", COUNTER),
        "rejected": (
            "trident_tenant_rejected_total",
            "Requests refused before any backend, by tenant and reason",
            COUNTER,
        ),
        "tokens": (
            "trident_tenant_tokens_total",
            "Tokens charged to a tenant, by kind (prompt, completion)",
            COUNTER,
        ),
        "inflight": (
            "trident_tenant_inflight",
            "A tenant's requests in flight in this router",
            GAUGE,
        ),
        "redis": (
            "trident_tenant_redis_failures_total",
            "Redis calls that failed or timed out, by what was done: allow or deny "
            "(an admission, on_redis_error), retry (a release and token charge, "
            "tried again later), lost (one dropped: queue full or failing for "
            "10 minutes)",
            COUNTER,
        ),
    }

    def __init__(self, router_metrics: MetricSource) -> None:
        self.router_metrics = router_metrics  # its set and series cache hold these too
        self.inflight: dict[str, int] = {}

    def _metric(self, kind: str, labels: Labels) -> Series:
        return self.router_metrics.metric(kind, labels, families=self.FAMILIES)

    def admitted(self, tenant: str) -> None:
        self._metric("admitted", (("tenant", tenant),)).increment(1)
        self.inflight[tenant] = self.inflight.get(tenant, 0) + 1
        self._metric("inflight", (("tenant", tenant),)).set(self.inflight[tenant])

    def rejected(self, tenant: str, reason: str) -> None:
        self._metric("rejected", (("tenant", tenant), ("reason", reason))).increment(1)

    def finished(self, tenant: str, prompt: int, completion: int) -> None:
        self.inflight[tenant] -= 1
        self._metric("inflight", (("tenant", tenant),)).set(self.inflight[tenant])
        for kind, count in (("prompt", prompt), ("completion", completion)):
            if count:
                self._metric("tokens", (("tenant", tenant), ("kind", kind))).increment(count)

    def redis_failure(self, decision: str) -> None:
        self._metric("redis", (("decision", decision),)).increment(1)
