"""trident's router: a decoupled BLS model in front of the engine models.

Per request: extract routing features once, ask the policy for candidates, call the first
healthy one with `async_exec(decoupled=True)`, and relay its stream. A backend that fails
before its first token (error, unhealthy stub, not loaded, first-token timeout) is
recorded in its circuit breaker and the next candidate is tried; after the first token
an error reaches the client as an error response and the final flag.

Hot path: the backend's response iterator blocks, so each stream is relayed by one worker
thread (not one event-loop hop per chunk), and chunks of Python-backend engines are
forwarded as they are, without re-encoding.
"""
import asyncio
import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from adapters import ROUTER_ONLY_INPUTS, Adapters  # siblings in the model's directory
from breaker import STATE_VALUES, BreakerConfig, CircuitBreaker
from policy import Policy, UnknownRoute, features_from
from trident_common.request import first_scalar

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_POLL_S = 0.02
HINT_NAMES = ("route", "task", "family", "tenant", "tier", "conversation_id",
              "shared_prefix")


class BackendFailed(Exception):
    """The backend failed before its first token; the router may try another."""


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
        self.pool = ThreadPoolExecutor(max_workers=min(1024, 4 * self.max_inflight),
                                       thread_name_prefix="relay")
        self.ids = itertools.count()
        self.prefix = f"{self.name}-{os.getpid()}-"
        self.metrics = RouterMetrics(self.name, list(self.config["backends"]))
        for name, breaker in self.breakers.items():
            self.metrics.breaker_state(name, breaker.state)

    async def execute(self, requests):
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
        try:
            features = self.features(request)
            route, candidates = self.policy.candidates(features, self.available)
        except UnknownRoute as e:
            return self.fail(sender, str(e), "unknown_route")
        except ValueError as e:
            return self.fail(sender, f"bad request: {e}", "bad_request")
        if not candidates:
            return self.fail(sender, f"no healthy backend for route {route!r} (all "
                             "circuit breakers open or at max_inflight_per_backend)",
                             "no_backend")
        errors = []
        for attempt, backend in enumerate(candidates):
            if not self.claim(backend):
                errors.append(f"{backend}: busy or circuit open")
                continue
            try:
                await self.serve(request, sender, backend, route, arrival)
                return
            except BackendFailed as e:
                self.record(backend, ok=False)
                errors.append(f"{backend}: {e}")
                if attempt + 1 < len(candidates):
                    self.metrics.fallback(backend)
            finally:
                self.inflight[backend] -= 1
        self.fail(sender, "every backend failed before its first token: " + "; ".join(errors),
                  "all_failed")

    def features(self, request):
        hints = {}
        params = request.parameters()
        if params and params != "{}":
            loaded = json.loads(params)
            hints.update({k: loaded[k] for k in HINT_NAMES if k in loaded})
        for name in HINT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                hints[name] = first_scalar(tensor.as_numpy())
        text = _input_text(request, "text_input")
        messages_text = _input_text(request, "messages")
        messages = json.loads(messages_text) if messages_text else None
        if messages is not None and not isinstance(messages, list):
            raise ValueError("messages must be a JSON list")
        return features_from(text, messages, hints)

    def available(self, backend):
        return self.breakers[backend].available() and self.inflight[backend] < self.max_inflight

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
        self.metrics.error(reason)
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                    flags=FINAL)

    async def serve(self, request, sender, backend, route, arrival):
        """Call one backend; raises BackendFailed if nothing was sent to the client."""
        adapter = self.adapters[backend]
        request_id = f"{self.prefix}{next(self.ids)}"
        inputs = [t for t in request.inputs() if t.name() not in ROUTER_ONLY_INPUTS]
        try:
            child = pb_utils.InferenceRequest(
                model_name=backend, inputs=adapter.inputs(inputs, request_id),
                requested_output_names=adapter.outputs)
        except ValueError as e:  # the request does not fit this engine's interface
            raise BackendFailed(str(e)) from None
        issued = time.monotonic()
        try:
            responses = await child.async_exec(decoupled=True)
        except Exception as e:  # not loaded, stub unhealthy, ...
            raise BackendFailed(str(e)) from None
        first = await self.first_response(request, responses, backend, request_id, arrival)
        if _client_fault(first):
            # The request is wrong, not the backend: tell the client, retry nowhere.
            self.metrics.error("bad_request")
            sender.send(pb_utils.InferenceResponse(error=first.error()), flags=FINAL)
            return
        problem = adapter.error_of(first)
        if problem is not None:
            raise BackendFailed(problem)
        self.record(backend, ok=True)
        self.metrics.request(route, backend)
        relayed_at = time.monotonic()
        ok = await asyncio.get_running_loop().run_in_executor(
            self.pool, self.relay, request, sender, responses, first, adapter, backend,
            request_id, arrival, relayed_at - issued)
        if not ok:
            self.record(backend, ok=False)

    async def first_response(self, request, responses, backend, request_id, arrival):
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(self.pool, next, responses, None)
        deadline = arrival + self.first_token_timeout_s
        while True:
            done, _ = await asyncio.wait({pending}, timeout=CANCEL_POLL_S)
            if done:
                first = pending.result()
                if first is None:
                    raise BackendFailed("stream ended without a response")
                return first
            if request.is_cancelled() or time.monotonic() > deadline:
                self.abort(backend, request_id)
                if request.is_cancelled():
                    # Not the backend's fault: stop here without a failure record.
                    raise asyncio.CancelledError
                raise BackendFailed(f"no first token within {self.first_token_timeout_s} s")

    def relay(self, request, sender, responses, first, adapter, backend, request_id,
              arrival, added_latency):
        """Worker thread: forward the stream; returns False on a mid-stream error.

        The backend's final flag ends the iterator (its last response may be empty), so
        the client's final flag is sent as a flags-only response after the loop."""
        send = sender.send
        send(adapter.response(first))
        self.metrics.added_latency(added_latency)
        next_check = time.monotonic() + CANCEL_POLL_S
        deadline = arrival + self.deadline_s
        stopped = False      # aborted: drain the backend's stream, forward nothing more
        for response in responses:
            problem = adapter.error_of(response)
            if problem is not None and not stopped:
                send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{backend} failed mid-stream: {problem}")))
                send(flags=FINAL)
                return False
            if not stopped and response.output_tensors():
                send(adapter.response(response))
            now = time.monotonic()
            if not stopped and now >= next_check:
                next_check = now + CANCEL_POLL_S
                if sender.is_cancelled():
                    stopped = True
                    self.abort(backend, request_id)
                elif now > deadline:
                    stopped = True
                    self.abort(backend, request_id)
                    send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        f"deadline of {self.deadline_s} s exceeded")))
        send(flags=FINAL)
        return True

    def abort(self, backend, request_id):
        """Tell the backend to abort a request (BLS response iterators cannot cancel).

        Callable from any thread: the BLS call itself must run on the stub's event loop
        (a private loop in a worker thread never reaches the backend)."""
        abort_inputs = self.adapters[backend].abort_inputs(request_id)
        if abort_inputs is None:
            return
        self.metrics.abort(backend)
        abort = pb_utils.InferenceRequest(model_name=backend, inputs=abort_inputs,
                                          requested_output_names=[])
        asyncio.run_coroutine_threadsafe(self.send_abort(abort), self.loop)

    async def send_abort(self, abort):
        try:
            responses = await abort.async_exec(decoupled=True)
            await self.loop.run_in_executor(self.pool, _drain, responses)
        except Exception:
            pass  # the backend is gone: nothing left to abort


def _drain(responses):
    for _ in responses:
        pass


def _client_fault(response):
    return (response.has_error()
            and response.error().code() == pb_utils.TritonError.INVALID_ARG)


def _input_text(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else first_scalar(tensor.as_numpy())


class RouterMetrics:
    """Requests by route and backend, fallbacks, aborts, errors, breaker states, added
    latency. Label sets are created lazily and kept (the stub needs the references)."""

    def __init__(self, router, backends):
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
