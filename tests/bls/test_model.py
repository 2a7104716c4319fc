"""The router model (bls/model.py) in milliseconds: its real code against test doubles of
the stub's pb_utils (tests/fakes/fake_pb_utils.py) and of the backend models it calls.

The fake response sender raises on anything sent after the final flag, so every test
also checks "final flag exactly once, nothing after it". Backends are scripted: chunks
with a delay, an error before the first token, an error mid-stream, a stub that dies
(its BLS iterator never ends and control requests fail), INVALID_ARG rejections.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import logging
import re
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from bls import adapters, control, read_request, relay
from bls.job import READY_IDS
from builder.render.router_json import router_config
from builder.spec import parse_spec
from tests.fakes import fake_pb_utils as pb
from trident_common import error_classes, interface
from trident_common.request import CLIENT_FAULT_PREFIX

ROOT = Path(__file__).resolve().parents[2]
FINAL = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


# -- test doubles: the backends behind the router -----------------------------------------


def string_tensor(name, value):
    return pb.Tensor(name, np.array([value.encode()], dtype=np.object_))


def chunk(text, backend, error="", finish_reason=""):
    return pb.InferenceResponse(
        output_tensors=[
            string_tensor("text_output", text),
            string_tensor("finish_reason", finish_reason),
            string_tensor("served_by", backend),
            string_tensor("error", error),
        ]
    )


class FakeBackend:
    """A backend model as the router sees it through BLS.

    chunks: texts to stream; delay_s: before each; first_error: an error response
    instead of the first chunk (code INTERNAL or INVALID_ARG); fail_after: an `error`
    output (fail_message) after that many chunks; die_after: stop answering after that
    many chunks and fail every later request (a killed stub); control_delay_s: how long
    control requests (aborts, probes) take to answer (a busy engine). As trident's engine
    models do, the last chunk carries the final flag, and stream=false gets one response.
    seen_inputs: every request's inputs, in order (aborts and probes too)."""

    def __init__(
        self,
        name,
        chunks=("a", "b", "c"),
        delay_s=0.0,
        first_error=None,
        first_error_code=pb.TritonError.INTERNAL,
        fail_after=None,
        die_after=None,
        fail_message="engine exploded",
        control_delay_s=0.0,
        final_after_s=None,
    ):
        self.name, self.chunks, self.delay_s = name, list(chunks), delay_s
        self.final_after_s = final_after_s
        self.first_error, self.first_error_code = first_error, first_error_code
        self.fail_after, self.die_after = fail_after, die_after
        self.fail_message, self.control_delay_s = fail_message, control_delay_s
        self.request_ids, self.seen_inputs = [], []
        self.parameters = []  # each request's parameters (BLS calls)
        self.dead, self.buried = threading.Event(), threading.Event()
        self.calls, self.aborted, self.controls = 0, [], 0
        # streams between their first chunk's wait and their final response, now and at most
        self.streaming = self.most_streaming = 0
        self._aborts: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def open(self, inputs):
        self.seen_inputs.append(dict(inputs))
        if self.dead.is_set():
            raise pb.TritonModelException(f"Stub process '{self.name}_0_0' is not healthy.")
        abort_id = inputs.get("abort_request_id")
        if abort_id is not None:
            return self._control(abort_id)
        with self.lock:
            self.calls += 1
            self.request_ids.append(inputs["request_id"])
            stop = self._aborts.setdefault(inputs["request_id"], threading.Event())
        if inputs.get("stream") is False:
            return self._single(stop)
        return self._stream(stop)

    def _control(self, request_id):
        with self.lock:
            self.controls += 1
        time.sleep(self.control_delay_s)  # off the loop: BLS runs it in a thread
        with self.lock:
            if request_id in self._aborts:
                self.aborted.append(request_id)
                self._aborts[request_id].set()
        return iter([(pb.InferenceResponse(), True)])

    def _stream(self, stop):
        """(response, whether it is the final one), like Triton's final flag."""
        if self.first_error is not None:
            yield (
                pb.InferenceResponse(error=pb.TritonError(self.first_error, self.first_error_code)),
                True,
            )
            return
        with self.lock:
            self.streaming += 1
            self.most_streaming = max(self.most_streaming, self.streaming)
        for i, text in enumerate(self.chunks):
            if self.die_after is not None and i == self.die_after:
                self.dead.set()
                self.buried.wait()  # a dead stub: the iterator never ends
                return  # (until the test is over)
            if stop.wait(self.delay_s):
                break
            error = self.fail_message if self.fail_after == i else ""
            last = i == len(self.chunks) - 1
            if last and self.final_after_s is not None:
                # the answer's end (its finish reason), the engine's final flag later
                yield chunk(text, self.name, finish_reason="stop"), False
                time.sleep(self.final_after_s)
                break
            yield chunk(text, self.name, error), last and not error
            if error or last:
                break
        with self.lock:
            self.streaming -= 1
        yield pb.InferenceResponse(), True  # flags-only final: no tensors

    def _single(self, stop):
        if stop.wait(self.delay_s * len(self.chunks)):
            yield pb.InferenceResponse(), True
        else:
            yield chunk("".join(self.chunks), self.name), True


class BlsIterator:
    """Triton 2.51's decoupled BLS response iterator (python_backend
    src/pb_response_iterator.cc), quirks included: once the final response has been read,
    iter() rewinds it, so a `for` loop started then yields every response again."""

    def __init__(self, responses):
        self._responses = responses  # (response, final) pairs
        self._seen, self._index, self._finished = [], 0, False

    def __iter__(self):
        if self._finished and self._index >= len(self._seen):
            self._index = 0
        return self

    def __next__(self):
        if self._finished:
            if self._index < len(self._seen):
                self._index += 1
                return self._seen[self._index - 1]
            raise StopIteration
        response, final = next(self._responses, (None, True))
        if response is None:
            self._finished = True
            raise StopIteration
        self._seen.append(response)
        self._finished = final
        self._index = len(self._seen)
        return response


class BlsRequest:
    """pb_utils.InferenceRequest as the router builds it (BLS side)."""

    backends: dict[str, FakeBackend] = {}

    def __init__(self, model_name, inputs, requested_output_names, parameters=None):
        assert parameters is None or all(
            isinstance(v, (bool, int, str)) for v in parameters.values()
        ), parameters
        self.parameters = parameters
        self.model_name = model_name
        self.inputs = {t.name(): first(t.as_numpy()) for t in inputs}
        self.input_tensors = list(inputs)

    def exec(self, decoupled=False):
        """Like Triton's: returns once the first response is in (or raises)."""
        assert decoupled
        backend = self.backends.get(self.model_name)
        if backend is None:
            raise pb.TritonModelException(
                f"Failed for execute the inference request. Model '{self.model_name}' is not ready."
            )
        backend.parameters.append(self.parameters)
        responses = backend.open(self.inputs)
        first_response = next(responses, None)  # a dead backend's never returns
        return BlsIterator(itertools.chain([first_response] if first_response else [], responses))

    async def async_exec(self, decoupled=False):
        """Like Triton's: resolves once the first response is in (or raises); the
        router sends its control requests this way."""
        assert decoupled
        backend = self.backends.get(self.model_name)
        if backend is None:
            raise pb.TritonModelException(
                f"Failed for execute the inference request. Model '{self.model_name}' is not ready."
            )
        responses = backend.open(self.inputs)
        loop = asyncio.get_running_loop()
        arrived = loop.create_future()

        def fetch():  # a daemon thread: a dead backend's never returns
            first_response = next(responses, None)
            with contextlib.suppress(RuntimeError):  # the test's loop may be gone
                loop.call_soon_threadsafe(
                    lambda: arrived.done() or arrived.set_result(first_response)
                )

        threading.Thread(target=fetch, daemon=True).start()
        first_response = await arrived
        return BlsIterator(itertools.chain([first_response] if first_response else [], responses))


class ClientInputs(dict):
    """Input tensors by name, also callable like the stub's request.inputs()."""

    def __call__(self):
        return list(self.values())


class ClientRequest:
    """A request Triton hands the router's execute()."""

    def __init__(
        self, prompt="Hello", hints=None, parameters=None, messages=None, stream=True, traced=None
    ):
        inputs = ClientInputs()
        if prompt is not None:
            inputs["text_input"] = string_tensor("text_input", prompt)
        if messages is not None:
            inputs["messages"] = string_tensor("messages", messages)
        inputs["stream"] = pb.Tensor("stream", np.array([stream]))
        for name, value in (hints or {}).items():
            inputs[name] = string_tensor(name, value)
        self.inputs = inputs
        self._parameters = json.dumps(parameters or {})
        self.sender = pb.ResponseSender()
        # What Triton's trace.get_context() gives: None untraced, else its traceparent.
        self.context = None if traced is None else json.dumps({"traceparent": traced})

    def get_response_sender(self):
        return self.sender

    def trace(self):
        return types.SimpleNamespace(get_context=lambda: self.context)

    def is_cancelled(self):
        return self.sender.cancelled

    def parameters(self):
        return self._parameters

    # -- what the client saw -----------------------------------------------------------
    def texts(self):
        return [r.value("text_output") for r in self.sender.responses() if not r.has_error()]

    def errors(self):
        return [r.error().message() for r in self.sender.responses() if r.has_error()]

    def served_by(self):
        return {r.value("served_by") for r in self.sender.responses() if not r.has_error()}


def first(value):
    item = np.asarray(value).reshape(-1)[0]
    return item.decode() if isinstance(item, bytes) else item.item()


def get_output_tensor_by_name(response, name):
    return next((t for t in response.output_tensors() if t.name() == name), None)


# -- loading the router with the doubles --------------------------------------------------

SPEC = {
    "models": [
        {"name": "primary", "engine": "vllm", "model": "/m/primary"},
        {"name": "backup", "engine": "vllm", "model": "/m/backup"},
        {"name": "solo", "engine": "vllm", "model": "/m/solo"},
    ],
    "router": {
        "default": ["primary"],
        "fallback": {"primary": ["backup"]},
        "rules": [{"name": "alone", "match": {"hint": "alone"}, "backends": ["solo"]}],
        "breaker": {"consecutive_failures": 2, "min_requests": 100, "cooldown_s": 60},
        "first_token_timeout_s": 5,
        "deadline_s": 10,
        "max_inflight_per_backend": 4,
    },
}


@contextlib.contextmanager
def router_modules():
    """bls.model, with Triton's pb_utils played by the test double (tests/conftest.py
    installs it for the run): for the block, a BLS request the router makes goes to the
    test's backends (BlsRequest)."""
    saved = {name: getattr(pb, name, None) for name in BLS_DOUBLES}
    for name, double in BLS_DOUBLES.items():
        setattr(pb, name, double)
    try:
        yield importlib.import_module("bls.model")
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(pb, name)
            else:
                setattr(pb, name, value)


BLS_DOUBLES = {
    "InferenceRequest": BlsRequest,
    "get_output_tensor_by_name": get_output_tensor_by_name,
}


@pytest.fixture
def router(tmp_path, monkeypatch):
    with router_modules() as module:
        monkeypatch.setattr(module, "FIRST_TOKEN_WATCH_S", 0.005)
        monkeypatch.setattr(module, "STREAM_WATCH_S", 0.005)
        monkeypatch.setattr(module, "SILENCE_PROBE_S", 0.1)
        monkeypatch.setattr(control, "SILENCE_PROBE_S", 0.1)
        monkeypatch.setattr(control, "PROBE_TIMEOUT_S", 0.5)
        models = []
        yield lambda **overrides: make_router(module, tmp_path, models, **overrides)
        for model in models:
            model.finalize()
            for backend in model.test_backends:
                backend.buried.set()


def make_router(
    module,
    tmp_path,
    models,
    backends=(),
    replicas=None,
    policies=None,
    tenants=None,
    capacities=None,
    engines=None,
    **router_overrides,
):
    """`replicas`: backend → its replicas' model names, and `policies`: backend → its
    replica policy, written into router.json as the renderer writes them; `tenants`: the
    spec's tenants section; `engines`: backend → the engine router.json names for it."""
    data = json.loads(json.dumps(SPEC))
    data["router"].update(router_overrides)
    if tenants is not None:
        data["tenants"] = tenants
    (tmp_path / "1").mkdir(exist_ok=True)
    config = router_config(parse_spec(data, "<test>")).to_dict()
    for backend, names in (replicas or {}).items():
        config["backends"][backend]["replicas"] = list(names)
    for backend, policy in (policies or {}).items():
        config["backends"][backend]["policy"] = policy
    for backend, capacity in (capacities or {}).items():
        config["backends"][backend]["capacity"] = capacity
    for backend, engine in (engines or {}).items():
        config["backends"][backend]["engine"] = engine
    (tmp_path / "1" / "router.json").write_text(json.dumps(config))
    BlsRequest.backends = {b.name: b for b in backends}
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(tmp_path), "model_version": "1"})
    model.test_backends = list(backends)
    models.append(model)
    return model


def run(model, *requests, during=None):
    """Each request in a batch of its own, concurrently on one loop (as execute hands them
    to the router's loop); `during`
    (a coroutine function) runs alongside, e.g. to cancel a request."""

    async def main():
        tasks = [model.handle_batch([r]) for r in requests]
        if during is not None:
            tasks.append(during())
        await asyncio.gather(*tasks)
        # let the relay threads finish their sends, and control requests (aborts) land
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: [r.sender.wait_closed(5) for r in requests]
        )
        while model.controls.background:
            await asyncio.gather(*model.controls.background)

    asyncio.run(main())
    model.metrics.writes.flush()  # the router writes its metrics from a thread


def run_with_one_more(model, busy, other):
    """run(busy); once it has streamed a text, send `other` alongside it."""

    async def after_first_text():
        while not busy.texts():
            await asyncio.sleep(0.002)
        await model.handle_batch([other])

    run(model, busy, during=after_first_text)


def gauge(model, backend):
    return pb.metric("trident_router_breaker_state", router="router", backend=backend).value()


# -- the happy path -----------------------------------------------------------------------


def test_relays_every_chunk_in_order_then_one_final(router):
    model = router(backends=[FakeBackend("primary", chunks=list("abcdef"))])
    request = ClientRequest()
    run(model, request)
    assert request.texts() == list("abcdef")
    assert request.served_by() == {"primary"}
    assert request.sender.final_flags() == 1
    assert request.sender.sent[-1] == (None, FINAL)  # flags-only final
    assert (
        pb.metric(
            "trident_router_requests_total", router="router", route="default", served_by="primary"
        ).value()
        >= 1
    )


def test_router_only_inputs_are_not_forwarded(router):
    backend = FakeBackend("primary")
    seen = backend.seen_inputs
    model = router(backends=[backend])
    hints = {name: "x" for name in interface.HINT_NAMES}
    run(model, ClientRequest(hints={**hints, "route": "primary", "request_id": "mine"}))
    assert not set(seen[0]) & set(interface.HINT_NAMES)
    assert seen[0]["request_id"].startswith("router-")  # the router's id, not the client's


def test_the_router_reads_its_names_from_the_interface(router):
    model = router(backends=[])
    assert read_request.HINT_NAMES == interface.HINT_NAMES
    assert adapters.ROUTER_ONLY_INPUTS == interface.ROUTER_ONLY_INPUTS
    assert model.adapters["primary"].outputs == list(interface.OUTPUT_NAMES)
    assert {key: name for key, (name, _) in adapters.TRTLLM_SAMPLING.items()} == {
        key: t.ensemble for key, t in interface.TRTLLM_SAMPLING.items()
    }


def test_sixteen_streams_are_relayed_in_parallel(router):
    backend = FakeBackend("primary", chunks=list("abcde"), delay_s=0.05)
    model = router(backends=[backend], max_inflight_per_backend=16)
    requests = [ClientRequest() for _ in range(16)]
    run(model, *requests)
    # Counted, not timed: serialised streams would never overlap (1), whatever the load.
    # Each stream is open 0.25 s, so the 16 overlap however slowly their calls start.
    assert backend.most_streaming >= 8, f"at most {backend.most_streaming} streams at once"
    for request in requests:
        assert request.texts() == list("abcde") and request.sender.final_flags() == 1


# -- fallback before the first token ------------------------------------------------------


def test_error_before_first_token_falls_back(router):
    primary = FakeBackend("primary", first_error="engine not ready")
    model = router(backends=[primary, FakeBackend("backup")])
    request = ClientRequest()
    run(model, request)
    assert request.served_by() == {"backup"} and not request.errors()
    assert (
        pb.metric("trident_router_fallbacks_total", router="router", backend="primary").value() == 1
    )


def test_unhealthy_or_missing_backend_falls_back(router):
    dead = FakeBackend("primary")
    dead.dead.set()
    model = router(backends=[dead, FakeBackend("backup")])
    request = ClientRequest()
    run(model, request)
    assert request.served_by() == {"backup"}
    model = router(backends=[FakeBackend("backup")])  # primary not loaded
    request = ClientRequest()
    run(model, request)
    assert request.served_by() == {"backup"}


def test_consecutive_failures_open_the_breaker_and_traffic_skips_the_backend(router):
    primary = FakeBackend("primary", first_error="boom")
    model = router(backends=[primary, FakeBackend("backup")])
    requests = [ClientRequest() for _ in range(4)]
    for request in requests:
        run(model, request)
    assert all(r.served_by() == {"backup"} for r in requests)
    assert primary.calls == 2  # opened after 2: later ones skip it
    assert gauge(model, "primary") == 2


def test_all_candidates_failing_names_each_failure(router):
    model = router(
        backends=[
            FakeBackend("primary", first_error="p broke"),
            FakeBackend("backup", first_error="b broke"),
        ]
    )
    request = ClientRequest()
    run(model, request)
    (error,) = request.errors()
    assert "primary: p broke" in error and "backup: b broke" in error
    assert request.sender.final_flags() == 1


def test_client_fault_goes_to_the_client_without_fallback(router):
    # as trident's backends report a client's mistake (trident_common.triton_io)
    message = CLIENT_FAULT_PREFIX + "sampling_parameters is not valid JSON"
    primary = FakeBackend(
        "primary", first_error=message, first_error_code=pb.TritonError.INVALID_ARG
    )
    backup = FakeBackend("backup")
    model = router(backends=[primary, backup])
    request = ClientRequest()
    run(model, request)
    assert request.errors() == [message]
    assert request.sender.responses()[0].error().code() == pb.TritonError.INVALID_ARG
    assert backup.calls == 0 and gauge(model, "primary") == 0


def test_first_token_timeout_aborts_and_falls_back(router):
    slow = FakeBackend("primary", delay_s=5)
    model = router(backends=[slow, FakeBackend("backup")], first_token_timeout_s=0.1)
    request = ClientRequest()
    run(model, request)
    assert request.served_by() == {"backup"}
    assert len(slow.aborted) == 1


def test_backend_dying_before_first_token_falls_back(router):
    dying = FakeBackend("primary", die_after=0)
    model = router(backends=[dying, FakeBackend("backup")])
    request = ClientRequest()
    run(model, request)
    assert request.served_by() == {"backup"}


# -- failures after the first token -------------------------------------------------------


def test_mid_stream_error_is_an_error_response_then_the_final_flag(router):
    model = router(
        backends=[FakeBackend("primary", chunks=list("abcd"), fail_after=2), FakeBackend("backup")]
    )
    request = ClientRequest()
    run(model, request)
    assert request.texts() == ["a", "b"]  # no fallback: text was sent
    (error,) = request.errors()
    assert "primary failed mid-stream" in error and "engine exploded" in error
    assert request.sender.final_flags() == 1
    assert request.sender.sent[-1] == (None, FINAL)


def test_backend_dying_mid_stream_ends_the_stream_with_an_error(router):
    model = router(backends=[FakeBackend("primary", chunks=list("abcd"), die_after=2)])
    request = ClientRequest()
    started = time.monotonic()
    run(model, request)
    assert time.monotonic() - started < 2
    assert request.texts() == ["a", "b"]
    (error,) = request.errors()
    assert "primary failed mid-stream" in error and "not healthy" in error
    assert request.sender.final_flags() == 1


def test_deadline_mid_stream_aborts_with_a_clear_error(router):
    backend = FakeBackend("primary", chunks=["x"] * 100, delay_s=0.02)
    model = router(backends=[backend], deadline_s=0.5)
    request = ClientRequest()
    run(model, request)
    assert 0 < len(request.texts()) < 100
    assert request.errors() == ["deadline of 0.5 s exceeded"]
    assert request.sender.final_flags() == 1
    assert len(backend.aborted) == 1
    assert gauge(model, "primary") == 0  # a deadline is not the backend's fault


# -- cancellation -------------------------------------------------------------------------


def cancel_after_first_text(request, backend):
    async def cancel():
        while not request.texts():
            await asyncio.sleep(0.002)
        request.sender.cancelled = True
        while not backend.aborted:
            await asyncio.sleep(0.002)

    return cancel


def test_cancel_mid_stream_aborts_the_backend_request(router):
    backend = FakeBackend("primary", chunks=["x"] * 200, delay_s=0.01)
    model = router(backends=[backend])
    request = ClientRequest()
    run(model, request, during=cancel_after_first_text(request, backend))
    assert len(request.texts()) < 200
    assert backend.aborted and backend.aborted[0].startswith("router-")
    assert request.sender.final_flags() == 1
    assert pb.metric("trident_router_aborts_total", router="router", backend="primary").value() == 1


def test_cancel_before_first_token_closes_the_stream_and_frees_the_probe(router):
    backend = FakeBackend("primary", delay_s=5)
    model = router(backends=[backend])
    breaker = model.breakers["primary"]
    breaker.record_failure()
    breaker.record_failure()  # open
    breaker._opened_at -= 60  # cooldown over: the next one is the probe
    request = ClientRequest()

    async def cancel():
        while not backend.calls:
            await asyncio.sleep(0.002)
        request.sender.cancelled = True

    run(model, request, during=cancel)
    assert request.sender.final_flags() == 1 and not request.texts()
    assert backend.aborted
    assert breaker.available()  # the probe slot is free again


# -- limits and bad requests --------------------------------------------------------------


def test_max_inflight_per_backend_rejects_with_a_clear_error(router):
    backend = FakeBackend("solo", chunks=["x"] * 10, delay_s=0.1)
    model = router(backends=[backend], max_inflight_per_backend=1)
    busy, rejected = (
        ClientRequest(hints={"route": "alone"}),
        ClientRequest(hints={"route": "alone"}),
    )
    run_with_one_more(model, busy, rejected)
    assert busy.texts() == ["x"] * 10
    (error,) = rejected.errors()
    assert "max_inflight_per_backend is 1" in error and "solo" in error
    assert rejected.sender.final_flags() == 1


def test_the_backends_slot_is_free_once_the_client_has_its_final_flag(router):
    """Issue 34: at max_inflight_per_backend 1, a client's next request right after its
    answer's final flag met `overloaded`: the router handed the backend's slot back only
    once the backend's own final flag had come too. Now it goes back as the client's
    stream ends (before the client can send again: here 10 ms after its final flag)."""
    backend = FakeBackend("solo", chunks=["a", "b"], final_after_s=0.5)
    model = router(backends=[backend], max_inflight_per_backend=1)
    first, second = (ClientRequest(hints={"route": "alone"}) for _ in range(2))

    async def right_after_the_final_flag():
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, first.sender.closed.wait, 5)
        await asyncio.sleep(0.01)
        await model.handle_batch([second])

    run(model, first, during=right_after_the_final_flag)
    assert first.texts() == ["a", "b"] and first.sender.final_flags() == 1
    assert second.errors() == [] and second.texts() == ["a", "b"]
    assert model.targets.inflight["solo"] == 0  # each slot handed back once


def test_unknown_route_is_an_error_naming_the_routes(router):
    model = router(backends=[FakeBackend("primary")])
    request = ClientRequest(hints={"route": "nope"})
    run(model, request)
    (error,) = request.errors()
    assert "'nope'" in error and "alone, backup, primary, solo" in error
    assert request.sender.sent[-1] == (None, FINAL)


def test_hints_from_request_parameters(router):
    model = router(backends=[FakeBackend("primary"), FakeBackend("solo")])
    request = ClientRequest(parameters={"route": "alone"})
    run(model, request)
    assert request.served_by() == {"solo"}


@pytest.mark.parametrize(
    "messages, expected",
    [
        ("not json", "messages is not valid JSON"),
        ('"hi"', "messages must be a JSON list"),
        ('{"role": "user"}', "messages[0] must be an object with string 'role' and 'content'"),
        ("[]", "not empty"),
    ],
)
def test_malformed_messages_are_bad_requests(router, messages, expected):
    model = router(backends=[FakeBackend("primary")])
    request = ClientRequest(prompt=None, messages=messages)
    run(model, request)
    (error,) = request.errors()
    assert expected in error and request.sender.final_flags() == 1


def _raise_value_error(*args, **kwargs):
    raise ValueError("setting an array element with a sequence")  # as numpy would


def test_an_unexpected_value_error_reading_a_request_is_a_router_error_not_a_400(router):
    # Before: any ValueError while reading the request was the client's 400.
    primary = FakeBackend("primary")
    model = router(backends=[primary])
    model.tenants.set_tier = _raise_value_error  # a step of the router's inbound parsing
    request = ClientRequest()
    run(model, request)
    (error,) = [r.error() for r in request.sender.responses() if r.has_error()]
    assert error.message() == "router error: setting an array element with a sequence"
    assert error_classes.classify(error.message()) is error_classes.INTERNAL
    assert error.code() == pb.TritonError.INTERNAL
    assert request.sender.final_flags() == 1 and primary.calls == 0


def test_an_unexpected_value_error_building_a_backend_request_is_not_a_fallback(router):
    # Before: it was DoesNotFit, so the next candidate got a request the router broke.
    primary, backup = FakeBackend("primary"), FakeBackend("backup")
    model = router(backends=[primary, backup])
    model.adapters["primary"].inputs = _raise_value_error
    request = ClientRequest()
    run(model, request)
    (error,) = [r.error() for r in request.sender.responses() if r.has_error()]
    assert error_classes.classify(error.message()) is error_classes.INTERNAL
    assert error.message().startswith("router error: ")
    assert request.sender.final_flags() == 1 and primary.calls == backup.calls == 0
    assert model.inflight["primary"] == 0  # the attempt's slot was given back


def test_fallbacks_and_breaker_transitions_are_logged(router, caplog):
    model = router(backends=[FakeBackend("primary", first_error="boom"), FakeBackend("backup")])
    with caplog.at_level(logging.INFO, logger="trident"):
        for _ in range(2):
            run(model, ClientRequest())
    lines = [r.getMessage() for r in caplog.records]
    assert "[router] primary failed before its first token, falling back: boom" in lines
    assert "[router] primary: circuit breaker closed -> open" in lines


def test_breaker_state_gauges_start_closed(router):
    model = router(backends=[])
    model.metrics.writes.flush()
    assert {b: gauge(model, b) for b in ("primary", "backup", "solo")} == {
        "primary": 0,
        "backup": 0,
        "solo": 0,
    }


# -- single responses, ids, load -----------------------------------------------------------


def test_a_non_streaming_request_gets_exactly_one_response_with_the_final_flag(router):
    # HTTP generate rejects anything else; the 2.51 iterator's rewind once sent it twice.
    model = router(backends=[FakeBackend("primary", chunks=["Hello", " there"])])
    request = ClientRequest(stream=False)
    run(model, request)
    assert len(request.sender.sent) == 1
    response, flags = request.sender.sent[0]
    assert flags == FINAL and response.value("text_output") == "Hello there"


def test_a_whole_answer_longer_than_the_first_token_timeout_succeeds(router):
    """A non-streamed answer is the engine's one response, sent when it is done: the
    first-token timer does not time it, the deadline does (issue 34: it failed after
    running on both backends)."""
    primary, backup = (
        FakeBackend("primary", chunks=list("abcd"), delay_s=0.1),
        FakeBackend("backup"),
    )
    model = router(backends=[primary, backup], first_token_timeout_s=0.1)
    request = ClientRequest(stream=False)
    run(model, request)
    assert request.texts() == ["abcd"] and request.served_by() == {"primary"}
    assert backup.calls == 0 and primary.aborted == []


def test_a_whole_answer_past_the_deadline_ends_there_and_runs_nowhere_else(router):
    primary, backup = (
        FakeBackend("primary", chunks=list("abcd"), delay_s=0.5),
        FakeBackend("backup"),
    )
    model = router(backends=[primary, backup], first_token_timeout_s=0.1, deadline_s=0.5)
    request = ClientRequest(stream=False)
    run(model, request)
    assert request.errors() == ["deadline of 0.5 s exceeded"]
    assert request.sender.final_flags() == 1
    assert backup.calls == 0 and len(primary.aborted) == 1
    assert gauge(model, "primary") == 0  # not the backend's failure


def test_a_one_chunk_stream_is_relayed_once(router):
    model = router(backends=[FakeBackend("primary", chunks=["Hello"])])
    request = ClientRequest()
    run(model, request)
    assert request.texts() == ["Hello"] and request.sender.final_flags() == 1


def test_backend_request_ids_are_unguessable(router):
    backend = FakeBackend("primary")
    model = router(backends=[backend])
    run(model, ClientRequest(), ClientRequest())
    first, second = (i.removeprefix("router-") for i in backend.request_ids)
    # 128 random bits each: no pid or counter inside. (Not `str(pid) not in id`: a random
    # hex id holds the pid's digits by chance about once in a thousand runs; a CI run
    # met it.) A pid or a counter would leave the two ids sharing their head or tail.
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in (first, second))
    assert first[:8] != second[:8] and first[-8:] != second[-8:]


def test_a_backend_request_takes_an_id_made_ahead_and_its_end_makes_another(router):
    """The id, its request_id tensor and proof are made before the request (off its
    first-token path: bls/job.py RequestIds); the request's end restocks them."""
    backend = FakeBackend("primary")
    model = router(backends=[backend])
    ready = [made.text for made in model.request_ids.ready]
    assert len(ready) == READY_IDS
    run(model, ClientRequest())
    assert backend.request_ids == ready[:1]
    left = [made.text for made in model.request_ids.ready]
    assert left[: READY_IDS - 1] == ready[1:] and len(left) == READY_IDS


def test_execute_hands_each_batch_to_the_routers_own_loop_and_returns(router):
    """The stub calls execute on its main thread: it returns at once, and the requests
    are answered on the router's loop thread, the same thread for every batch (where all
    of the router's state is touched)."""
    backend = FakeBackend("primary", chunks=["a", "b"], delay_s=0.05)
    model = router(backends=[backend])
    batches = [[ClientRequest()], [ClientRequest(), ClientRequest()]]
    for batch in batches:
        assert model.execute(batch) is None  # long before the 0.05 s answer
        assert not any(request.sender.final_flags() for request in batch)
    requests = [request for batch in batches for request in batch]
    for request in requests:
        request.sender.wait_closed(5)
        assert request.texts() == ["a", "b"] and request.sender.final_flags() == 1
    assert model.loop is model.serving_loop and model.serving_loop.is_running()
    assert "router-loop" in [thread.name for thread in threading.enumerate()]


def test_a_slow_health_probe_means_busy_not_dead(router):
    # The first token comes after several silent periods; the probes go unanswered
    # (a loaded engine), which must neither fail primary nor fall back.
    primary = FakeBackend("primary", chunks=["late"], delay_s=1.2, control_delay_s=5)
    backup = FakeBackend("backup")
    model = router(backends=[primary, backup])
    requests = [ClientRequest() for _ in range(4)]
    run(model, *requests)
    for request in requests:
        assert request.texts() == ["late"] and not request.errors()
    assert backup.calls == 0 and gauge(model, "primary") == 0
    assert primary.controls == 1  # one shared probe, not one per silent stream


def test_a_client_fault_mid_stream_never_counts_against_the_backend(router):
    message = CLIENT_FAULT_PREFIX + "temperature must be >= 0"
    primary = FakeBackend("primary", fail_after=1, fail_message=message)
    model = router(backends=[primary, FakeBackend("backup")])
    requests = [ClientRequest() for _ in range(3)]  # the breaker opens after 2 failures
    for request in requests:
        run(model, request)
        assert request.errors() == [message] and request.sender.final_flags() == 1
    assert primary.calls == 3 and gauge(model, "primary") == 0


def test_all_backends_full_is_an_overloaded_error(router):
    backend = FakeBackend("solo", chunks=["x"] * 5, delay_s=0.05)
    model = router(backends=[backend], max_inflight_per_backend=1)
    busy, shed = ClientRequest(hints={"route": "alone"}), ClientRequest(hints={"route": "alone"})
    run_with_one_more(model, busy, shed)
    (error,) = shed.errors()
    assert error.startswith("overloaded: ") and "solo" in error
    assert (
        pb.metric("trident_router_errors_total", router="router", reason="overloaded").value() >= 1
    )


def test_a_pinned_backend_is_never_answered_by_its_fallback(router):
    """route: primary (a backend) under overload or failure: primary's answer or an error
    (overloaded / failed), never backup's, though backup is primary's fallback."""
    primary, backup = FakeBackend("primary", chunks=["x"] * 5, delay_s=0.05), FakeBackend("backup")
    model = router(backends=[primary, backup], max_inflight_per_backend=1)
    busy, pinned = (
        ClientRequest(hints={"route": "primary"}),
        ClientRequest(hints={"route": "primary"}),
    )
    run_with_one_more(model, busy, pinned)
    assert busy.served_by() == {"primary"}
    (error,) = pinned.errors()
    assert error.startswith("overloaded: ") and "'primary'" in error and not pinned.texts()
    broken = router(backends=[FakeBackend("primary", first_error="boom"), backup])
    failed = ClientRequest(hints={"route": "primary"})
    run(broken, failed)
    assert failed.errors() == ["every backend failed before its first token: primary: boom"]
    assert backup.calls == 0
    unpinned = ClientRequest()  # the default route still falls back
    run(broken, unpinned)
    assert unpinned.served_by() == {"backup"}


def test_the_engine_caps_the_inflight_limit(router):
    """The limit follows the capacity the builder wrote into router.json (the router
    reads no other model's files for it): twice the engine's sequences, at most the
    spec's limit; no capacity, the spec's limit alone."""
    capped = router(capacities={"primary": 3, "backup": 80}, max_inflight_per_backend=100)
    assert capped.targets.max_inflight == {"primary": 6, "backup": 100, "solo": 100}
    from bls import inbound

    assert inbound.inflight_limit(256, 32) == 64 and inbound.inflight_limit(8, 32) == 8
    assert inbound.inflight_limit(256, None) == 256


def test_a_router_json_the_router_cannot_use_fails_its_load_naming_the_field(router):
    with pytest.raises(ValueError, match=r"^router\.json: backends\.primary\.capacity: "):
        router(capacities={"primary": "many"})


def test_one_message_object_is_forwarded_as_a_list(router):
    backend = FakeBackend("primary")
    seen = backend.seen_inputs
    model = router(backends=[backend])
    request = ClientRequest(prompt=None, messages='{"role": "user", "content": "Hi"}')
    run(model, request)
    assert json.loads(seen[0]["messages"]) == [{"role": "user", "content": "Hi"}]
    assert request.texts() == ["a", "b", "c"]


def test_requests_waiting_for_a_first_response_are_bounded(router, monkeypatch):
    # Triton's BLS holds a server thread per call until its first response: beyond the
    # slots, requests wait in the router, leaving threads for aborts and probes.
    backend = FakeBackend("primary", chunks=["x"], delay_s=0.3)
    model = router(backends=[backend], max_inflight_per_backend=8)
    monkeypatch.setitem(model.initialize.__globals__, "BLS_CALL_SLOTS", 2)
    requests = [ClientRequest() for _ in range(4)]
    started = time.monotonic()
    run(model, *requests)
    assert time.monotonic() - started >= 0.55  # two waves of two
    assert all(r.texts() == ["x"] for r in requests)


def test_finished_bls_iterators_outlive_the_stubs_own_cleanup(router, monkeypatch):
    # The stub erases its reference to a finished iterator later, from a thread without
    # the GIL: if that is the last one, the responses' numpy arrays are freed unlocked.
    import gc
    import weakref

    made = []

    class Tracked(BlsIterator):
        def __init__(self, responses):
            super().__init__(responses)
            made.append(weakref.ref(self))

    monkeypatch.setattr(sys.modules[__name__], "BlsIterator", Tracked)
    model = router(backends=[FakeBackend("primary")])
    run(model, ClientRequest(), ClientRequest(stream=False))
    gc.collect()
    assert len(made) == 2 and all(ref() is not None for ref in made)
    monkeypatch.setattr(relay, "RETIRE_S", 0)  # Retired lives in the router's relay module
    model.retired.next_prune = 0.0
    model.retired.prune()
    gc.collect()
    assert all(ref() is None for ref in made)


def test_request_parameters_travel_to_the_backend(router):
    # vllm_backend's clients may send sampling values as request parameters; the stub
    # takes bool/int/str parameter values only, so a float goes as its text.
    backend = FakeBackend("primary")
    model = router(backends=[backend])
    request = ClientRequest(
        parameters={"temperature": 0.5, "max_tokens": 5, "ignore_eos": True, "tenant": "t1"}
    )
    run(model, request)
    assert request.errors() == []
    backend.parameters[0].pop(interface.ROUTER_PROOF)  # the router's (trust.py)
    assert backend.parameters[0].pop(interface.ERRORS_IN_BAND) is True  # the router's
    assert backend.parameters == [
        {"temperature": "0.5", "max_tokens": 5, "ignore_eos": True, "tenant": "t1"}
    ]
    run(model, ClientRequest())
    assert sorted(backend.parameters[-1]) == sorted(
        [interface.ERRORS_IN_BAND, interface.ROUTER_PROOF]
    )


def test_a_traced_request_hands_its_traceparent_to_the_backend_and_only_its_own(router):
    backend = FakeBackend("primary")
    model = router(backends=[backend])
    ours = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    forged = {interface.TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    run(model, ClientRequest(traced=ours, parameters=forged))
    assert backend.parameters[-1][interface.TRACEPARENT] == ours
    run(model, ClientRequest(parameters=forged))  # untraced: the client's is never passed on
    assert interface.TRACEPARENT not in backend.parameters[-1]


@pytest.mark.parametrize("finish_reason, sends", [("length", 3), ("None", 4), ("", 4)])
def test_the_answers_last_chunk_carries_the_final_flag(router, finish_reason, sends):
    # As the engine models send it: no separate final send after a chunk that says it
    # is the last (a finish reason; "None" is vllm_backend's "not finished").
    class Finishing(FakeBackend):
        def _stream(self, stop):
            for i, text in enumerate(self.chunks):
                last = i == len(self.chunks) - 1
                yield chunk(text, self.name, finish_reason=finish_reason if last else ""), last

    model = router(backends=[Finishing("primary")])
    request = ClientRequest()
    run(model, request)
    assert request.texts() == ["a", "b", "c"] and request.sender.final_flags() == 1
    assert len(request.sender.sent) == sends
    assert request.sender.sent[2][1] == (FINAL if sends == 3 else 0)


def test_requests_waiting_for_a_call_slot_go_first_come_first_served(router, monkeypatch):
    # A freed slot goes to the request that waited longest, never to a newer one: under
    # steady load an unlucky request would otherwise pass its first-token timeout.
    backend = FakeBackend("primary", chunks=["x"], delay_s=0.05)
    model = router(backends=[backend], max_inflight_per_backend=8)
    monkeypatch.setitem(model.initialize.__globals__, "BLS_CALL_SLOTS", 1)
    requests = [ClientRequest(prompt=f"p{i}") for i in range(6)]
    run(model, *requests)
    calls = [inputs["text_input"] for inputs in backend.seen_inputs if "text_input" in inputs]
    assert calls == [f"p{i}" for i in range(6)]
