"""The frontend's ASGI and socket layer (asgi.py, coalesce.py): the generation routes
past FastAPI, the streamed answer's writer, and writes joined per loop turn."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from fastapi.testclient import TestClient

from builder.serve.openai.asgi import LaneApp, SSEResponse
from builder.serve.openai.coalesce import CoalescingHTTPProtocol, CoalescingTransport
from builder.serve.openai.runner import _config
from builder.serve.openai.tensors import ModelInfo, Piece
from builder.serve.server import free_port
from tests.helpers.servers import running_uvicorn


class RecordingTransport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True


def test_writes_within_one_loop_turn_leave_as_one_and_none_waits_longer():
    async def scenario():
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"data: first\n\n")
        assert inner.writes == []  # still this turn
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\ndata: first\n\n"]
        transport.write(b"data: second\n\n")
        await asyncio.sleep(0)  # alone: sent in the next turn
        assert inner.writes[1:] == [b"data: second\n\n"]
        transport.pause_reading()  # the rest is the wrapped transport's
        assert inner.paused
        transport.write(b"0\r\n\r\n")
        transport.close()  # the last bytes go before the close
        assert inner.writes[2:] == [b"0\r\n\r\n"] and inner.closed
        await asyncio.sleep(0)
        assert len(inner.writes) == 3

    asyncio.run(scenario())


def test_nothing_is_written_to_a_transport_already_closing():
    async def scenario():
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"data: late\n\n")
        inner.closed = True  # the peer went away meanwhile
        await asyncio.sleep(0)
        assert inner.writes == []

    asyncio.run(scenario())


def test_the_frontend_serves_http_on_the_coalescing_protocol():
    config = _config("127.0.0.1:1", "127.0.0.1", 9, None, ("router",), _limits())
    config.load()
    assert issubclass(config.http_protocol_class, CoalescingHTTPProtocol)


def _limits():
    from builder.serve.openai.limits import Limits

    return Limits()


async def _run_sse(events, sent: list[dict], leave_after: int | None = None, on_leave=None) -> None:
    """SSEResponse over a fake ASGI connection whose client leaves once `leave_after`
    messages were sent (never: None)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def receive():
        return await queue.get()

    async def send(message):
        sent.append(message)
        if len(sent) == leave_after:
            queue.put_nowait({"type": "http.disconnect"})
            await asyncio.sleep(0.01)  # the cancel lands in this send

    await SSEResponse(events, {"X-Test": "1"}, on_leave)({"type": "http"}, receive, send)


def test_a_streamed_answer_is_the_headers_every_chunk_and_the_end():
    sent: list[dict] = []

    async def events():
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"

    asyncio.run(_run_sse(events(), sent))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"x-test"] == b"1"
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m.get("more_body") for m in sent[1:]] == [True, True, False]


def test_a_client_that_leaves_mid_stream_closes_the_answer_quietly():
    sent: list[dict] = []
    closed = []

    async def events():
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(30)  # the next token never comes
            yield b"data: 2\n\n"
        finally:
            closed.append(True)  # choices.py's _events cancels the call here

    left = []

    async def scenario():
        await asyncio.wait_for(_run_sse(events(), sent, 2, lambda: left.append(1)), 5)
        assert asyncio.current_task().cancelling() == 0

    asyncio.run(scenario())
    assert closed == [True] and left == [1]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]


def test_a_client_that_leaves_before_the_first_chunk_still_ends_the_call():
    sent: list[dict] = []
    left = []

    async def events():
        try:  # never started: this finally never runs
            yield b"data: 1\n\n"
        finally:
            left.append("finally")

    asyncio.run(asyncio.wait_for(_run_sse(events(), sent, 1, lambda: left.append(1)), 5))
    assert left == [1]
    assert [m["type"] for m in sent] == ["http.response.start"]


def test_a_disconnect_after_the_last_chunk_cancels_nothing():
    sent: list[dict] = []

    async def events():
        yield b"data: only\n\n"

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()

        async def receive():
            return await queue.get()

        async def send(message):
            sent.append(message)
            if not message.get("more_body", True):
                queue.put_nowait({"type": "http.disconnect"})  # as uvicorn does then
                await asyncio.sleep(0.01)

        await SSEResponse(events(), {})({"type": "http"}, receive, send)
        await asyncio.sleep(0.01)
        return "finished"

    assert asyncio.run(scenario()) == "finished"
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_a_lane_takes_its_post_path_and_fastapi_keeps_the_rest():
    app = LaneApp()
    seen = []

    async def lane(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"lane"})

    @app.get("/v1/x")
    async def get_x():
        return {"route": "fastapi"}

    app.lane("/v1/x", lane)
    client = TestClient(app)
    assert client.post("/v1/x").content == b"lane"
    assert client.get("/v1/x").json() == {"route": "fastapi"}
    assert client.post("/v1/y").status_code == 404
    assert seen == ["/v1/x"]


class HangingCall:
    """One response, then nothing until cancelled (an engine that stalls)."""

    def __init__(self):
        self.cancelled = self.finished = False

    async def batches(self):
        yield [Piece("Hel", None, 3, 1)]
        await asyncio.sleep(60)
        yield [Piece("lo", "stop", 3, 2)]

    def finish(self):
        self.finished = True

    def cancel(self):
        self.cancelled = True


class HangingTriton:
    def __init__(self):
        self.calls: list[HangingCall] = []

    async def info(self, model):
        return ModelInfo(model, {"messages": "TYPE_STRING"}, False)

    def stream(self, generation, info):
        self.calls.append(HangingCall())
        return self.calls[-1]

    async def close(self):
        pass


def test_over_real_uvicorn_a_stream_starts_and_a_client_leaving_cancels_the_call():
    triton = HangingTriton()
    port = free_port()
    config = _config("unused", "127.0.0.1", port, None, ("router",), _limits(), triton=triton)
    with running_uvicorn(config):
        body = json.dumps(
            {"model": "router", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            seen = b""
            while b'"content": "Hel"' not in seen:
                data = client.recv(65536)
                assert data, seen
                seen += data
            assert seen.startswith(b"HTTP/1.1 200") and b"text/event-stream" in seen
        deadline = time.monotonic() + 10  # the client left: the call is cancelled
        while not triton.calls[0].cancelled:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not triton.calls[0].finished
