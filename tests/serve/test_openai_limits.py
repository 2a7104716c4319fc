"""The OpenAI frontend's request limits at the ASGI level: what it reads of a body it
refuses. The client here is a plain ASGI `receive` that counts what the app asks for,
so "nothing read" is observed, not inferred."""

from __future__ import annotations

import asyncio
import json

import pytest

from builder.serve.openai.app import create_app
from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.limits import Limits, check_body_json
from builder.serve.openai.repository import context_tokens
from builder.serve.openai.runner import with_repository
from builder.serve.openai.tensors import Piece
from tests.serve.test_openai_app import CHAT, FakeTriton

KEY = "sk-limits-0123"
CHUNK = 64 * 1024


class Client:
    """One request: headers, then the body in the chunks given; then a client that
    stays connected (receive blocks) as a real one would while waiting."""

    def __init__(self, chunks, more_after=False):
        self.chunks, self.more_after = list(chunks), more_after
        self.received = 0  # body bytes handed to the app
        self.calls = 0  # receive() calls that returned body

    async def receive(self):
        if self.chunks:
            chunk = self.chunks.pop(0)
            self.calls += 1
            self.received += len(chunk)
            return {
                "type": "http.request",
                "body": chunk,
                "more_body": bool(self.chunks) or self.more_after,
            }
        await asyncio.Event().wait()


def post(app, client: Client, headers: dict, path="/v1/chat/completions"):
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 9000),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent = []

    async def send(message):
        sent.append(message)

    async def run():
        await asyncio.wait_for(app(scope, client.receive, send), 10)

    asyncio.run(run())
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body) if body.startswith(b"{") else body


def app(limits=Limits(), keys=None):
    return create_app("unused", FakeTriton([Piece("Hi", "stop", 1, 1)]), keys, limits=limits)


def test_a_wrong_key_or_a_declared_length_over_the_limit_reads_no_byte_of_the_body():
    # Before: the whole body was read and parsed first (400 MB: RSS 84 -> 870 MB).
    huge = {"content-type": "application/json", "content-length": str(400 * 2**20)}
    client = Client([b"x" * CHUNK] * 4, more_after=True)
    status, body = post(
        app(keys={KEY: "alice"}), client, {**huge, "authorization": "Bearer sk-wrong"}
    )
    assert status == 401 and client.received == 0
    status, body = post(
        app(keys={KEY: "alice"}), client, {**huge, "authorization": f"Bearer {KEY}"}
    )
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert "4194304" in body["error"]["message"]
    assert client.received == 0


def test_a_chunked_body_is_read_no_further_than_the_limit():
    # 200 chunks of 64 KiB (12.5 MiB) without a Content-Length; the limit is 1 MiB.
    limits = Limits(max_body_bytes=2**20)
    client = Client([b" " * CHUNK] * 200)
    status, body = post(app(limits), client, {"content-type": "application/json"})
    assert status == 413
    assert client.received <= limits.max_body_bytes + CHUNK
    assert client.calls == limits.max_body_bytes // CHUNK + 1
    # A body of exactly the limit, in pieces, is served.
    raw = json.dumps(CHAT).encode()
    client = Client([raw[:10], raw[10:]])
    status, body = post(
        app(Limits(max_body_bytes=len(raw))),
        client,
        {"content-type": "application/json", "content-length": str(len(raw))},
    )
    assert status == 200 and body["choices"][0]["message"]["content"] == "Hi"


@pytest.mark.parametrize("length", ["12abc", "\u00b2"])  # ² is a digit to str.isdigit
def test_a_length_that_is_not_a_number_is_400(length):
    status, body = post(app(), Client([b"{}"]), {"content-length": length})
    assert status == 400 and body["error"]["code"] == "invalid_header"


def test_deep_nesting_is_400():
    # Before: any depth the parser took was accepted (unknown fields are ignored).
    deep = {**CHAT, "metadata": json.loads("[" * 40 + "]" * 40)}
    raw = json.dumps(deep).encode()
    status, body = post(app(), Client([raw]), {"content-length": str(len(raw))})
    assert status == 400 and body["error"]["code"] == "invalid_json"
    assert "16" in body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(path):
    """Issue 34: `"\\ud800"` is valid JSON but not text; the tokenizer's own TypeError
    reached the client as a 500 with `param: null`."""
    if path == "/v1/chat/completions":
        raw = b'{"model": "router", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
        where = "messages[0].content"
    else:
        raw = b'{"model": "router", "prompt": "\\udfff hi"}'
        where = "prompt"
    status, body = post(app(), Client([raw]), {"content-length": str(len(raw))}, path)
    assert status == 400 and body["error"]["param"] == where
    assert "lone UTF-16 surrogate" in body["error"]["message"]
    good = json.dumps({"model": "router", "prompt": "h\u00e9 \U0001f600"}).encode()
    status, _ = post(app(), Client([good]), {"content-length": str(len(good))}, "/v1/completions")
    assert status == 200  # a pair (an emoji) and any other text pass


def test_check_body_json_counts_arrays_and_objects():
    check_body_json({"a": [{"b": 1}]}, 3)
    with pytest.raises(OpenAIError):
        check_body_json({"a": [{"b": []}]}, 3)
    check_body_json("text", 1)
    check_body_json([1, 2, "x" * 10], 1)


def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))


def test_context_lengths_come_from_the_repositorys_model_json(tmp_path):
    write(tmp_path / "small" / "1" / "model.json", {"model": "/m", "max_model_len": 512})
    write(tmp_path / "big" / "1" / "model.json", {"model_path": "/m", "context_length": 4096})
    write(tmp_path / "unset" / "1" / "model.json", {"model": "/m"})
    write(tmp_path / "broken" / "1" / "model.json", "{not json")
    write(tmp_path / "router" / "1" / "router.json", {"backends": {"small": {}, "big": {}}})
    write(tmp_path / "other" / "1" / "router.json", {"backends": {"small": {}, "unset": {}}})
    assert context_tokens(tmp_path) == {"small": 512, "big": 4096, "router": 4096}
    assert context_tokens(tmp_path / "absent") == {}
    # The frontend built on that repository refuses more than the router's context.
    limits = with_repository(Limits(), tmp_path)
    status, body = post(
        create_app("unused", FakeTriton([Piece("Hi", "stop", 1, 1)]), limits=limits),
        Client([json.dumps({**CHAT, "max_tokens": 4097}).encode()]),
        {},
    )
    assert status == 400 and body["error"]["param"] == "max_tokens"
