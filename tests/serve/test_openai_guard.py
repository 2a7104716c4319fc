"""The frontend's bounds on a connection (builder/serve/openai/guard.py), over a real
uvicorn on a loopback port with a stand-in Triton: too many connections, slow or huge
headers, and a body that never comes each get an HTTP answer in words and a closed
connection, before the app (and its key check) sees anything; a normal request beside
them is served. The flood against `trident serve`: tests/server/test_restricted_api.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from contextlib import ExitStack, contextmanager

import pytest

from builder.serve.openai.guard import LINGER_S, RESERVED_FDS, connection_cap, refusal
from builder.serve.openai.limits import Limits
from builder.serve.openai.runner import _config
from builder.serve.openai.tensors import ModelInfo, Piece
from builder.serve.server import free_port
from tests.helpers.servers import running_uvicorn

TIMEOUT_S = 1.0


class SlowCall:
    """An answer of five pieces over about a second."""

    async def batches(self):
        for n in range(5):
            await asyncio.sleep(0.2)
            yield [Piece(f" w{n}", "stop" if n == 4 else None, 3, n + 1)]

    def finish(self):
        pass

    def cancel(self):
        pass


class StandInTriton:
    """Enough Triton for /health and a slow streamed answer from `router`."""

    async def models(self, fresh: bool = False):
        return {}

    async def info(self, model):
        return ModelInfo(model, {"messages": "TYPE_STRING"}, False)

    def stream(self, generation, info):
        return SlowCall()

    async def close(self):
        pass


@contextmanager
def frontend(limits: Limits):
    port = free_port()
    config = _config("unused", "127.0.0.1", port, None, ("router",), limits, triton=StandInTriton())
    with running_uvicorn(config):
        yield port


def answer(sock: socket.socket, timeout_s: float = 10.0) -> tuple[int, dict, dict]:
    """Read one whole answer up to the server's close: (status, headers, JSON body)."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def health(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        return answer(sock)[0]


LIMITS = Limits(
    max_connections=20, max_header_bytes=8192, header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S
)


def test_headers_that_do_not_arrive_in_time_are_a_408_and_a_close():
    with frontend(LIMITS) as port, socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # and no more
        started = time.monotonic()
        status, headers, body = answer(slow)
        assert status == 408 and headers["connection"] == "close"
        assert body["error"] == {
            "message": f"the request headers did not arrive within {TIMEOUT_S:g} s",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
        assert TIMEOUT_S * 0.9 < time.monotonic() - started < TIMEOUT_S + 5
        assert health(port) == 200


def test_a_connection_that_sends_nothing_is_closed_too():
    with frontend(LIMITS) as port, socket.create_connection(("127.0.0.1", port)) as idle:
        assert answer(idle)[0] == 408


def test_a_body_that_does_not_arrive_in_time_is_a_408():
    with frontend(LIMITS) as port, socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b'\r\ncontent-length: 100\r\n\r\n{"model": '
        )
        status, _, body = answer(slow)
        assert status == 408
        assert body["error"]["message"] == f"the request body did not arrive within {TIMEOUT_S:g} s"


@pytest.mark.parametrize("how", ["one header", "many headers", "a long URL"])
def test_headers_over_the_limit_are_a_431_before_they_are_held(how):
    big = b"x" * 4096
    request = {
        "one header": b"GET /health HTTP/1.1\r\nx-big: " + big * 64 + b"\r\n\r\n",
        "many headers": b"GET /health HTTP/1.1\r\n"
        + b"".join(b"x-h%d: " % i + big[:200] + b"\r\n" for i in range(100))
        + b"\r\n",
        "a long URL": b"GET /health?" + big * 3 + b" HTTP/1.1\r\n\r\n",
    }[how]
    with frontend(LIMITS) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before all of it was read
        status, _, body = answer(sock)
        assert status == 431
        assert body["error"]["message"] == "the request line and headers are over 8192 bytes"
        assert health(port) == 200


def test_a_header_sent_in_pieces_is_refused_at_the_limit_not_at_its_end():
    with frontend(LIMITS) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nx-big: ")
        refused = False
        for _ in range(64):  # 64 x 1 KiB, never finishing the header
            try:
                sock.sendall(b"y" * 1024)
            except (BrokenPipeError, ConnectionResetError):
                refused = True
                break
            time.sleep(0.005)
        assert answer(sock)[0] == 431 or refused


def test_connections_over_the_cap_get_a_503_in_words_and_the_rest_are_served():
    with frontend(LIMITS) as port, ExitStack() as held:
        flood = [
            held.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(20)
        ]
        for sock in flood:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # half-sent, as a slow client would
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as one_more:
            status, headers, body = answer(one_more)
        assert status == 503 and headers["retry-after"] == "1"
        assert body["error"]["code"] == "server_overloaded"
        assert "limit of 20 open connections" in body["error"]["message"]
        for sock in flood:
            assert answer(sock)[0] == 408  # each slow one, at its deadline
        time.sleep(LINGER_S + 0.5)  # their remaining bytes read and dropped, then closed
        assert health(port) == 200  # their places are free, though they never closed


def test_a_streamed_answer_outlives_the_deadlines():
    """The deadlines stop at the request's last byte: a long answer is not a slow request."""
    limits = Limits(header_timeout_s=0.3, body_timeout_s=0.3)
    body = json.dumps(
        {"model": "router", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    ).encode()
    with frontend(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and b" w4" in data and b"[DONE]" in data, data


def test_a_kept_alive_connection_is_not_a_slow_request():
    limits = Limits(header_timeout_s=0.3, body_timeout_s=0.3)
    with frontend(limits) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(1.0)  # idle past both deadlines, between requests
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data.count(b"HTTP/1.1 200") == 2, data


def test_the_cap_stays_below_the_descriptor_limit():
    assert connection_cap(Limits(max_connections=4096), soft_fd_limit=20000) == 4096
    assert connection_cap(Limits(max_connections=4096), soft_fd_limit=1024) == 1024 - RESERVED_FDS
    assert connection_cap(Limits(max_connections=4096), soft_fd_limit=100) == 1


def test_a_refusal_is_one_closing_http_answer():
    data = refusal(503, "busy", "server_overloaded", retry_after_s=1)
    head, body = data.split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"connection: close" in head and b"retry-after: 1" in head
    assert f"content-length: {len(body)}".encode() in head
    assert json.loads(body)["error"]["type"] == "server_error"
