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
The client speaks RESP over asyncio streams (no extra package in the stub's venv):
replies are matched to calls in order (pipelining), every call has a time budget, and a
failure keeps the store "down" for RETRY_S so requests meanwhile decide at once instead
of each waiting out the budget; the next call after that reconnects.
"""
import asyncio
import collections
import hashlib
import time
import urllib.parse

PERIOD_MS = 60_000.0
REASONS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
TIMEOUT_S = 0.05     # no request waits longer than this for Redis
RETRY_S = 0.5        # after a failure, Redis is not asked again for this long


class StoreUnavailable(Exception):
    """Redis is down, slow or refused the call: the caller's policy decides."""


class Limits:
    """One tenant's limits as the stores read them (0: unlimited)."""

    __slots__ = ("rpm", "tpm", "max_concurrent")

    def __init__(self, rpm=None, tpm=None, max_concurrent=None):
        self.rpm, self.tpm, self.max_concurrent = rpm or 0, tpm or 0, max_concurrent or 0


# -- in the router process ------------------------------------------------------------------
class LocalStore:
    """Counters of this router alone (no `redis` in the spec). Same algorithm as the Lua
    below; `clock` in seconds (injected by tests)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.tats = {}      # (tenant, "rpm" | "tpm") → TAT in ms
        self.leases = {}    # tenant → {lease id: expiry in ms}

    async def admit(self, tenant, limits, lease_id, lease_ms):
        """'' when admitted (a lease is taken), else the limit that refused it."""
        now = self.clock() * 1000.0
        self._prune(now)
        if limits.tpm and self.tats.get((tenant, "tpm"), now) - now > PERIOD_MS:
            return "tokens_per_minute"
        if limits.rpm:
            tat = max(self.tats.get((tenant, "rpm"), now), now) + PERIOD_MS / limits.rpm
            if tat - now > PERIOD_MS:
                return "requests_per_minute"
        if limits.max_concurrent:
            leases = {k: v for k, v in self.leases.get(tenant, {}).items() if v > now}
            if len(leases) >= limits.max_concurrent:
                return "max_concurrent"
            leases[lease_id] = now + lease_ms
            self.leases[tenant] = leases
        if limits.rpm:
            self.tats[(tenant, "rpm")] = tat
        return ""

    async def finish(self, tenant, limits, lease_id, tokens):
        """Release the lease; charge the request's tokens."""
        self.leases.get(tenant, {}).pop(lease_id, None)
        if limits.tpm and tokens > 0:
            now = self.clock() * 1000.0
            tat = max(self.tats.get((tenant, "tpm"), now), now)
            self.tats[(tenant, "tpm")] = tat + tokens * PERIOD_MS / limits.tpm

    def _prune(self, now):
        """Forget full buckets and empty lease sets (what Redis's expiry does), so
        tenants that come and go do not grow the dicts."""
        if len(self.tats) + len(self.leases) < 4096:
            return
        self.tats = {k: v for k, v in self.tats.items() if v > now}
        self.leases = {k: v for k, v in self.leases.items()
                       if any(expiry > now for expiry in v.values())}


# -- in Redis -------------------------------------------------------------------------------
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local period = 60000
"""
# KEYS: requests TAT, tokens TAT, leases. ARGV: rpm, tpm, max_concurrent, lease id, lease ms.
ADMIT = _NOW + """
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and (tonumber(redis.call('GET', KEYS[2])) or now) - now > period then
  return 'tokens_per_minute'
end
local tat = 0
if rpm > 0 then
  tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now) + period / rpm
  if tat - now > period then return 'requests_per_minute' end
end
if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= maxc then return 'max_concurrent' end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[4])
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
if rpm > 0 then
  redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil(tat - now) + 1)
end
return ''
"""
# KEYS: tokens TAT, leases. ARGV: tpm, tokens, lease id.
FINISH = _NOW + """
redis.call('ZREM', KEYS[2], ARGV[3])
local tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and tokens > 0 then
  local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
              + tokens * period / tpm
  redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil(tat - now) + 1)
end
return ''
"""


class RedisStore:
    """The same counters in Redis, shared by every router of the deployment."""

    def __init__(self, url, password, namespace, timeout_s=TIMEOUT_S, retry_s=RETRY_S,
                 clock=time.monotonic):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 6379
        self.tls = parsed.scheme == "rediss"
        self.db = int(parsed.path.strip("/") or 0)
        self.password, self.namespace = password, namespace
        self.timeout_s, self.retry_s, self.clock = timeout_s, retry_s, clock
        self.conn = self.connecting = None
        self.retry_at, self.last_error = 0.0, ""
        self.shas = {ADMIT: _sha(ADMIT), FINISH: _sha(FINISH)}

    def keys(self, tenant):
        # The braces make a Redis Cluster hash tag: a tenant's keys share one slot.
        base = "trident:%s:{%s}" % (self.namespace, tenant)
        return f"{base}:rpm", f"{base}:tpm", f"{base}:leases"

    async def admit(self, tenant, limits, lease_id, lease_ms):
        rpm, tpm, leases = self.keys(tenant)
        reply = await self.call(ADMIT, (rpm, tpm, leases), (
            limits.rpm, limits.tpm, limits.max_concurrent, lease_id, int(lease_ms)))
        return reply.decode() if isinstance(reply, bytes) else ""

    async def finish(self, tenant, limits, lease_id, tokens):
        _, tpm, leases = self.keys(tenant)
        await self.call(FINISH, (tpm, leases), (limits.tpm, int(tokens), lease_id))

    async def call(self, script, keys, args):
        """Run a script within the time budget; raises StoreUnavailable."""
        if self.clock() < self.retry_at:
            raise StoreUnavailable(f"Redis unavailable ({self.last_error})")
        try:
            return await asyncio.wait_for(self._script(script, keys, args), self.timeout_s)
        except asyncio.TimeoutError:
            self._down(f"no answer within {self.timeout_s * 1000:.0f} ms")
        except (OSError, EOFError, RespError, asyncio.IncompleteReadError) as e:
            self._down(f"{type(e).__name__}: {e}")
        raise StoreUnavailable(f"Redis unavailable ({self.last_error})")

    async def _script(self, script, keys, args):
        conn = await self._connected()
        sha = self.shas[script]
        reply = await conn.send("EVALSHA", sha, len(keys), *keys, *args)
        if isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT"):
            reply = await conn.send("EVAL", script, len(keys), *keys, *args)
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def _connected(self):
        loop = asyncio.get_running_loop()
        if self.conn is not None and not self.conn.closed and self.conn.loop is loop:
            return self.conn
        if self.connecting is None or self.connecting.get_loop() is not loop:
            self.connecting = loop.create_task(self._connect())
        # Shielded: one caller's timeout must not cancel the connect others wait for.
        return await asyncio.shield(self.connecting)

    async def _connect(self):
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port,
                                                           ssl=self.tls or None)
            conn = _Connection(reader, writer)
            if self.password:
                reply = await conn.send("AUTH", self.password)
                if isinstance(reply, RespError):   # never show the password
                    conn.close()
                    raise RespError(f"AUTH refused: {str(reply).split(' ', 1)[0]}")
            if self.db:
                reply = await conn.send("SELECT", self.db)
                if isinstance(reply, RespError):
                    conn.close()
                    raise reply
            self.conn = conn
            return conn
        finally:
            self.connecting = None

    def _down(self, why):
        self.last_error, self.retry_at = why, self.clock() + self.retry_s
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()


def _sha(script):
    return hashlib.sha1(script.encode()).hexdigest()


# -- RESP over asyncio ----------------------------------------------------------------------
class RespError(Exception):
    """An error reply from Redis (returned by send, raised by callers that care)."""


class _Connection:
    """One pipelined connection: replies come back in the order of the calls."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.pending = collections.deque()
        self.closed = False
        self.reading = self.loop.create_task(self._read_replies())

    def send(self, *args):
        if self.closed:
            raise ConnectionError("connection closed")
        future = self.loop.create_future()
        self.pending.append(future)
        self.writer.write(_encode(args))
        return future

    async def _read_replies(self):
        try:
            while True:
                reply = await _read_reply(self.reader)
                future = self.pending.popleft()
                if not future.done():   # a caller that timed out is gone
                    future.set_result(reply)
        except (Exception, asyncio.CancelledError):
            self.close()

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        if self.reading is not asyncio.current_task():
            self.reading.cancel()
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(ConnectionError("Redis connection lost"))


def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _read_reply(reader):
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        return RespError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else (await reader.readexactly(size + 2))[:-2]
    if kind == b"*":
        size = int(rest)
        return None if size < 0 else [await _read_reply(reader) for _ in range(size)]
    raise RespError(f"unexpected reply {line[:40]!r}")
