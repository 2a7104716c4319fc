"""Tenants' counters: in this router process, or shared by every router through Redis.

The algorithm (both stores): a rate limit is a GCRA token bucket (the "generic cell rate
algorithm" of ATM networks, as in redis-cell and Stripe's limiter). Per tenant and limit
one number is kept, the theoretical arrival time (TAT): each request moves it 60 s / limit
into the future, and a request is refused when that would put it more than 60 s ahead.
So a tenant may burst its whole minute's allowance, then earns it back continuously;
unlike a fixed window there is no double burst at the window's edge, and unlike a
sliding log the state is one key of O(1) size that expires by itself once the bucket is
full again. tokens_per_minute is charged after the response (the real count) and may go
into debt: the next request is refused while the debt lasts. max_concurrent is a set of
leases (sorted set, score = expiry): a router that dies without releasing its leases
loses them when they expire (the router's deadline plus a margin).

Redis: one Lua script per admission and per release, so a check-and-update is atomic
across routers; the clock is Redis's own (TIME), so routers need not agree on the time.
The client is one redis-py asyncio Connection per store (ACL users, TLS, reconnects,
the protocol). The calls made in one turn of the event loop, and those made while the
previous batch was on its way, go to Redis as one batch of commands: a burst of
requests costs one round trip and a few event-loop wake-ups instead of one connection
and a dozen wake-ups each, which on a loaded router (its event loop waiting for the GIL
behind relay threads) made redis-py's plain per-call path several times slower than
the budget (docs/router.md, "Tenants"). The batch is written on the Connection itself:
redis-py's client, pool and pipeline around each call cost about as much as the round
trip in the router's stub (docs/results/2026-12-05-1220-tenant-check-breakdown.md).
Every call has a time budget sized for a busy machine (TIMEOUT_S); a failed call makes
the store "failing": for RETRY_S requests decide at once (the caller's on_redis_error),
then one call at a time probes Redis until one succeeds, so a stalled Redis costs one
request the budget per RETRY_S instead of every request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, ResponseError

PERIOD_MS = 60_000.0
REASONS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
# A fan-out's call whose choice was admitted already: only a client that forged the
# frontend's fan-out parameters sends one (tenants.FanOut).
CHOICE_TAKEN = "choice_taken"
# A fan-out's first call takes the leases of all n choices, but a choice's own lease
# lasts the router's deadline only once its call arrives: until then it expires after
# this. The frontend may cancel a choice before the router sees it (a client that
# leaves at once; Triton then refuses the queued request without running the router),
# and that choice's lease would otherwise block its tenant until the deadline. The
# choices of one request are sent together and arrive within milliseconds (one that
# comes later still runs, its group admitted, and takes its lease again).
CHOICE_ARRIVAL_MS = 10_000.0
# The budget of one call. A healthy call measured on the 2-core machine under 16 and 32
# CPU burners (16 calls at once) took up to 0.34 s and 0.80 s (docs/router.md,
# "Tenants"): 50 ms, the budget before, was blown there with Redis healthy. A budget
# only costs time when Redis is stalled with its connection open; refused or reset
# connections fail at once.
TIMEOUT_S = 2.0
RETRY_S = 0.5  # after a failure, requests decide without Redis for this long


class StoreUnavailable(Exception):
    """Redis is down, slow or refused the call: the caller's policy decides."""


class Limits:
    """One tenant's limits as the stores read them (0: unlimited)."""

    __slots__ = ("rpm", "tpm", "max_concurrent")

    def __init__(
        self, rpm: int | None = None, tpm: int | None = None, max_concurrent: int | None = None
    ) -> None:
        self.rpm, self.tpm, self.max_concurrent = rpm or 0, tpm or 0, max_concurrent or 0


class FanOut:
    """One of the n calls of a fan-out (an OpenAI request's n choices): the calls of one
    `group` are admitted as one unit. The first of them to reach a store admits all n
    (n requests against the rate limit, n concurrency leases, or none of either) and the
    store keeps that verdict for the group; each call then takes the lease of its own
    `index`, once (a lease not taken within CHOICE_ARRIVAL_MS expires). A refused
    group charges nothing."""

    __slots__ = ("group", "n", "index")

    def __init__(self, group: str, n: int, index: int) -> None:
        self.group, self.n, self.index = group, n, index

    def lease(self, index: int) -> str:
        return f"{self.group}:{index}"

    def leases(self) -> list[str]:
        return [self.lease(i) for i in range(self.n)]


class Store(Protocol):
    """What a tenant store does (LocalStore, RedisStore): take a lease when the limits
    admit a request (or a fan-out's n), and release it and charge the tokens when the
    request ends. `remote`: a verdict takes a round trip, and admit sends its call before
    it returns (the caller has work to do meanwhile: bls/tenants.py, Tenants.run)."""

    remote: ClassVar[bool]

    def admit(
        self,
        tenant: str,
        limits: Limits,
        lease_id: str,
        lease_ms: float,
        fan_out: FanOut | None = None,
    ) -> Awaitable[str]: ...

    async def finish(self, tenant: str, limits: Limits, lease_id: str, tokens: int) -> None: ...


# -- in the router process ------------------------------------------------------------------
class LocalStore:
    """Counters of this router alone (no `redis` in the spec). Same algorithm as the Lua
    below; `clock` in seconds (injected by tests)."""

    remote: ClassVar[bool] = False

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, arrival_ms: float = CHOICE_ARRIVAL_MS
    ) -> None:
        self.clock, self.arrival_ms = clock, arrival_ms
        self.tats: dict[tuple[str, str], float] = {}  # (tenant, "rpm" | "tpm") → TAT in ms
        self.leases: dict[str, dict[str, float]] = {}  # tenant → {lease id: expiry in ms}
        # (tenant, fan-out group) → (its verdict, the indexes that took their lease,
        # when the entry expires in ms): what the Lua below keeps in the group's key.
        self.fan_outs: dict[tuple[str, str], tuple[str, set[int], float]] = {}

    async def admit(
        self,
        tenant: str,
        limits: Limits,
        lease_id: str,
        lease_ms: float,
        fan_out: FanOut | None = None,
    ) -> str:
        """'' when admitted (a lease is taken), else the limit that refused it. A
        fan-out's call: the group's verdict, taken for all n by its first call."""
        now = self.clock() * 1000.0
        self._prune(now)
        if fan_out is None:
            return self._admit(tenant, limits, [lease_id], lease_ms, now)
        key = (tenant, fan_out.group)
        entry = self.fan_outs.get(key)
        if entry is None or entry[2] <= now:
            arrival_ms = min(self.arrival_ms, lease_ms)
            verdict = self._admit(tenant, limits, fan_out.leases(), arrival_ms, now)
            entry = self.fan_outs[key] = (verdict, set(), now + lease_ms)
        verdict, taken, _ = entry
        if verdict:
            return verdict
        if fan_out.index in taken:
            return CHOICE_TAKEN
        taken.add(fan_out.index)
        if limits.max_concurrent:  # its call is here: its lease lasts the deadline
            self.leases.setdefault(tenant, {})[lease_id] = now + lease_ms
        return ""

    def _admit(
        self, tenant: str, limits: Limits, lease_ids: list[str], lease_ms: float, now: float
    ) -> str:
        """Admit len(lease_ids) requests at once, or none."""
        weight = len(lease_ids)
        if limits.tpm and self.tats.get((tenant, "tpm"), now) - now > PERIOD_MS:
            return "tokens_per_minute"
        if limits.rpm:
            tat = max(self.tats.get((tenant, "rpm"), now), now) + weight * PERIOD_MS / limits.rpm
            if tat - now > PERIOD_MS:
                return "requests_per_minute"
        if limits.max_concurrent:
            leases = {k: v for k, v in self.leases.get(tenant, {}).items() if v > now}
            if len(leases) + weight > limits.max_concurrent:
                return "max_concurrent"
            leases.update({lease_id: now + lease_ms for lease_id in lease_ids})
            self.leases[tenant] = leases
        if limits.rpm:
            self.tats[(tenant, "rpm")] = tat
        return ""

    async def finish(self, tenant: str, limits: Limits, lease_id: str, tokens: int) -> None:
        """Release the lease; charge the request's tokens."""
        self.leases.get(tenant, {}).pop(lease_id, None)
        if limits.tpm and tokens > 0:
            now = self.clock() * 1000.0
            tat = max(self.tats.get((tenant, "tpm"), now), now)
            self.tats[(tenant, "tpm")] = tat + tokens * PERIOD_MS / limits.tpm

    def _prune(self, now: float) -> None:
        """Forget full buckets and empty lease sets (what Redis's expiry does), so
        tenants that come and go do not grow the dicts."""
        if len(self.tats) + len(self.leases) + len(self.fan_outs) < 4096:
            return
        self.tats = {k: v for k, v in self.tats.items() if v > now}
        self.fan_outs = {k: v for k, v in self.fan_outs.items() if v[2] > now}
        self.leases = {
            k: v for k, v in self.leases.items() if any(expiry > now for expiry in v.values())
        }


# -- in Redis -------------------------------------------------------------------------------
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local period = 60000
"""
# KEYS: requests TAT, tokens TAT, leases, and for a fan-out's call its group's key.
# ARGV: rpm, tpm, max_concurrent, lease ms, the fan-out's arrival ms, the call's index in
# its fan-out ('' for none), then the lease ids the admission takes: the request's one, or
# the fan-out's n (each for the arrival ms, until its own call takes it).
# A group's key holds its verdict: the limit that refused it, or one character per choice
# ('-' its lease not taken yet, '+' taken); GET and SET only, so the documented ACL serves.
ADMIT = (
    _NOW
    + """
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms, n = tonumber(ARGV[4]), #ARGV - 6
local first_ms = lease_ms
if #KEYS > 3 then first_ms = math.min(lease_ms, tonumber(ARGV[5])) end
local function admit()
  if tpm > 0 and (tonumber(redis.call('GET', KEYS[2])) or now) - now > period then
    return 'tokens_per_minute'
  end
  local tat = 0
  if rpm > 0 then
    tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now) + n * period / rpm
    if tat - now > period then return 'requests_per_minute' end
  end
  if maxc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    if redis.call('ZCARD', KEYS[3]) + n > maxc then return 'max_concurrent' end
    for i = 7, #ARGV do redis.call('ZADD', KEYS[3], now + first_ms, ARGV[i]) end
    redis.call('PEXPIRE', KEYS[3], lease_ms)
  end
  if rpm > 0 then
    redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil(tat - now) + 1)
  end
  return ''
end
if #KEYS < 4 then return admit() end
local verdict = redis.call('GET', KEYS[4])
if not verdict then
  verdict = admit()
  if verdict == '' then verdict = string.rep('-', n) end
  redis.call('SET', KEYS[4], verdict, 'PX', lease_ms)
end
local first = string.sub(verdict, 1, 1)
if first ~= '-' and first ~= '+' then return verdict end
local at = tonumber(ARGV[6]) + 1
if string.sub(verdict, at, at) ~= '-' then return '"""
    + CHOICE_TAKEN
    + """' end
redis.call('SET', KEYS[4], string.sub(verdict, 1, at - 1) .. '+' .. string.sub(verdict, at + 1),
           'KEEPTTL')
if maxc > 0 then
  redis.call('ZADD', KEYS[3], now + lease_ms, ARGV[6 + at])
  redis.call('PEXPIRE', KEYS[3], lease_ms)
end
return ''
"""
)
# KEYS: tokens TAT, leases. ARGV: tpm, tokens, lease id.
FINISH = (
    _NOW
    + """
redis.call('ZREM', KEYS[2], ARGV[3])
local tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and tokens > 0 then
  local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
              + tokens * period / tpm
  redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil(tat - now) + 1)
end
return ''
"""
)


# One script call waiting in a loop turn's batch: the script, its keys, its arguments,
# and the future its caller awaits the reply on.
_Call = tuple[str, tuple[str, ...], tuple[Any, ...], "asyncio.Future[Any]"]


class RedisStore:
    """The same counters in Redis, shared by every router of the deployment."""

    remote: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        password: str | None,
        namespace: str,
        username: str | None = None,
        timeout_s: float = TIMEOUT_S,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        arrival_ms: float = CHOICE_ARRIVAL_MS,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.connection_class = (
            aioredis.SSLConnection if parsed.scheme == "rediss" else aioredis.Connection
        )
        self.options: dict[str, Any] = {
            "host": parsed.hostname,
            "port": parsed.port or 6379,
            "db": int(parsed.path.strip("/") or 0),
            "username": username,
            "password": password,
            "socket_connect_timeout": timeout_s,
            # No timeout of redis-py's own: its socket_timeout (5 s by default) wraps each
            # send in asyncio.wait_for, a task of its own, so a call left a loop turn
            # later, after the work meant to overlap it. The budget bounds each batch.
            "socket_timeout": None,
            # One immediate retry on a fresh connection: a connection that a restarted
            # Redis closed fails once, and that is not Redis being down.
            "retry": Retry(NoBackoff(), 1),
        }
        self.namespace = namespace
        self.timeout_s, self.retry_s, self.clock = timeout_s, retry_s, clock
        self.arrival_ms = arrival_ms
        self.connection: aioredis.Connection | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.batch: list[_Call] = []  # (script, keys, args, future) waiting to be sent
        self.sender: asyncio.Task[None] | None = None  # sending batches, until none wait
        self.failing, self.probing = False, False
        self.retry_at, self.last_error = 0.0, ""

    def base(self, tenant: str) -> str:
        # The braces make a Redis Cluster hash tag: a tenant's keys share one slot. (%
        # keeps triple braces out of the source: render's leftover-placeholder check.)
        return "trident:%s:{%s}" % (self.namespace, tenant)  # noqa: UP031

    def keys(self, tenant: str) -> tuple[str, str, str]:
        base = self.base(tenant)
        return f"{base}:rpm", f"{base}:tpm", f"{base}:leases"

    def admit(
        self,
        tenant: str,
        limits: Limits,
        lease_id: str,
        lease_ms: float,
        fan_out: FanOut | None = None,
    ) -> Awaitable[str]:
        """The call is queued now (call); await the verdict."""
        keys: tuple[str, ...] = self.keys(tenant)
        index, lease_ids = "", [lease_id]
        if fan_out is not None:
            keys = (*keys, f"{self.base(tenant)}:fan:{fan_out.group}")
            index, lease_ids = str(fan_out.index), fan_out.leases()
        reply = self.call(
            ADMIT,
            keys,
            (
                limits.rpm,
                limits.tpm,
                limits.max_concurrent,
                int(lease_ms),
                int(self.arrival_ms),
                index,
                *lease_ids,
            ),
        )
        return _verdict(reply)

    async def finish(self, tenant: str, limits: Limits, lease_id: str, tokens: int) -> None:
        _, tpm, leases = self.keys(tenant)
        await self.call(FINISH, (tpm, leases), (limits.tpm, int(tokens), lease_id))

    def call(self, script: str, keys: tuple[str, ...], args: tuple[Any, ...]) -> Awaitable[Any]:
        """Queue a script now (it leaves in the next loop turn); await its reply, within
        the time budget from when the awaiting starts. Raises StoreUnavailable when
        awaited. The awaitable must be awaited: a probe's flag is cleared then."""
        if self.failing:
            if self.clock() < self.retry_at or self.probing:
                return self._unavailable()
            self.probing = True
            return self._reply(self._queue(script, keys, args), probe=True)
        return self._reply(self._queue(script, keys, args), probe=False)

    async def _unavailable(self) -> Any:
        raise StoreUnavailable(f"Redis unavailable ({self.last_error})")

    async def _reply(self, queued: asyncio.Future[Any], probe: bool) -> Any:
        try:
            # asyncio.timeout, not wait_for: no waiter future and no extra loop turns.
            async with asyncio.timeout(self.timeout_s):
                reply = await queued
        except TimeoutError:
            self._failed(f"no answer within {self.timeout_s * 1000:.0f} ms")
        except (RedisError, OSError) as e:
            # redis-py's messages name the host and the error, never the password.
            self._failed(f"{type(e).__name__}: {e}")
        else:
            self.failing = False
            return reply
        finally:
            if probe:
                self.probing = False
        raise StoreUnavailable(f"Redis unavailable ({self.last_error})")

    def _queue(
        self, script: str, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> asyncio.Future[Any]:
        """A future for the script's reply. The sender's first step runs in the loop
        turn after this call's: the calls made in this turn go with it, and those made
        while a batch is on its way go together in the next."""
        loop = asyncio.get_running_loop()
        if self.connection is None or self.loop is not loop:
            # redis-py's connections belong to the loop that opened them: the stub has
            # one loop, tests run several in turn.
            self.connection, self.loop = self.connection_class(**self.options), loop
            self.batch, self.sender = [], None
        future: asyncio.Future[Any] = loop.create_future()
        self.batch.append((script, keys, args, future))
        if self.sender is None:
            self.sender = loop.create_task(self._send_batches(self.connection))
        return future

    async def _send_batches(self, connection: aioredis.Connection) -> None:
        try:
            while self.batch and self.connection is connection:
                # A call whose caller gave up (its budget) is not sent.
                batch = [call for call in self.batch if not call[3].done()]
                self.batch = []
                if batch:
                    await self._send(connection, batch)
        finally:
            if self.connection is connection:
                self.sender = None

    async def _send(self, connection: aioredis.Connection, batch: list[_Call]) -> None:
        """Send one batch as one round trip on the store's one connection; each caller
        gets its own reply or error. Bounded by the budget too: a stalled Redis must not
        hold the connection."""
        try:
            async with asyncio.timeout(self.timeout_s):
                # redis-py closes the connection on any error or cancel mid-command;
                # the retry sends on a fresh one.
                replies = await connection.retry.call_with_retry(
                    lambda: self._execute(connection, batch),
                    lambda _error: connection.disconnect(),
                )
        except (Exception, asyncio.CancelledError) as e:
            error = (
                e
                if isinstance(e, (RedisError, OSError))
                else ConnectionError(f"batch {type(e).__name__}")
            )
            for *_, future in batch:
                if not future.done():
                    future.set_exception(error)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller gave up
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _execute(self, connection: aioredis.Connection, batch: list[_Call]) -> list[Any]:
        replies = await _round_trip(
            connection,
            [("EVALSHA", SHAS[script], len(keys), *keys, *args) for script, keys, args, _ in batch],
        )
        # NOSCRIPT: a Redis that restarted (or another one) has not seen the script;
        # EVAL runs it and caches it for the next EVALSHA.
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            calls = (batch[i] for i in missing)
            commands = [
                ("EVAL", script, len(keys), *keys, *args) for script, keys, args, _ in calls
            ]
            for i, reply in zip(missing, await _round_trip(connection, commands), strict=True):
                replies[i] = reply
        return replies

    def _failed(self, why: str) -> None:
        self.failing, self.last_error = True, why
        self.retry_at = self.clock() + self.retry_s


SHAS = {script: hashlib.sha1(script.encode()).hexdigest() for script in (ADMIT, FINISH)}


async def _verdict(reply: Awaitable[Any]) -> str:
    """ADMIT's reply as admit's verdict: '' or the limit that refused."""
    value = await reply
    return value.decode() if isinstance(value, bytes) else ""


async def _round_trip(
    connection: aioredis.Connection, commands: list[tuple[Any, ...]]
) -> list[Any]:
    """Send the commands at once, then read their replies in order; a reply that is
    Redis's error comes back as the exception (as a pipeline's would)."""
    await connection.send_packed_command(connection.pack_commands(commands), check_health=False)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response())
        except ResponseError as e:
            replies.append(e)
    return replies
