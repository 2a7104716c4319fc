"""The OpenAI frontend's HTTP behaviour without a model: Triton unreachable, and a
stand-in Triton whose stream fails before and after its first response."""
from __future__ import annotations

import json

from fastapi.testclient import TestClient

from builder.serve.openai.app import create_app
from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.triton import ModelInfo, Piece
from builder.serve.server import free_port

CHAT = {"model": "router", "messages": [{"role": "user", "content": "Hi"}]}


def test_an_unreachable_triton_is_503_in_openai_shape():
    with TestClient(create_app(f"127.0.0.1:{free_port()}")) as client:
        for response in (client.get("/v1/models"),
                         client.post("/v1/chat/completions", json=CHAT)):
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["type"] == "server_error" and "does not answer" in error["message"]
            assert set(error) == {"message", "type", "param", "code"}


class FakeCall:
    def __init__(self, script):
        self.script, self.cancelled, self.finished = script, False, False

    async def pieces(self):
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item

    def finish(self):
        self.finished = True

    def cancel(self):
        self.cancelled = True


class FakeTriton:
    def __init__(self, script):
        self.script, self.calls = script, []

    async def models(self, fresh=False):
        return {"router": ModelInfo("router", {"messages": "TYPE_STRING"}, False)}

    async def info(self, model):
        return (await self.models())["router"]

    def stream(self, generation, info):
        self.calls.append(FakeCall(self.script))
        return self.calls[-1]

    async def close(self):
        pass


def client_for(script):
    triton = FakeTriton(script)
    return TestClient(create_app("unused", triton)), triton


def events(response) -> list:
    return [line[len("data: "):] for line in response.text.split("\n\n") if line]


def test_a_failure_mid_stream_is_an_error_event_then_done():
    broken = OpenAIError(500, "router: smollm2 failed mid-stream: boom", "server_error")
    client, triton = client_for([Piece("Hel", None, 3, 1, "smollm2"), Piece("lo", None, 3, 2),
                                 broken])
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["x-trident-served-by"] == "smollm2"
    data = events(response)
    assert data[-1] == "[DONE]"
    assert [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:2]] == \
        ["Hel", "lo"]
    assert json.loads(data[2])["error"]["message"].endswith("boom")


def test_a_failure_before_the_first_response_keeps_its_status():
    refused = OpenAIError(400, "min_p must be in [0, 1]", param="min_p")
    for stream in (False, True):
        client, triton = client_for([refused])
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "min_p"


def test_a_stream_without_a_finish_reason_is_a_backend_error():
    client, _ = client_for([Piece("Hel", None, 3, 1)])
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 502 and response.json()["error"]["type"] == "server_error"
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert "error" in json.loads(events(response)[1])


def test_a_finished_answer_hands_the_call_over_and_never_cancels_it():
    client, triton = client_for([Piece("Hi", None, 3, 1), Piece("", "stop", 3, 2)])
    whole = client.post("/v1/chat/completions", json=CHAT).json()
    assert whole["choices"][0]["message"]["content"] == "Hi"
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert events(response)[-1] == "[DONE]"
    assert all(call.finished and not call.cancelled for call in triton.calls)


def test_unknown_paths_and_bad_json_answer_in_openai_shape():
    client, _ = client_for([])
    assert client.get("/v1/nothing").json()["error"]["type"] == "invalid_request_error"
    response = client.post("/v1/completions", content=b"[", headers={
        "Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
