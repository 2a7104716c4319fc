"""trident's router: a decoupled BLS model in front of the engine models.

Per request: extract routing features once, ask the policy for candidates, call the first
healthy one with `async_exec(decoupled=True)`, and relay its stream. A backend that fails
before its first token (error, unhealthy stub, not loaded, first-token timeout, no answer
to a health probe) is recorded in its circuit breaker and the next candidate is tried;
after the first token an error reaches the client as an error response and the final flag.

Hot path: BLS resolves `async_exec` with the backend's first response in hand, so the
first response is sent from the event loop at once; the rest of the stream (a blocking
iterator) is pumped by one worker thread per stream (`Relay`), which sends each chunk as
it arrives, with no event-loop hop in between. The event loop supervises: client cancel,
first-token timeout, deadline, and a backend that went silent (its stub died: a BLS
iterator then never ends, so the router probes the backend and gives up on it).
"""
import asyncio
import itertools
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

from adapters import ROUTER_ONLY_INPUTS, Adapters  # siblings in the model's directory
from breaker import HALF_OPEN, STATE_VALUES, BreakerConfig, CircuitBreaker
from policy import Policy, UnknownRoute, features_from
from trident_common.request import CLIENT_FAULT_PREFIX, first_scalar

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# How often the loop checks a stream for a client cancel, its deadline and silence:
# often while waiting for the first token, less once streaming (cheap on the hot path).
FIRST_TOKEN_WATCH_S = 0.02
STREAM_WATCH_S = 0.2
SILENCE_PROBE_S = 2.0     # a stream quiet this long gets its backend health-probed
PROBE_TIMEOUT_S = 5.0     # a backend that cannot answer a no-op request this fast is down
PROBE_REQUEST_ID = "trident-router-health-probe"   # aborting it is a no-op
HINT_NAMES = ("route", "task", "family", "tenant", "tier", "conversation_id",
              "shared_prefix")
CLIENT_ERROR = "client error"   # Relay.first outcome: the backend rejected the request


class BackendFailed(Exception):
    """The backend failed before its first token; the router may try another."""


class ClientCancelled(Exception):
    """The client cancelled; the backend was told to abort."""


class Relay:
    """One attempt's stream, from the backend's response iterator to the client.

    The event loop hands the first response to `start`; a worker thread then runs
    `pump` over the rest and resolves `done` (True, or False after a mid-stream failure).
    Every send to the client holds `lock`, and `closed` is set by whoever sends the
    client's final flag, so it is sent exactly once and nothing follows it. An attempt
    the router abandons before its first token sends nothing at all: the router falls
    back or answers the client itself.
    """

    def __init__(self, sender, adapter, backend, loop):
        self.sender, self.adapter, self.backend, self.loop = sender, adapter, backend, loop
        self.lock = threading.Lock()
        self.streaming = False      # the first response went to the client
        self.closed = False         # final flag sent, or attempt abandoned
        self.answered = False       # this attempt sent the client's final flag
        self.chunks = 0             # backend responses seen: progress, for silence probes
        self.first_relay_s = 0.0    # router time between the first response and its send
        self.done = loop.create_future()

    # -- event loop: the first response -------------------------------------------------
    def start(self, first):
        """Send the first response, or say why not: None, CLIENT_ERROR or the problem
        (then this attempt sends nothing more; the router falls back or answers)."""
        received = time.monotonic()
        if first is None:
            problem, outgoing = "stream ended without a response", None
        else:
            problem, outgoing = self.adapter.split(first)
        with self.lock:
            if self.closed:
                return problem or "abandoned by the router"
            if problem is not None and _client_fault(first):
                # The request is wrong, not the backend: tell the client, retry nowhere.
                self._finish(first.error())
                return CLIENT_ERROR
            if problem is not None:
                self.closed = True
                return problem
            if outgoing is not None:
                self.sender.send(outgoing)
            self.streaming = True
        self.first_relay_s = time.monotonic() - received
        return None

    # -- worker thread: every later response --------------------------------------------
    def pump(self, responses):
        ok = False
        try:
            ok = True
            for response in responses:
                self.chunks += 1
                ok = self._forward(response) and ok
            if ok:
                self.close()
        except Exception as e:  # the router must answer even if its own relay breaks
            ok = False
            self.close(f"router relay failed: {e}")
        finally:
            self.loop.call_soon_threadsafe(_set_once, self.done, ok)

    def _forward(self, response):
        """Relay one chunk; False when it carries a backend error (which ends the stream)."""
        problem, outgoing = self.adapter.split(response)
        with self.lock:
            if self.closed:
                return True             # abandoned or cancelled: drain, forward nothing
            if problem is not None:
                self._finish(f"{self.backend} failed mid-stream: {problem}")
                return False
            if outgoing is not None:
                self.sender.send(outgoing)
        return True

    # -- any thread ---------------------------------------------------------------------
    def close(self, error=None):
        """Finish the client's stream (an error response first if given); False if it
        was already finished."""
        with self.lock:
            if self.closed:
                return False
            self._finish(error)
            return True

    def client_cancelled(self):
        """Has the client cancelled? Asked under the lock and only while the stream is
        open: once the final flag is sent Triton releases the request, and asking then
        crashes the server (TRITONBACKEND_ResponseFactoryIsCancelled)."""
        with self.lock:
            return not self.closed and self.sender.is_cancelled()

    def abandon(self):
        """Give up before the first token without telling the client anything; False if
        the first response already went out (then the stream is the client's)."""
        with self.lock:
            if self.streaming or self.closed:
                return False
            self.closed = True
            return True

    def _finish(self, error):
        self.closed = self.answered = True
        try:
            if error is not None:   # a message, or a backend's TritonError (keeps its code)
                if isinstance(error, str):
                    error = pb_utils.TritonError(error)
                self.sender.send(pb_utils.InferenceResponse(error=error))
            self.sender.send(flags=FINAL)
        except Exception:
            pass  # the client is gone (cancelled): nothing left to tell it


def _set_once(future, value):
    if not future.done():
        future.set_result(value)


def _client_fault(response):
    """A backend's error that blames the request (see CLIENT_FAULT_PREFIX)."""
    return (response.has_error()
            and response.error().message().startswith(CLIENT_FAULT_PREFIX))


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, "router.json")) as f:
            self.config = json.load(f)
        self.name = self.config["name"]
        self.policy = Policy(self.config)
        self.adapters = Adapters.from_config(self.config["backends"])
        breaker_config = BreakerConfig.from_dict(self.config["breaker"])
        self.breakers = {name: CircuitBreaker(breaker_config, time.monotonic)
                         for name in self.config["backends"]}
        self.inflight = {name: 0 for name in self.config["backends"]}
        self.max_inflight = self.config["max_inflight_per_backend"]
        self.deadline_s = self.config["deadline_s"]
        self.first_token_timeout_s = self.config["first_token_timeout_s"]
        # One relay thread per stream, plus short-lived drains of control requests.
        self.pool = ThreadPoolExecutor(
            max_workers=min(2048, 2 * self.max_inflight * len(self.inflight) + 16),
            thread_name_prefix="relay")
        self.ids = itertools.count()
        self.prefix = f"{self.name}-{os.getpid()}-"
        self.background = set()     # control-request tasks (kept referenced until done)
        self.metrics = RouterMetrics(self.name)
        for name, breaker in self.breakers.items():
            self.metrics.breaker_state(name, breaker.state)

    async def execute(self, requests):
        # Breakers, counters and control requests are only touched on this loop.
        self.loop = asyncio.get_running_loop()
        await asyncio.gather(*(self.handle(request) for request in requests))
        return None

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.finalize()

    # -- one request ----------------------------------------------------------------------
    async def handle(self, request):
        arrival = time.monotonic()
        sender = request.get_response_sender()
        attempts = []
        try:
            await self.route(request, sender, arrival, attempts)
        except ClientCancelled:
            pass  # the backend was told to abort, the client's stream is closed
        except Exception as e:  # a router defect must never leave the client hanging
            talking = [relay for relay in attempts if relay.streaming or relay.answered]
            if talking:   # close() does nothing if the final flag already went out
                talking[-1].close(f"router error: {e}")
            else:
                self.fail(sender, f"router error: {e}", "internal")

    async def route(self, request, sender, arrival, attempts):
        try:
            features = self.features(request)
            route, candidates = self.policy.candidates(features, self.available)
        except UnknownRoute as e:
            return self.fail(sender, str(e), "unknown_route")
        except ValueError as e:
            return self.fail(sender, f"bad request: {e}", "bad_request")
        if not candidates:
            _, wanted = self.policy.candidates(features)
            return self.fail(sender, f"no backend available for route {route!r}: "
                             + "; ".join(self.unavailable_reason(b) for b in wanted),
                             "no_backend")
        errors = []
        for attempt, backend in enumerate(candidates):
            if not self.claim(backend):
                errors.append(self.unavailable_reason(backend))
                continue
            probe = self.breakers[backend].state == HALF_OPEN   # this request is the probe
            recorded = False
            try:
                recorded = await self.serve(request, sender, backend, route, arrival,
                                            attempts)
                return
            except BackendFailed as e:
                self.record(backend, ok=False)
                recorded = True
                errors.append(f"{backend}: {e}")
                if attempt + 1 < len(candidates):
                    self.metrics.fallback(backend)
            finally:
                self.inflight[backend] -= 1
                if probe and not recorded:
                    self.breakers[backend].release_probe()
        self.fail(sender, "every backend failed before its first token: " + "; ".join(errors),
                  "all_failed")

    def features(self, request):
        """Routing features, from one pass over the request's inputs."""
        hints = {}
        params = request.parameters()
        if params and params != "{}":
            loaded = json.loads(params)
            hints.update({k: loaded[k] for k in HINT_NAMES if k in loaded})
        values = {t.name(): t for t in request.inputs()
                  if t.name() in HINT_NAMES or t.name() in ("text_input", "messages")}
        for name in HINT_NAMES:
            if name in values:
                hints[name] = first_scalar(values[name].as_numpy())
        text = first_scalar(values["text_input"].as_numpy()) if "text_input" in values else None
        messages_text = (first_scalar(values["messages"].as_numpy()) if "messages" in values
                         else None)
        messages = None
        if messages_text:
            try:
                messages = json.loads(messages_text)
            except ValueError as e:
                raise ValueError(f"messages is not valid JSON: {e}") from None
            if not isinstance(messages, list):
                raise ValueError("messages must be a JSON list of {role, content} objects")
        return features_from(text, messages, hints)

    def available(self, backend):
        return self.breakers[backend].available() and self.inflight[backend] < self.max_inflight

    def unavailable_reason(self, backend):
        if self.inflight[backend] >= self.max_inflight:
            return (f"{backend}: {self.inflight[backend]} requests in flight "
                    f"(max_inflight_per_backend is {self.max_inflight})")
        return f"{backend}: circuit breaker {self.breakers[backend].state}"

    def claim(self, backend):
        if self.inflight[backend] >= self.max_inflight or not self.breakers[backend].allow():
            return False
        self.inflight[backend] += 1
        return True

    def record(self, backend, ok):
        breaker = self.breakers[backend]
        breaker.record_success() if ok else breaker.record_failure()
        self.metrics.breaker_state(backend, breaker.state)

    def fail(self, sender, message, reason):
        """Answer with an error response, then the final flag on its own: the same shape
        as a mid-stream failure (a gRPC stream client sees the error, then the final)."""
        self.metrics.error(reason)
        try:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
            sender.send(flags=FINAL)
        except Exception:
            pass  # the client is gone

    async def serve(self, request, sender, backend, route, arrival, attempts):
        """One attempt. Raises BackendFailed if nothing reached the client; returns
        whether the backend's outcome was recorded in its breaker."""
        adapter = self.adapters[backend]
        request_id = f"{self.prefix}{next(self.ids)}"
        inputs = [t for t in request.inputs() if t.name() not in ROUTER_ONLY_INPUTS]
        try:
            child = pb_utils.InferenceRequest(
                model_name=backend, inputs=adapter.inputs(inputs, request_id),
                requested_output_names=adapter.outputs)
        except ValueError as e:  # the request does not fit this engine's interface
            raise BackendFailed(str(e)) from None
        relay = Relay(sender, adapter, backend, self.loop)
        attempts.append(relay)
        routed_s = time.monotonic() - arrival
        # BLS resolves async_exec once the backend's first response is in, so the wait
        # for it is supervised here and next() below does not block the loop.
        calling = asyncio.ensure_future(child.async_exec(decoupled=True))
        first_by = min(time.monotonic() + self.first_token_timeout_s,
                       arrival + self.deadline_s)
        late = f"no first token within {self.first_token_timeout_s} s"
        try:
            problem = await self.watch(relay, calling, backend, first_by, late,
                                       FIRST_TOKEN_WATCH_S, request_id)
        except ClientCancelled:
            self.discard(calling)
            raise
        if problem is not None:
            relay.abandon()
            if problem == late:
                self.abort(backend, request_id)
            self.discard(calling)
            raise BackendFailed(problem)
        try:
            responses = calling.result()
        except Exception as e:  # not loaded, stub unhealthy, ...
            raise BackendFailed(str(e) or type(e).__name__) from None
        outcome = relay.start(next(responses, None))
        if outcome == CLIENT_ERROR:
            self.metrics.error("bad_request")
            return False
        if outcome is not None:
            raise BackendFailed(outcome)
        self.record(backend, ok=True)
        self.metrics.request(route, backend)
        self.metrics.added_latency(routed_s + relay.first_relay_s)
        self.pool.submit(relay.pump, responses)
        return await self.finish(relay, backend, request_id, arrival)

    async def finish(self, relay, backend, request_id, arrival):
        """Supervise a started stream until it ends; returns True (outcome recorded)."""
        late = f"deadline of {self.deadline_s} s exceeded"
        problem = await self.watch(relay, relay.done, backend, arrival + self.deadline_s,
                                   late, STREAM_WATCH_S, request_id)
        if problem == late:
            relay.close(late)
            self.abort(backend, request_id)   # a deadline is not the backend's failure
        elif problem is not None:
            relay.close(f"{backend} failed mid-stream: {problem}")
            self.record(backend, ok=False)
        elif relay.done.result() is not True:
            self.record(backend, ok=False)
        return True

    async def watch(self, relay, until, backend, deadline, late, interval, request_id):
        """Wait for the future `until`; meanwhile abort on a client cancel (raises
        ClientCancelled), and return `late` at the deadline or the problem of a backend
        that went silent and fails a health probe. None when `until` is done."""
        seen, quiet_since = relay.chunks, time.monotonic()
        while True:
            done, _ = await asyncio.wait((until,), timeout=interval)
            if done:
                return None
            if relay.client_cancelled():
                relay.close()
                self.abort(backend, request_id)
                raise ClientCancelled
            now = time.monotonic()
            if now >= deadline:
                return late
            if relay.chunks != seen:
                seen, quiet_since = relay.chunks, now
            elif now - quiet_since >= SILENCE_PROBE_S:
                quiet_since = now
                problem = await self.probe(backend)
                if problem is not None:
                    return problem

    def discard(self, calling):
        """An attempt given up before its first response: drain its stream off the loop
        once it arrives (the backend was told to abort, or is dead)."""
        def drain(task):
            if not task.cancelled() and task.exception() is None:
                self.pool.submit(_drain, task.result())
        calling.add_done_callback(drain)

    # -- control requests to backends -------------------------------------------------------
    def abort(self, backend, request_id):
        """Tell the backend to abort a request (BLS response iterators cannot cancel)."""
        inputs = self.adapters[backend].abort_inputs(request_id)
        if inputs is None:
            return
        self.metrics.abort(backend)
        task = self.loop.create_task(self.control(backend, inputs))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def probe(self, backend):
        """None if the backend answers a no-op control request, else what went wrong."""
        inputs = self.adapters[backend].abort_inputs(PROBE_REQUEST_ID)
        if inputs is None:
            return None   # no control input (TRT-LLM's ensemble): cannot tell
        try:
            return await asyncio.wait_for(self.control(backend, inputs), PROBE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return f"no answer to a health probe within {PROBE_TIMEOUT_S} s"

    async def control(self, backend, inputs):
        """Send a control request; the first error it gets, or None."""
        control = pb_utils.InferenceRequest(model_name=backend, inputs=inputs,
                                            requested_output_names=[])
        try:
            responses = await control.async_exec(decoupled=True)
            return await self.loop.run_in_executor(self.pool, _first_error, responses)
        except Exception as e:  # stub unhealthy, not loaded
            return str(e) or type(e).__name__


def _drain(responses):
    try:
        for _ in responses:
            pass
    except Exception:
        pass  # the backend is gone: nothing left to drain


def _first_error(responses):
    error = None
    for response in responses:
        if error is None and response.has_error():
            error = response.error().message()
    return error


class RouterMetrics:
    """Requests by route and backend, fallbacks, aborts, errors, breaker states, added
    latency. Label sets are created lazily and kept (the stub needs the references)."""

    def __init__(self, router):
        family = pb_utils.MetricFamily
        self.router = router
        self.families = {
            "requests": family("trident_router_requests_total",
                               "Requests routed, by route and serving backend", family.COUNTER),
            "fallbacks": family("trident_router_fallbacks_total",
                                "Requests moved to the next candidate after this backend "
                                "failed before its first token", family.COUNTER),
            "aborts": family("trident_router_aborts_total",
                             "Aborts sent to a backend (client cancel, timeout, deadline)",
                             family.COUNTER),
            "errors": family("trident_router_errors_total",
                             "Requests the router answered with an error, by reason",
                             family.COUNTER),
            "breaker": family("trident_router_breaker_state",
                              "Circuit breaker per backend: 0 closed, 1 half-open, 2 open",
                              family.GAUGE),
            "latency": family("trident_router_added_latency_seconds",
                              "Router time on the first-token path (before the backend "
                              "call and relaying its first response)", family.HISTOGRAM),
        }
        self.metrics = {}
        self._latency = self._metric("latency", (), buckets=[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1])

    def _metric(self, kind, labels, **kwargs):
        key = (kind, labels)
        metric = self.metrics.get(key)
        if metric is None:
            metric = self.families[kind].Metric(
                labels={"router": self.router, **dict(labels)}, **kwargs)
            self.metrics[key] = metric
        return metric

    def request(self, route, backend):
        self._metric("requests", (("route", route), ("served_by", backend))).increment(1)

    def fallback(self, backend):
        self._metric("fallbacks", (("backend", backend),)).increment(1)

    def abort(self, backend):
        self._metric("aborts", (("backend", backend),)).increment(1)

    def error(self, reason):
        self._metric("errors", (("reason", reason),)).increment(1)

    def breaker_state(self, backend, state):
        self._metric("breaker", (("backend", backend),)).set(STATE_VALUES[state])

    def added_latency(self, seconds):
        self._latency.observe(seconds)

    def finalize(self):
        self._latency = None
        self.metrics.clear()
        self.families.clear()
