"""The OpenAI frontend's HTTP behaviour without a model: Triton unreachable, and a
stand-in Triton whose stream fails before and after its first response."""

from __future__ import annotations

import asyncio
import json

from fastapi.testclient import TestClient
from starlette.requests import Request

from builder.serve.openai import choices
from builder.serve.openai.answers import Answer
from builder.serve.openai.app import create_app
from builder.serve.openai.choices import _events, _Feed
from builder.serve.openai.draining import DrainGate
from builder.serve.openai.errors import OpenAIError, model_not_found
from builder.serve.openai.limits import Limits
from builder.serve.openai.protocol import parse_chat
from builder.serve.openai.tensors import ModelInfo, Piece
from builder.serve.server import free_port

CHAT = {"model": "router", "messages": [{"role": "user", "content": "Hi"}]}


def test_an_unreachable_triton_is_503_in_openai_shape():
    with TestClient(create_app(f"127.0.0.1:{free_port()}")) as client:
        for response in (client.get("/v1/models"), client.post("/v1/chat/completions", json=CHAT)):
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["type"] == "server_error" and "does not answer" in error["message"]
            assert set(error) == {"message", "type", "param", "code"}


class FakeCall:
    """A script of Pieces, batches of Pieces (lists: what arrived together) and errors."""

    def __init__(self, script):
        self.script, self.cancelled, self.finished = script, False, False
        self.abandoned = False

    async def batches(self):
        for item in self.script:
            if isinstance(item, Exception):
                raise item
            yield item if isinstance(item, list) else [item]

    async def pieces(self):
        async for batch in self.batches():
            for piece in batch:
                yield piece

    def finish(self):
        self.finished = True

    def cancel(self):
        self.cancelled = True

    def abandon(self):
        self.abandoned = True


class FakeTriton:
    """Triton with `router` and the engine model `smollm2` behind it, both READY."""

    def __init__(self, script):
        self.script, self.calls, self.streamed = script, [], []

    async def models(self, fresh=False):
        inputs = {
            "messages": "TYPE_STRING",
            "text_input": "TYPE_STRING",
            "sampling_parameters": "TYPE_STRING",
        }
        return {name: ModelInfo(name, inputs, False) for name in ("router", "smollm2")}

    async def info(self, model):
        found = (await self.models()).get(model)
        if found is None:
            raise model_not_found(model)
        return found

    def stream(self, generation, info):
        self.streamed.append((info.name, generation))
        self.calls.append(FakeCall(self.script))
        return self.calls[-1]

    async def close(self):
        pass


def client_for(script, **options):
    triton = FakeTriton(script)
    return TestClient(create_app("unused", triton, **options)), triton


def events(response) -> list:
    return [line[len("data: ") :] for line in response.text.split("\n\n") if line]


def test_a_failure_mid_stream_is_an_error_event_then_done():
    broken = OpenAIError(500, "router: smollm2 failed mid-stream: boom", "server_error")
    client, triton = client_for(
        [Piece("Hel", None, 3, 1, "smollm2"), Piece("lo", None, 3, 2), broken]
    )
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["x-trident-served-by"] == "smollm2"
    data = events(response)
    assert data[-1] == "[DONE]"
    assert [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:2]] == ["Hel", "lo"]
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


def test_a_stream_that_ends_before_any_response_is_a_502_not_a_200():
    """One path for one choice and for n (choices.py): a call that ended with no
    response at all was a 200 stream holding only an error event on the one-choice path
    (app.py's own, before); now, as for n, the status says it before the stream starts."""
    for n in (1, 2):
        client, _ = client_for([])
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "n": n})
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "backend_error"


def test_a_client_gone_before_the_events_begin_cancels_every_choice():
    """The n-choice path handed its SSE response no way to stop the calls when the
    client left before the body's first write (the events' own cleanup never runs
    then); now respond() gives the response the feed's close as its on_leave."""

    class Client:  # the ASGI side of a client that leaves once the answer starts
        def __init__(self):
            self.started = asyncio.Event()

        async def receive(self):
            await self.started.wait()
            return {"type": "http.disconnect"}

        async def send(self, message):
            self.started.set()
            await asyncio.sleep(3600)  # the headers' write never ends: the client left

    async def scenario():
        triton, client = FakeTriton([Piece("a", None, 1, 1)]), Client()
        request = Request({"type": "http"}, client.receive)
        generation = parse_chat({**CHAT, "stream": True, "n": 2})
        info = (await triton.models())["router"]
        response = await choices.respond(triton, request, generation, info, DrainGate())
        await response({"type": "http"}, client.receive, client.send)
        return triton.calls

    calls = asyncio.run(scenario())
    assert len(calls) == 2 and all(call.cancelled for call in calls)


def test_a_finished_answer_hands_the_call_over_and_never_cancels_it():
    client, triton = client_for([Piece("Hi", None, 3, 1), Piece("", "stop", 3, 2)])
    whole = client.post("/v1/chat/completions", json=CHAT).json()
    assert whole["choices"][0]["message"]["content"] == "Hi"
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert events(response)[-1] == "[DONE]"
    assert all(call.finished and not call.cancelled for call in triton.calls)


def test_a_batch_is_one_event_and_the_end_leaves_with_the_last_text():
    # Before: one event per response, and the finish reason, the usage and [DONE] each
    # in a write of their own.
    script = [
        [Piece("Hel", None, 3, 1, "smollm2"), Piece("lo", None, 3, 2)],
        Piece(",", None, 3, 3),
        [Piece(" wor", None, 3, 4), Piece("ld", "stop", 3, 5)],
    ]
    client, triton = client_for(script)
    response = client.post(
        "/v1/chat/completions",
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = [json.loads(d) for d in events(response)[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
        {"role": "assistant", "content": "Hello"},
        {"content": ","},
        {"content": " world"},
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["usage"]["completion_tokens"] == 5

    async def writes():
        call = FakeCall(script)
        feed = _Feed([call], "router")
        await feed.start()
        answer = Answer(parse_chat({**CHAT, "stream": True}))
        return [out async for out in _events(answer, feed)], call

    out, call = asyncio.run(writes())
    assert len(out) == 3 and out[-1].endswith(b"data: [DONE]\n\n")
    assert b'" world"' in out[-1] and b'"finish_reason": "stop"' in out[-1]
    assert call.finished and not call.cancelled


def test_unknown_paths_and_bad_json_answer_in_openai_shape():
    client, _ = client_for([])
    assert client.get("/v1/nothing").json()["error"]["type"] == "invalid_request_error"
    response = client.post(
        "/v1/completions", content=b"[", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


ANSWER = [Piece("Hi", "stop", 1, 1, "smollm2")]


def test_only_the_router_is_listed_and_served_by_default():
    # Before: /v1/models listed smollm2, and `model: smollm2` went straight to the
    # engine model, past the router's tenant admission, limits and cache salt.
    client, triton = client_for(ANSWER)
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["router"]
    hidden = client.post("/v1/chat/completions", json={**CHAT, "model": "smollm2"})
    absent = client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert hidden.status_code == absent.status_code == 404
    # The same answer as for a model that does not exist: nothing tells them apart.
    assert hidden.json()["error"]["code"] == absent.json()["error"]["code"] == "model_not_found"
    assert hidden.text.replace("smollm2", "nope") == absent.text
    assert "router" not in hidden.text
    assert client.get("/v1/models/smollm2").status_code == 404
    assert (
        client.post("/v1/completions", json={"model": "smollm2:x", "prompt": "Hi"}).status_code
        == 404
    )
    assert client.get("/v1/models/router").json()["id"] == "router"
    assert not triton.calls
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert [name for name, _ in triton.streamed] == ["router"]


def test_an_allow_list_exposes_exactly_the_models_it_names():
    client, triton = client_for(ANSWER, expose=("smollm2", "absent"))
    # Listed: exposed and READY; `absent` is exposed but not loaded.
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smollm2"]
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 404
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "smollm2"}).status_code == 200
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "absent"}).status_code == 404


def test_model_colon_adapter_names_an_adapter_of_an_exposed_model():
    client, triton = client_for(ANSWER)
    whole = client.post("/v1/chat/completions", json={**CHAT, "model": "router:support"})
    assert whole.status_code == 200 and whole.json()["model"] == "router:support"
    name, generation = triton.streamed[-1]
    assert (name, generation.lora_name) == ("router", "support")
    client.post("/v1/chat/completions", json={**CHAT, "lora_name": "legal"})
    assert triton.streamed[-1][1].lora_name == "legal"
    both = client.post(
        "/v1/chat/completions", json={**CHAT, "model": "router:support", "lora_name": "legal"}
    )
    assert both.status_code == 400 and both.json()["error"]["param"] == "lora_name"


def test_max_tokens_above_the_models_context_is_400_naming_the_field():
    client, triton = client_for(ANSWER, limits=Limits(context_tokens={"router": 2048}))
    for field in ("max_tokens", "max_completion_tokens"):
        response = client.post("/v1/chat/completions", json={**CHAT, field: 2049})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == field
        assert "2048" in response.json()["error"]["message"]
    assert not triton.calls
    assert client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2048}).status_code == 200


def test_an_unknown_body_field_is_400_on_both_endpoints_and_the_next_request_is_served():
    # Issue 34: unknown fields were taken and ignored without a word.
    client, triton = client_for(ANSWER)
    prompt = {"model": "router", "prompt": "Hi"}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", prompt)):
        response = client.post(path, json={**body, "max_toknes": 5})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "max_toknes" and error["code"] == "unknown_parameter"
        assert "unknown" in error["message"] and "\n" not in error["message"]
        assert client.post(path, json={**body, "max_tokens": 5}).status_code == 200
    assert len(triton.calls) == 2  # the refused ones never reached Triton
