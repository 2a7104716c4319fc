"""trident's router: a decoupled BLS model in front of the engine models.

Per request: extract routing features once, ask the policy for candidates, call the first
healthy one with a BLS call on a relay thread, and relay its stream. A backend that fails
before its first token (error, unhealthy stub, not loaded, first-token timeout, a health
probe answered with an error) is recorded in its circuit breaker and the next candidate
is tried; after the first token an error reaches the client as an error response and the
final flag. A client's mistake (`invalid request: ...`) is never the backend's failure.

Hot path: one worker thread per attempt (`Relay.run`) makes the BLS call, which returns
with the backend's first response in hand, sends it at once, then sends each later chunk
as it arrives from the (blocking) BLS iterator: no event-loop hop anywhere between the
backend and the client. The event loop decides and supervises: routing, tenants,
fallback after a failed first response, client cancel, first-token timeout, deadline,
and a backend that went silent (its stub died: a BLS iterator then never ends, so the
router probes the backend and gives up on it if the probe fails; a probe that is merely
slow means busy, not dead).

A non-streaming request (stream false or absent) is answered with exactly one response
carrying the final flag, as the backend sent it: Triton's HTTP generate endpoint accepts
nothing else.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import faulthandler
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import triton_python_backend_utils as pb_utils

from bls.adapters import Adapters, Unsupported
from bls.backend_request import BackendRequests
from bls.breaker import HALF_OPEN
from bls.control import SILENCE_PROBE_S, Controls
from bls.inflight import Inflight
from bls.job import Attempt, Job, RequestIds
from bls.policy import Policy, UnknownRoute
from bls.read_request import read_request
from bls.relay import REFUSED, CallSlots, Relay, Retired
from bls.replicas import Replicas, tenant_salt
from bls.router_config import FILE_NAME as ROUTER_CONFIG
from bls.router_config import load as load_router_config
from bls.router_metrics import RouterMetrics
from bls.targets import Claim, Targets
from bls.tenants import Admission, Tenants
from trident_common import tracing, trust
from trident_common.drain import DrainWatch
from trident_common.error_classes import (
    CLIENT,
    DRAINING,
    OVERLOADED,
    SHUTDOWN,
    UNAVAILABLE,
    triton_error,
)
from trident_common.interface import (
    BLS_CALL_SLOTS,
    DRAIN_DIR_ENV,
    ROUTER_SECRET_ENV,
)
from trident_common.log import Log
from trident_common.request import BadRequest

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from bls.policy import RequestFeatures

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# How often the loop checks a stream for a client cancel, its deadline and silence: the
# first check after FIRST_TOKEN_WATCH_S, then twice as long each time up to
# STREAM_WATCH_S. Each check asks Triton (an IPC round trip): dozens of queued streams
# polled every 20 ms cost more CPU than the relay itself.
FIRST_TOKEN_WATCH_S = 0.02
STREAM_WATCH_S = 0.2
CONTROL_THREADS = 64  # BLS calls beyond the streams: aborts, probes, drains
# The routing record of the request this task handles (tracing.RouteRecord), only when
# Triton traces it: each request is its own task (execute makes a task per batch; a
# batch of several is gathered), so it is that request's; None, the default, costs an
# untraced request one lookup per attempt.
ROUTE_RECORD: contextvars.ContextVar[tracing.RouteRecord | None] = contextvars.ContextVar(
    "route_record", default=None
)


class BackendFailed(Exception):
    """The backend failed before its first token; the router may try another."""


class DoesNotFit(BackendFailed):
    """The request asks what this backend's engine cannot do (a TRT-LLM ensemble and
    logprobs, say): another candidate may take it, but the backend is healthy, so its
    breaker is not told; a client's requests must not open it for everyone."""


class ClientCancelled(Exception):
    """The client cancelled; the backend was told to abort."""


class Late(enum.Enum):
    """watch's answer when its deadline passed: a kind of outcome, not words that could
    equal a backend's problem (the caller says what the deadline was)."""

    DEADLINE = "deadline"


class TritonPythonModel:
    # None until the first batch binds them to the router's loop; every request runs on
    # that loop, after it (typed as bound, hence initialize's ignore).
    loop: asyncio.AbstractEventLoop
    bls_slots: CallSlots
    control_pool: ThreadPoolExecutor | None

    def initialize(self, args: dict[str, Any]) -> None:
        # A crashed stub leaves nothing in the log and its model still READY: on a fatal
        # signal, print every thread's Python stack to stderr (the server's log).
        faulthandler.enable(all_threads=True)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        # Checked whole here (RouterConfigError: one line naming the field, load fails).
        self.config = load_router_config(os.path.join(version_dir, ROUTER_CONFIG))
        self.name = self.config.name
        self.log = Log(self.name)
        self._read_secret()
        self.policy = Policy(self.config)
        self.adapters = Adapters.from_config(self.config.backends)
        # Gauges carry the instance's name (router_0_1): each instance sets its own.
        self.metrics = RouterMetrics(self.name, args.get("model_instance_name"))
        # The router's own span per traced request (tracing.RouteRecord), exported like
        # the engine models' when tritonserver's environment names an endpoint, its lost
        # spans counted as they are lost; None: traces off, and a request pays one
        # `is None` for it.
        self.traces = tracing.EngineTraces.from_env(
            os.environ, self.name, on_loss=self.metrics.trace_losses
        )
        # A backend rendered as replicas is called through them, never by its own name:
        # breakers, in-flight counts and limits (one engine's) are per replica.
        self.replicas = Replicas(self.config, self.metrics)
        self.metrics.replicas_loaded(self.replicas.of, time.time())
        self.targets = self._targets(args.get("model_instance_name"))
        self.breakers, self.inflight = self.targets.breakers, self.targets.inflight
        self.deadline_s = self.config.deadline_s
        self.first_token_timeout_s = self.config.first_token_timeout_s
        streams = sum(self.targets.max_inflight.values())
        # One thread per attempt (a relay waits in its BLS call, then pumps its stream),
        # plus drains of abandoned attempts and control requests.
        self.pool = ThreadPoolExecutor(
            max_workers=2 * streams + CONTROL_THREADS, thread_name_prefix="relay"
        )
        # Control requests use async_exec, which runs each call in the loop's default
        # executor until its first response: asyncio's default (CPUs + 4 threads) would
        # queue an abort behind probes of a busy engine.
        self.control_pool = None
        self.loop = self.bls_slots = None  # type: ignore[assignment]
        self.serving_loop: asyncio.AbstractEventLoop | None = None  # execute starts it
        self.batches: set[asyncio.Task[None]] = set()
        self.retired = Retired()
        self.request_ids = RequestIds(self.name, self.proof_key)
        self.request_ids.restock()
        self.controls = Controls(
            self.adapters, self.metrics, self.pool, self.retired, self.proof_key
        )
        self.tenants = Tenants(
            self.config.tenants, self.metrics, self.deadline_s, warn=self.log.warning
        )
        self.backend_requests = BackendRequests(
            self.adapters, self.tenants, self.proof_key, self.traces is not None
        )
        # Requests between arrival and their end: a draining server waits for none left.
        self.handling = 0
        self.drain = DrainWatch(
            os.environ.get(DRAIN_DIR_ENV),
            args.get("model_instance_name") or self.name,
            lambda: self.handling,
        )

    def _targets(self, instance: str | None) -> Targets:
        """The backends' breakers and in-flight limits, the counts shared by this router's
        instances (bls/inflight.py)."""
        drain_dir = os.environ.get(DRAIN_DIR_ENV)
        return Targets(
            self.config,
            self.replicas,
            self.adapters,
            self.metrics,
            self.log,
            lambda names: Inflight.shared(
                names, self.config.instances, instance, drain_dir, self.name
            ),
        )

    def _read_secret(self) -> None:
        """The key the router proves its requests to the engine models with (trust.py),
        and the one tenants are hashed with in traces; SecretError: one line, load fails."""
        self.proof_key = trust.proof_key(os.environ)
        secret = trust.read_secret(os.environ)
        self.tenant_key = None if secret is None else trust.derive(secret, tracing.TENANT_HASH)
        if self.proof_key is None and self.config.tenants:
            raise RuntimeError(
                f"tenants need {ROUTER_SECRET_ENV} in tritonserver's "
                "environment (`trident serve` sets one per start): set it "
                "to a long random value"
            )
        if self.proof_key is None:
            self.log.warning(
                f"no {ROUTER_SECRET_ENV}: the engine models will refuse this "
                "router's aborts (a cancelled request runs to its end there)"
            )

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        """On the stub's main thread: hand the batch to the router's event loop and
        return (a decoupled model answers through its response senders).

        Why not `async def execute`: python_backend would run it on a loop of its own
        through `run_coroutine_threadsafe`, a concurrent future and a done callback per
        call (0.045 ms more TTFT than one `call_soon_threadsafe`, 6 of 6 router_ab runs),
        and it stops that loop before `finalize`, which then could not flush the tenant
        writes (docs/results/2026-12-06-0430-own-loop.md). The loop is the router's,
        started on the first call, one thread: the only one that touches its state."""
        if self.serving_loop is None:
            self.serving_loop = asyncio.new_event_loop()
            threading.Thread(
                target=self.serving_loop.run_forever, name="router-loop", daemon=True
            ).start()
        self.serving_loop.call_soon_threadsafe(self._start_batch, requests)

    def _start_batch(self, requests: list[pb_utils.InferenceRequest]) -> None:
        task = asyncio.get_running_loop().create_task(self.handle_batch(requests))
        self.batches.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(self.batches.discard)

    async def handle_batch(self, requests: list[pb_utils.InferenceRequest]) -> None:
        """Every request of a batch, on the running loop (the router's own, or a test's)."""
        # Breakers, counters and control requests are only touched on this loop.
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # the router's one loop (tests run several in turn)
            self.loop = loop
            self.bls_slots = CallSlots(BLS_CALL_SLOTS, self.pool, loop)
            self.controls.bind(loop)
            self.control_pool = ThreadPoolExecutor(
                max_workers=CONTROL_THREADS, thread_name_prefix="control"
            )
            loop.set_default_executor(self.control_pool)
        if len(requests) == 1:  # the usual batch: no task and gathering future to make
            await self.handle(requests[0])
        else:
            await asyncio.gather(*(self.handle(request) for request in requests))
        return None

    def finalize(self) -> None:
        self.drain.close()
        if self.traces is not None:
            self.traces.close()
        # Queued lease releases and token charges would die with this process.
        self.tenants.close(self.loop)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.control_pool is not None:
            self.control_pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.finalize()
        if self.serving_loop is not None:  # (not closed: a late relay thread may call it)
            self.serving_loop.call_soon_threadsafe(self.serving_loop.stop)

    # -- one request ----------------------------------------------------------------------
    async def handle(self, request: pb_utils.InferenceRequest) -> None:
        arrival = time.monotonic()
        self.retired.prune()
        sender = request.get_response_sender()
        if self.drain.draining:
            # Admitted requests keep their fallbacks; a new one starts nothing. (At the
            # cutoff the engine models end what still runs, with SHUTDOWN's marker.)
            return self.fail(sender, self.refusal(), "draining")
        attempts: list[Relay] = []
        record = None
        if self.traces is not None:
            context = request.trace().get_context()  # None: untraced
            if context:
                record = self.traces.route(context)
                ROUTE_RECORD.set(record)
        self.handling += 1
        try:
            await self.route(request, sender, arrival, attempts)
        except ClientCancelled:
            pass  # the backend was told to abort, the client's stream is closed
        except Exception as e:  # a router defect must never leave the client hanging
            self.log.error(f"router error: {type(e).__name__}: {e}")
            talking = [relay for relay in attempts if relay.streaming or relay.answered]
            if talking:  # close() does nothing if the final flag already went out
                talking[-1].close(f"router error: {e}")
            else:
                self.fail(sender, f"router error: {e}", "internal")
        finally:
            self.handling -= 1
            if record is not None:
                record.end()
            self.request_ids.restock()  # for the next requests, off their path

    def refusal(self) -> str:
        """Why a draining server's router takes no new request (error_classes.py)."""
        if self.drain.cut:
            return SHUTDOWN.mark(f"{self.name}: the server is stopping")
        return DRAINING.mark(
            f"{self.name}: the server is draining and takes no new requests; retry on another"
        )

    async def route(
        self,
        request: pb_utils.InferenceRequest,
        sender: pb_utils.ResponseSender,
        arrival: float,
        attempts: list[Relay],
    ) -> None:
        record = ROUTE_RECORD.get()
        try:
            inbound = read_request(request, self.tenants.set_tier)
            if record is not None:  # the caller's trace, before the backend is called
                assert self.traces is not None  # a record is made only with traces on
                self.traces.follow_caller(record, inbound.traceparent)
            route, candidates = self.policy.candidates(inbound.features, self.targets.available)
            job = Job(request, sender, arrival, inbound, route, attempts)
        except UnknownRoute as e:
            return self.fail(sender, CLIENT.mark(str(e), e.param), "unknown_route")
        except BadRequest as e:  # the messages or a fan-out parameter not as the interface says
            return self.fail(sender, CLIENT.mark(str(e), e.param or "messages"), "bad_request")
        # Any other error is the router's (handle: "router error", internal), never a 400.
        if record is not None:
            record.route, record.candidates = route, tuple(candidates)
            tenant = inbound.features.tenant
            if tenant is not None and self.tenant_key is not None:
                record.tenant = tracing.tenant_hash(self.tenant_key, str(tenant))
        if not candidates and (inbound.fan_out is None or not self.tenants.enabled):
            return self.refuse(sender, route, inbound.features)  # not charged

        def work(admission: Admission | None) -> Coroutine[Any, Any, None]:
            job.admission = admission
            if candidates:
                return self.attempt(job, candidates)
            # One choice of a fan-out: the group's first call may have reserved this
            # choice's lease already. Refused once admitted, it gives the lease back
            # now rather than hold it until it expires (deadline_s + 5 s); the group's
            # charge of n requests stands, as the choices that run were admitted by it.
            return self.refuse_admitted(job)

        await self.tenants.run(
            inbound.features.tenant, work, attempts, sender, self.fail, inbound.fan_out
        )

    async def attempt(self, job: Job, candidates: list[str]) -> None:
        """Try the candidates in turn until one answers (serve); fail the request in
        words when none could."""
        errors: list[str]
        errors, tried, misfits = [], False, 0
        record = ROUTE_RECORD.get()
        if record is not None:
            if self.tenants.enabled and job.admission is None:  # admitted before it ran
                record.admission = "admitted"
            record.failures = errors  # each candidate that failed or was unavailable, why
        if any(name in self.replicas.of for name in candidates):
            candidates = self.expand(job, candidates)
            if record is not None:
                record.candidates = tuple(candidates)  # the replicas, in the chooser's order
        for attempt, backend in enumerate(candidates):
            claim = self.targets.claim(backend)
            if claim is None:
                errors.append(self.targets.unavailable_reason(backend))
                continue
            tried = True
            probe = self.breakers[backend].state == HALF_OPEN  # this request is the probe
            if record is not None:
                record.backend, record.breaker = backend, self.breakers[backend].state
            recorded = False
            try:
                recorded = await self.serve(job, claim)
                return
            except BackendFailed as e:
                if isinstance(e, DoesNotFit):
                    misfits += 1
                else:
                    self.targets.record(backend, ok=False)
                    recorded = True
                errors.append(f"{backend}: {e}")
                if attempt + 1 < len(candidates):
                    self.log.warning(f"{backend} failed before its first token, falling back: {e}")
                    self.metrics.fallback(backend)
            finally:
                claim.release()  # (at the stream's end already, if it started)
                if probe and not recorded:
                    self.breakers[backend].release_probe()
        self.none_answered(job, errors, tried, misfits)

    def expand(self, job: Job, candidates: list[str]) -> list[str]:
        """Replicated backends: their replicas, in the chooser's order (chosen once the
        tenant is admitted: a refused request leaves no record). The prompt's key is made
        here, for a route with replicas only: other routes never pay for it."""
        inbound = job.inbound
        candidates, job.choices = self.replicas.expand(
            job.route,
            candidates,
            inbound.features,
            self.replicas.prompt(*inbound.prompt),
            tenant_salt(self.tenants, inbound.features.tenant),
            lambda name: self.breakers[name].available(),
            self.inflight,
        )
        return candidates

    def none_answered(self, job: Job, errors: list[str], tried: bool, misfits: int) -> None:
        """Every candidate was unavailable, or failed before its first token, or cannot
        take the request: say which, and why each."""
        route = job.route
        if not tried:  # each was taken (full, breaker) while this request waited
            return self.fail(
                job.sender,
                UNAVAILABLE.mark(f"no backend available for route {route!r}: " + "; ".join(errors)),
                "no_backend",
            )
        if misfits == len(errors):  # no candidate's engine can do what was asked
            return self.fail(
                job.sender,
                CLIENT.mark(
                    f"no backend of route {route!r} takes this request: " + "; ".join(errors)
                ),
                "bad_request",
            )
        self.fail(
            job.sender,
            "every backend failed before its first token: " + "; ".join(errors),
            "all_failed",
        )

    async def refuse_admitted(self, job: Job) -> None:
        if job.admission is not None:
            await job.admission.wait()  # (a refusal raised here is Tenants.run's to answer)
        self.refuse(job.sender, job.route, job.inbound.features)

    def refuse(
        self, sender: pb_utils.ResponseSender, route: str, features: RequestFeatures
    ) -> None:
        """No candidate can take the request: overloaded (all full) or unavailable."""
        _, wanted = self.policy.candidates(features)
        reasons = "; ".join(self.targets.unavailable_reason(b) for b in wanted)
        if wanted and all(self.targets.full(b) for b in wanted):
            return self.fail(
                sender,
                OVERLOADED.mark(
                    f"every backend of route {route!r} is at its limit, retry later ({reasons})"
                ),
                "overloaded",
            )
        return self.fail(
            sender,
            UNAVAILABLE.mark(f"no backend available for route {route!r}: {reasons}"),
            "no_backend",
        )

    def fail(self, sender: pb_utils.ResponseSender, message: str, reason: str) -> None:
        """Answer with an error response, then the final flag on its own: the same shape
        as a mid-stream failure (a gRPC stream client sees the error, then the final).
        The message's marker (error_classes.py) is its class and sets the Triton code;
        an unmarked one is internal."""
        self.metrics.error(reason)
        record = ROUTE_RECORD.get()
        if record is not None:
            record.outcome = reason
            if reason == "tenant":
                record.admission = "refused"
        error = triton_error(pb_utils, message)
        if reason in ("all_failed", "internal"):  # not the client's doing
            self.log.error(message)
        try:
            sender.send(pb_utils.InferenceResponse(error=error))
            sender.send(flags=FINAL)
        except Exception:
            pass  # the client is gone

    async def serve(self, job: Job, claim: Claim) -> bool:
        """One attempt on the backend `claim` holds a slot of. Raises BackendFailed if
        nothing reached the client; returns whether the backend's outcome was recorded in
        its breaker."""
        inbound, sender, arrival = job.inbound, job.sender, job.arrival
        backend = claim.name
        request_id = self.request_ids.new()
        try:
            child = self.backend_requests.make(job, backend, request_id, ROUTE_RECORD.get())
        except BadRequest as e:  # a value no engine could take (out of range)
            self.fail(sender, e.marked(), "bad_request")
            return False
        except Unsupported as e:  # the request does not fit this engine's interface
            raise DoesNotFit(str(e)) from None
        if job.admission is not None:  # no backend before the tenant is in (Tenants.run)
            await job.admission.wait()
            record = ROUTE_RECORD.get()
            if record is not None:
                record.admission = "admitted"
        relay = Relay(
            sender, self.adapters[backend], backend, self.loop, not inbound.stream, self.retired
        )
        relay.tally = self.tenants.tally(inbound)
        relay.on_end = claim.release
        job.attempts.append(relay)
        attempt = Attempt(backend, request_id.text, relay)
        routed_s = time.monotonic() - arrival
        self.bls_slots.start(relay, child)
        if inbound.stream:
            first_by = min(time.monotonic() + self.first_token_timeout_s, arrival + self.deadline_s)
            late = f"no first token within {self.first_token_timeout_s} s"
        else:
            # A whole answer is the engine's one response, sent when its generation ends:
            # a first-token timer would time the generation. The deadline bounds it (and a
            # silent engine fails the health probe meanwhile, see watch).
            first_by, late = arrival + self.deadline_s, f"deadline of {self.deadline_s} s exceeded"
        problem = await self.watch(attempt, relay.first, first_by)
        # abandon() fails once the relay sent the first response: the stream is on.
        if problem is not None and relay.abandon():
            if problem is Late.DEADLINE:
                self.controls.abort(backend, request_id.text)
                if not inbound.stream:
                    # The engine may have generated all along: another backend would
                    # start over with no time left. Not the backend's failure either.
                    self.fail(sender, late, "deadline")
                    return False
                raise BackendFailed(late)
            raise BackendFailed(problem)
        outcome = await relay.first
        if outcome == REFUSED:
            refusal = relay.refusal or CLIENT
            self.metrics.error("bad_request" if refusal is CLIENT else refusal.name)
            return False
        if outcome is not None:
            raise BackendFailed(outcome)
        self.targets.record(backend, ok=True)
        if job.choices:
            self.replicas.routed(backend, job.choices)
        self.metrics.request(job.route, backend)
        self.metrics.added_latency(routed_s + relay.first_relay_s)
        return await self.finish(attempt, arrival)

    async def finish(self, attempt: Attempt, arrival: float) -> bool:
        """Supervise a started stream until it ends; returns True (outcome recorded)."""
        relay, backend = attempt.relay, attempt.backend
        problem = await self.watch(attempt, relay.done, arrival + self.deadline_s)
        if problem is Late.DEADLINE:
            relay.close(f"deadline of {self.deadline_s} s exceeded")
            self.controls.abort(backend, attempt.request_id)  # not the backend's failure
        elif problem is not None:
            relay.close(f"{backend} failed mid-stream: {problem}")
            self.targets.record(backend, ok=False)
        elif relay.done.result() is not True:
            self.targets.record(backend, ok=False)
        return True

    async def watch(
        self, attempt: Attempt, until: asyncio.Future[Any], deadline: float
    ) -> Late | str | None:
        """Wait for the future `until`; meanwhile abort on a client cancel (raises
        ClientCancelled), and return Late.DEADLINE at the deadline or the problem (its
        words) of a backend that went silent and fails a health probe. None when `until`
        is done."""
        relay, backend = attempt.relay, attempt.backend
        seen, quiet_since = relay.chunks, time.monotonic()
        interval = FIRST_TOKEN_WATCH_S
        while True:
            done, _ = await asyncio.wait((until,), timeout=interval)
            if done:
                return None
            interval = min(2 * interval, STREAM_WATCH_S)
            if relay.client_cancelled():
                relay.close()
                self.controls.abort(backend, attempt.request_id)
                raise ClientCancelled
            now = time.monotonic()
            if now >= deadline:
                return Late.DEADLINE
            if relay.chunks != seen:
                seen, quiet_since = relay.chunks, now
            elif now - quiet_since >= SILENCE_PROBE_S:
                quiet_since = now
                problem = await self.controls.probe(backend)
                if problem is not None:
                    return problem
