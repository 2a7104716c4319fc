"""The OpenAI frontend's drain (builder/serve/openai/draining.py) without a model: /health
and new work refused in words while the answers in flight go on, and cut_off() ending
what still runs with one `server_shutdown` error event. The streams are the real
triton.Call reading a stand-in gRPC call that the test feeds response by response; the
concurrent cases run the real Frontend (uvicorn in its thread) on a free port."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from openai import APIError, APIStatusError, OpenAI
from tritonclient.grpc import service_pb2

from builder.serve.openai.app import create_app
from builder.serve.openai.draining import RETRY_AFTER_S, DrainGate
from builder.serve.openai.errors import OpenAIError, model_not_found, server_shutdown
from builder.serve.openai.protocol import parse_chat
from builder.serve.openai.runner import DrainingServer, Frontend, finish_drain
from builder.serve.openai.tensors import ModelInfo
from builder.serve.openai.triton import Triton
from builder.serve.server import free_port
from tests.serve.test_openai_app import CHAT, FakeTriton
from tests.serve.test_openai_chunk_path import response

ROUTER = ModelInfo(
    "router",
    {
        "messages": "TYPE_STRING",
        "text_input": "TYPE_STRING",
        "stream": "TYPE_BOOL",
        "sampling_parameters": "TYPE_STRING",
    },
    False,
)
COMPLETION = {"model": "router", "prompt": "Hi"}
# A frontend that failed to end a stream leaves its client waiting: every wait here is
# bounded, so such a failure is a failed test, not a hung run.
pytestmark = pytest.mark.timeout(60)


def token(text: str, finish: str = "", count: int = 1):
    return service_pb2.ModelStreamInferResponse(
        infer_response=response(
            text_output=text,
            finish_reason=finish,
            num_input_tokens=3,
            num_output_tokens=count,
            served_by="smollm2",
        )
    )


class Wire:
    """grpc.aio's ModelStreamInfer call: the responses queued at its start, then those
    the test sends from its own thread; it waits for the next one like a real call."""

    def __init__(self, first: list):
        self.loop = asyncio.get_running_loop()  # opened on the frontend's loop
        self.queue: asyncio.Queue = asyncio.Queue()
        for message in first:
            self.queue.put_nowait(message)
        self.cancelled = False

    async def read(self):
        return await self.queue.get()

    def send(self, message) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, message)

    def cancel(self) -> None:
        self.cancelled = True


class StandIn(Triton):
    """Triton with `router` READY; each stream starts with `first` and then waits."""

    def __init__(self, first: tuple = ()):
        super().__init__("stand-in:1")
        self.first, self.wires = list(first or [token("Hel")]), []

    async def models(self, fresh=False):
        return {"router": ROUTER}

    async def info(self, model):
        if model != "router":
            raise model_not_found(model)
        return ROUTER

    def open_stream(self, request):
        self.wires.append(Wire(self.first))
        return self.wires[-1]

    def _keep_draining(self, call, timeout_s=None) -> None:
        pass  # nothing to read after the finish reason


def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def frontend():
    triton = StandIn()
    with Frontend("stand-in:1", port=free_port(), triton=triton) as running:
        yield running, triton


def data_lines(answer: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in answer.iter_lines() if line]


# -- refused in words -------------------------------------------------------------------------


def test_health_is_503_at_the_next_request_and_liveness_stays_200():
    app = create_app("unused", FakeTriton([]))
    with TestClient(app) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/health/live").json() == {"status": "ok"}
        app.state.drain.start()
        health = client.get("/health")
        assert (health.status_code, health.json()) == (503, {"status": "draining"})
        live = client.get("/health/live")  # Kubernetes' liveness probe: never the drain
        assert (live.status_code, live.json()) == (200, {"status": "ok"})


def refused(answer: httpx.Response) -> None:
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == str(RETRY_AFTER_S) == "5"
    error = answer.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "server_error",
        "server_draining",
        None,
    )
    assert "draining" in error["message"] and "another server" in error["message"]


class Counted(DrainGate):
    """A DrainGate that records every value in_flight takes."""

    def __init__(self):
        self.counts: list[int] = []
        super().__init__()

    @property
    def in_flight(self) -> int:
        return self.counts[-1]

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self.counts.append(value)


def test_new_work_is_a_503_with_retry_after_and_reaches_no_model():
    triton = FakeTriton([])
    app = create_app("unused", triton, api_keys={"k1": "acme"}, drain=Counted())
    client = TestClient(app)
    keyed = {"Authorization": "Bearer k1"}
    app.state.drain.start()
    app.state.drain.start()  # idempotent
    refused(client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=keyed))
    refused(client.post("/v1/completions", json=COMPLETION, headers=keyed))
    refused(client.get("/v1/models", headers=keyed))
    refused(client.get("/v1/models/router", headers=keyed))
    # The drain comes before the key: a caller without one learns only that it drains.
    refused(client.post("/v1/chat/completions", json=CHAT))
    refused(client.get("/v1/models"))
    assert triton.calls == [] and app.state.drain.counts == [0]  # none was admitted
    sdk = OpenAI(base_url="http://testserver/v1", api_key="k1", http_client=client, max_retries=0)
    with pytest.raises(APIStatusError) as caught:
        sdk.chat.completions.create(model="router", messages=CHAT["messages"])
    assert caught.value.status_code == 503 and caught.value.code == "server_draining"


def test_a_pause_refuses_new_work_until_resumed_and_a_drain_outlasts_it():
    # `trident serve` pauses the frontend while it restarts a tritonserver that died.
    from tests.serve.test_openai_app import ANSWER

    app = create_app("unused", FakeTriton(ANSWER))
    gate = app.state.drain
    with TestClient(app) as client:
        gate.pause()
        refused(client.post("/v1/chat/completions", json=CHAT))
        assert client.get("/health").status_code == 503
        gate.resume()
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert client.get("/health").status_code == 200
        gate.pause()
        gate.start()  # a SIGTERM during the restart
        gate.resume()  # the restart ends: the drain goes on
        refused(client.post("/v1/chat/completions", json=CHAT))
        assert client.get("/health").status_code == 503


def test_without_a_drain_nothing_changes():
    from tests.serve.test_openai_app import ANSWER

    triton = FakeTriton(ANSWER)
    app = create_app("unused", triton)
    with TestClient(app) as client:
        for answer in (
            client.post("/v1/chat/completions", json=CHAT),
            client.post("/v1/chat/completions", json={**CHAT, "stream": True}),
            client.post("/v1/completions", json=COMPLETION),
            client.get("/v1/models"),
            client.get("/health"),
        ):
            assert answer.status_code == 200 and "retry-after" not in answer.headers
        assert client.post("/v1/chat/completions", json=CHAT).json()["choices"]
    drain = app.state.drain
    assert (drain.draining, drain.cut, drain.in_flight) == (False, False, 0)
    assert all(call.finished and not call.cancelled for call in triton.calls)


# -- the answers in flight --------------------------------------------------------------------


def test_a_stream_admitted_before_the_drain_finishes_whole(frontend):
    running, triton = frontend
    sdk = OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=5)
    chunks = iter(
        sdk.chat.completions.create(model="router", messages=CHAT["messages"], stream=True)
    )
    assert next(chunks).choices[0].delta.content == "Hel"
    assert running.in_flight == 1
    running.drain()
    with httpx.Client(base_url=running.url, timeout=5) as http:
        assert http.get("/health").status_code == 503
        refused(http.post("/v1/completions", json=COMPLETION))
    with pytest.raises(APIStatusError) as caught:
        sdk.completions.create(model="router", prompt="Hi")
    assert caught.value.status_code == 503
    assert len(triton.wires) == 1 and running.in_flight == 1  # the refused never counted
    triton.wires[0].send(token("lo", count=2))
    triton.wires[0].send(token("!", "stop", count=3))
    rest = list(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in rest) == "lo!"
    assert rest[-1].choices[0].finish_reason == "stop"
    until(lambda: running.in_flight == 0)
    assert not triton.wires[0].cancelled


@pytest.mark.parametrize("n", [1, 2])
def test_cut_off_ends_a_stream_waiting_for_its_token_with_one_shutdown_event(frontend, n):
    running, triton = frontend
    with httpx.Client(base_url=running.url, timeout=5) as http:
        body = {**CHAT, "stream": True, "n": n}
        with http.stream("POST", "/v1/chat/completions", json=body) as answer:
            events = answer.iter_lines()
            assert "Hel" in next(e for e in events if e)
            running.drain()
            running.cut_off()  # from this thread, while the stream waits on Triton
            rest = [e[len("data: ") :] for e in events if e]
    # n = 2: the second choice's first chunk may still be on its way
    rest = [e for e in rest if e == "[DONE]" or "error" in json.loads(e)]
    assert rest[-1] == "[DONE]" and len(rest) == 2
    error = json.loads(rest[0])["error"]
    assert (error["code"], error["type"]) == ("server_shutdown", "server_error")
    assert "stopping" in error["message"] and "drain timeout" in error["message"]
    assert all(wire.cancelled for wire in triton.wires)  # Triton cancels the requests
    until(lambda: running.in_flight == 0)


def test_a_dead_models_answers_in_flight_end_in_words_and_new_ones_still_come(frontend):
    # `trident serve`'s keeper saw the router's stub die: Triton 2.51 would never end
    # these calls. Only that model's calls end; the frontend keeps serving.
    running, triton = frontend
    with httpx.Client(base_url=running.url, timeout=5) as http:
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as a:
            events = a.iter_lines()
            assert "Hel" in next(e for e in events if e)
            running.abandon("another-model")  # not this call's model: nothing ends
            running.abandon("router")
            rest = [e[len("data: ") :] for e in events if e]
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as b:
            assert "Hel" in next(e for e in b.iter_lines() if e)  # a new one is answered
    assert rest[-1] == "[DONE]" and len(rest) == 2
    error = json.loads(rest[0])["error"]
    assert (error["code"], error["type"]) == ("unavailable", "server_error")
    assert "router" in error["message"] and "process died" in error["message"]
    assert triton.wires[0].cancelled and len(triton.wires) == 2
    until(lambda: running.in_flight == 0)


def test_cut_off_ends_a_whole_answer_and_a_request_not_yet_answered(frontend):
    running, triton = frontend
    sdk = OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=5)
    with ThreadPoolExecutor(2) as pool:
        whole = pool.submit(httpx.post, running.url + "/v1/completions", json=COMPLETION, timeout=5)
        streamed = pool.submit(
            lambda: list(sdk.completions.create(model="router", prompt="Hi", stream=True))
        )
        until(lambda: len(triton.wires) == 2 and running.in_flight == 2)
        running.drain()
        running.cut_off()
        answer = whole.result(5)
        with pytest.raises(APIError) as caught:
            streamed.result(5)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutdown"
    assert caught.value.code == "server_shutdown"
    until(lambda: running.in_flight == 0)


def test_a_request_still_arriving_at_cut_off_is_refused_with_server_shutdown(frontend):
    running, triton = frontend
    with socket.create_connection((running.host, running.port), timeout=5) as sock:
        rest = start_slow_completion(sock)
        until(lambda: running.in_flight == 1)  # admitted before the drain
        running.drain()
        running.cut_off()
        assert answer_of(sock, rest).startswith(b"HTTP/1.1 503")
    assert triton.wires == []
    until(lambda: running.in_flight == 0)


def start_slow_completion(sock: socket.socket) -> bytes:
    """A completion's headers and the start of its body; returns the rest of the body."""
    body = json.dumps(COMPLETION).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: frontend\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:5])
    return body[5:]


def answer_of(sock: socket.socket, rest: bytes) -> bytes:
    """The answer once the body's rest is sent: a `server_shutdown` refusal."""
    sock.sendall(rest)
    reply = b""
    while b"server_shutdown" not in reply:
        reply += sock.recv(65536) or pytest.fail(f"closed: {reply!r}")
    return reply


def test_tritons_own_shutdown_error_mid_stream_is_a_server_shutdown_event():
    # What the engine models send when the server's drain times out (error_classes.py).
    ended = service_pb2.ModelStreamInferResponse(
        error_message="server shutdown: the drain timeout ended this request"
    )
    client = TestClient(create_app("unused", StandIn((token("Hel"), ended))))
    data = data_lines(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert data[-1] == "[DONE]" and len(data) == 3
    error = json.loads(data[1])["error"]
    assert (error["code"], error["type"]) == ("server_shutdown", "server_error")
    assert error["message"] == "router: the drain timeout ended this request"
    client = TestClient(create_app("unused", StandIn((ended,))))
    whole = client.post("/v1/completions", json=COMPLETION)
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "server_shutdown"


def test_a_call_cut_off_before_its_reader_began_ends_with_the_error():
    async def scenario():
        triton = StandIn()
        call = triton.stream(parse_chat({**CHAT, "stream": True}), ROUTER)
        call.cut_off(server_shutdown())
        with pytest.raises(OpenAIError) as caught:
            await asyncio.wait_for(call.batches().__anext__(), 5)
        assert caught.value.code == "server_shutdown" and triton.wires[0].cancelled

    asyncio.run(scenario())


# -- `trident openai`'s signals ---------------------------------------------------------------


def draining_server(drain: DrainGate, timeout_s: float = 30.0) -> DrainingServer:
    return DrainingServer(uvicorn.Config(create_app("unused", FakeTriton([]))), drain, timeout_s)


def test_trident_openai_drains_on_sigterm_then_exits_0():
    # No Triton is needed: the answer in flight is a completion whose body still arrives.
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "builder.cli", "openai", "--triton", "127.0.0.1:1"]
        + ["--port", str(port), "--drain-timeout", "0"],
        cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert http.get("/health").json()["error"]["code"] == "triton_unavailable"
                    break
                except httpx.TransportError:
                    assert process.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                rest = start_slow_completion(sock)
                http.get("/health")  # its headers were read before this was answered
                process.send_signal(signal.SIGTERM)
                # Cut off at once (timeout 0), and the server keeps answering for up to 3 s
                # while the completion is in flight.
                until(lambda: http.get("/health").status_code == 503 and process.poll() is None)
                assert http.get("/health").json() == {"status": "draining"}
                refused(http.get("/v1/models"))
                assert answer_of(sock, rest).startswith(b"HTTP/1.1 503")
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_first_signal_drains_until_nothing_is_in_flight_then_exits():
    drain = DrainGate()
    drain.in_flight = 1  # an answer is being sent
    server = draining_server(drain)
    server.handle_exit(signal.SIGTERM, None)
    assert drain.draining and not server.should_exit  # still listening, refusing
    time.sleep(0.3)
    assert not server.should_exit and not drain.cut
    drain.in_flight = 0
    until(lambda: server.should_exit)
    assert drain.cut and not server.force_exit
    assert server._captured_signals == []  # uvicorn raises nothing again: exit 0


def test_a_second_signal_stops_at_once():
    drain = DrainGate()
    drain.in_flight = 1
    server = draining_server(drain)
    server.handle_exit(signal.SIGINT, None)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.force_exit


def test_the_drain_timeout_cuts_off_what_is_left_then_waits_a_moment():
    cut_at = []

    class Recorded(DrainGate):
        def cut_off(self):
            cut_at.append(time.monotonic())
            super().cut_off()

    drain = Recorded()
    drain.in_flight = 1  # never ends
    started = time.monotonic()
    finish_drain(drain, timeout_s=0.2, grace_s=0.2, poll_s=0.01)
    assert drain.cut and 0.2 <= cut_at[0] - started < 1.0
    assert time.monotonic() - cut_at[0] >= 0.2  # the grace for the streams' ends


def test_cut_off_from_another_thread_runs_on_the_apps_loop():
    async def scenario():
        drain = DrainGate()
        drain.bind(asyncio.get_running_loop())
        call = StandIn().stream(parse_chat({**CHAT, "stream": True}), ROUTER)
        drain.track(call)
        batches = call.batches()
        assert [p.text for p in await batches.__anext__()] == ["Hel"]

        def later():
            time.sleep(0.2)  # the loop is asleep by then, waiting for the next token
            drain.cut_off()

        threading.Thread(target=later).start()
        started = time.monotonic()
        with pytest.raises(OpenAIError) as caught:
            await asyncio.wait_for(batches.__anext__(), 5)
        assert caught.value.code == "server_shutdown"
        assert time.monotonic() - started < 2  # woken, not found at the next wake-up

    asyncio.run(scenario())
