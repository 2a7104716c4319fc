"""The vLLM engine model against a real tritonserver, under bad requests, cancellation
storms, abort guessing and a dying engine: SmolLM2 on vLLM as `primary` behind `router`: the
session's fallback_server (deploy/examples/cpu-fallback.yaml, tests/server/conftest.py).

The last two are destructive (the engine is killed, then reloaded by `trident serve`'s
keeper): they run after the other tests of that server, and after test_router's failure
story (rank=1), which fails on a primary the keeper has reloaded (the killed stub's
model is loaded again at once, so no error reaches the stream; not yet understood).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid

import pytest
import tritonclient.grpc as grpcclient

from builder.serve import keeper
from builder.serve.client import build_inputs, first_output, stream_generate
from tests.helpers import bad_requests, engine_cores, metric_value, wait_for

pytestmark = [pytest.mark.server, pytest.mark.vllm]

GREEDY = {"temperature": 0}
ENDLESS = {"temperature": 0, "ignore_eos": True}  # runs until stopped or max_tokens


@pytest.fixture(scope="module")
def server(fallback_server):
    return fallback_server


def answer(server, model="primary", max_tokens=4):
    return stream_generate(
        server.grpc_url, model, "Say hi.", max_tokens=max_tokens, sampling=GREEDY, timeout_s=120
    )


def in_flight(server) -> float:
    return metric_value(server.metrics_url, "trident_requests_in_flight", model="primary")


class Stream:
    """One gRPC stream (empty final responses on); records texts, errors, final flags."""

    def __init__(self, server, inputs, model="primary", parameters=None):
        self.events: queue.Queue = queue.Queue()
        self.texts, self.errors, self.finals = [], [], 0
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.events.put((result, error)))
        self.client.async_stream_infer(
            model, inputs, enable_empty_final_response=True, parameters=parameters
        )

    def next(self, timeout_s=120.0) -> bool:
        """Take one event; False once the final flag came."""
        result, error = self.events.get(timeout=timeout_s)
        if error is not None:
            self.errors.append(error.message())
            return True
        if first_output(result, "error"):
            self.errors.append(first_output(result, "error"))
        if first_output(result, "text_output"):
            self.texts.append(first_output(result, "text_output"))
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self.finals += 1
            return False
        return True

    def finish(self, timeout_s=120.0) -> Stream:
        deadline = time.monotonic() + timeout_s
        while self.next(max(0.1, deadline - time.monotonic())):
            pass
        return self

    def close(self, cancel=False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def long_inputs(max_tokens=200, request_id=None):
    inputs = build_inputs(
        "Write a very long story about a dragon.", None, max_tokens, True, ENDLESS
    )
    if request_id is not None:
        inputs.append(bad_requests.text("request_id", request_id))
    return inputs


def abort(server, request_id: str) -> None:
    control = Stream(server, [bad_requests.text("abort_request_id", request_id)])
    control.finish(timeout_s=30)
    control.close()


# -- bad requests ---------------------------------------------------------------------------


def test_string_seed_does_not_kill_the_engine(server):
    stream = Stream(
        server, build_inputs("Say hi.", None, 4, True, {"seed": "5", "temperature": "0"})
    ).finish()
    stream.close()
    assert stream.errors == [] and stream.finals == 1
    assert answer(server).output_tokens == 4  # the engine still takes requests


def test_error_before_the_first_token_carries_the_final_flag(server):
    stream = Stream(server, build_inputs("Say hi.", None, 4, True, {"temperature": -1}))
    stream.finish(timeout_s=60)
    stream.close()
    assert stream.finals == 1
    assert len(stream.errors) == 1 and stream.errors[0].startswith("invalid request: ")
    assert "temperature" in stream.errors[0]


def test_request_parameters_are_sampling_values(server):
    stream = Stream(
        server,
        build_inputs("Say hi.", None, None, True),
        parameters={"temperature": 0, "max_tokens": 5},
    )
    stream.finish()
    stream.close()
    assert stream.errors == [] and stream.finals == 1
    assert metric_value(server.metrics_url, "trident_requests_total", model="primary") >= 1


def test_every_bad_request_kind_gets_a_clean_answer(server):
    bad, kinds = {}, 0
    for case in bad_requests.cases():
        kinds += 1
        found = bad_requests.problems(bad_requests.run_grpc(server.grpc_url, "primary", case))
        if found:
            bad[case.name] = found
    for name, body, expect in bad_requests.HTTP_CASES:
        kinds += 1
        found = bad_requests.run_http(server.http_url, "primary", body, expect)
        if found:
            bad[name] = found
    print(f"\nbad-request kinds: {kinds}, clean: {kinds - len(bad)}, bad: {len(bad)}")
    for name, found in bad.items():
        print(f"  {name}: {'; '.join(found)}")
    assert server.http_get("/v2/health/ready") == 200
    assert answer(server).output_tokens == 4
    assert not bad, f"{len(bad)} of {kinds} kinds answered badly: {sorted(bad)}"


def test_client_faults_through_the_router_do_not_open_the_breaker(server):
    for _ in range(4):
        stream = Stream(
            server, build_inputs("Say hi.", None, 4, True, {"top_p": 2}), model="router"
        ).finish(timeout_s=60)
        stream.close()
        assert stream.errors and stream.errors[0].startswith("invalid request: ")
    # Still primary's: an open breaker would send this to backup, its fallback.
    routed = answer(server, model="router")
    assert routed.output_tokens == 4 and routed.served_by == "primary"


# -- aborts and cancellation ----------------------------------------------------------------


def test_a_client_cannot_abort_a_request_by_guessing_its_engine_id(server):
    victim = Stream(server, long_inputs(max_tokens=48))
    assert victim.next()  # it is generating
    for n in range(200):  # every id the model handed out so far
        abort(server, f"primary-{n}")
    victim.finish()
    victim.close()
    assert victim.errors == [] and victim.finals == 1
    assert sum(len(t) for t in victim.texts) > 0


def test_a_direct_client_stops_its_request_by_cancelling_its_stream(server):
    own = uuid.uuid4().hex
    stream = Stream(server, long_inputs(max_tokens=500, request_id=own))
    assert stream.next()
    # abort_request_id is the router's (docs/security.md): its id is no handle for anyone.
    control = Stream(server, [bad_requests.text("abort_request_id", own)]).finish(30)
    control.close()
    assert control.errors and control.errors[0].startswith(
        "invalid request: abort_request_id is the router's own input"
    )
    stream.close(cancel=True)  # ends long before 500 tokens
    wait_for(lambda: in_flight(server) == 0, timeout_s=60)


def test_cancellation_storm_leaves_nothing_in_flight(server):
    aborted = metric_value(server.metrics_url, "trident_requests_aborted_total", model="primary")
    streams = [Stream(server, long_inputs(max_tokens=400)) for _ in range(16)]
    for stream in streams:
        stream.events.get(timeout=180)  # its first chunk (or error)
    for stream in streams:
        stream.close(cancel=True)
    wait_for(lambda: in_flight(server) == 0, timeout_s=90, interval_s=0.5)
    assert (
        metric_value(server.metrics_url, "trident_requests_aborted_total", model="primary")
        >= aborted + 16
    )
    assert answer(server).output_tokens == 4


# -- a dying engine (last: it leaves primary without an engine) -----------------------------


@pytest.mark.destructive(rank=1)  # after test_router's failure story: see its docstring
def test_a_dead_engine_fails_requests_fast_and_reports_unhealthy(server):
    healthy = lambda: metric_value(  # noqa: E731
        server.metrics_url,
        "trident_engine_healthy",
        model="primary",
    )
    wait_for(lambda: healthy() == 1, timeout_s=30)
    # What the server counts in flight before: test_router's failure story SIGKILLs
    # primary's stub mid-stream, and a killed stub never takes its requests off the
    # gauge (the series outlives the instance), so this test counts only its own.
    before = in_flight(server)
    cores = engine_cores(server, "primary")
    assert cores, "no vLLM EngineCore process found"
    in_flight_stream = Stream(server, long_inputs(max_tokens=900))
    assert in_flight_stream.next()
    for core in cores:
        core.kill()
    in_flight_stream.finish(timeout_s=60)  # ends: error, then the final flag
    in_flight_stream.close()
    assert in_flight_stream.finals == 1 and in_flight_stream.errors
    assert not in_flight_stream.errors[-1].startswith("invalid request")
    wait_for(lambda: healthy() == 0, timeout_s=30)
    after = Stream(server, build_inputs("Say hi.", None, 4, True, GREEDY))
    after.finish(timeout_s=60)  # fails, does not hang
    after.close()
    assert after.finals == 1 and len(after.errors) == 1
    assert after.errors[0].startswith("vllm engine is dead: "), after.errors
    wait_for(lambda: in_flight(server) == before, timeout_s=30)
    assert server.http_get("/v2/health/ready") == 200


class _WatchedUntil:
    """The server as a keeper sees it until `done` is set: then its process reads as
    exited, so keep_serving returns, and the shared server serves the tests after this
    one without a keeper reloading what they kill."""

    def __init__(self, server, done: threading.Event):
        self._server, self._done = server, done
        self.process = self

    def __getattr__(self, name):  # http_url, admin_headers, ready_models, stub_models
        return getattr(self._server, name)

    @property
    def pid(self) -> int:
        return self._server.process.pid

    def wait(self, timeout=None):
        if self._done.is_set():
            return 0
        return self._server.process.wait(timeout)


@pytest.mark.destructive(rank=1)  # after test_router's failure story: see its docstring
def test_trident_serve_reloads_the_model_whose_engine_died(server):
    """After the test above primary's stub lives on with a dead engine (the health gauge
    reads 0): the keeper of `trident serve` reloads primary alone, and it answers again
    from a fresh engine, in the same tritonserver."""
    pid, lines, done = server.process.pid, [], threading.Event()
    keeper_thread = threading.Thread(
        target=keeper.keep_serving, args=(_WatchedUntil(server, done), lines.append), daemon=True
    )  # returns when done is set (or the server stops)
    keeper_thread.start()
    try:
        started = time.monotonic()
        wait_for(lambda: any("is back" in line for line in lines), timeout_s=240, interval_s=0.5)
        print(
            f"primary reloaded {time.monotonic() - started:.1f} s after the keeper started: "
            + " | ".join(lines)
        )
    finally:
        done.set()
        keeper_thread.join(30)
    assert not keeper_thread.is_alive()
    assert lines[0].startswith(
        "trident serve: the engine of model 'primary' died "
        "(trident_engine_healthy is 0); reloading it in "
    )
    assert answer(server).output_tokens == 4
    assert answer(server, model="router").output_tokens == 4
    assert server.process.pid == pid and server.process.poll() is None
