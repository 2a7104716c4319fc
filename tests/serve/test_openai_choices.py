"""Logprobs in OpenAI's shapes and n > 1 as a fan-out (builder/serve/openai/choices.py),
without a model: a stand-in Triton plays the engine's pieces. Every answer is parsed with
the openai SDK's own types."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from builder.serve.openai.answers import LOGPROB_FLOOR, chat_logprobs, completion_logprobs
from builder.serve.openai.app import create_app
from builder.serve.openai.choices import choice_generations
from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.protocol import parse_chat, parse_completion
from builder.serve.openai.tensors import ModelInfo, Piece, build_inputs
from builder.serve.openai.triton import fan_out_parameters, request_of
from tests.serve.test_openai_app import FakeCall, FakeTriton

CHAT = {"model": "router", "messages": [{"role": "user", "content": "Hi"}]}


def position(sampled: tuple, *others: tuple) -> dict:
    """One token's logprobs as the engine model writes them: the sampled token first,
    each (token id, text, logprob, rank)."""
    return {
        str(tid): {"logprob": lp, "rank": rank, "decoded_token": text}
        for tid, text, lp, rank in (sampled, *others)
    }


# "Pa" was sampled at rank 3; "The" and "It" rank above it.
PA = position((5, "Pa", -1.5, 3), (7, "The", -0.2, 1), (9, "It", -0.9, 2))
RIS = position((6, "ris", -0.01, 1), (8, "rm", -5.0, 2))
NEVER = position((4, "é", float("-inf"), 1))


def test_chat_logprobs_name_the_sampled_token_and_the_best_alternatives():
    shaped = chat_logprobs([PA, RIS], top=2)
    first, second = shaped["content"]
    assert (first["token"], first["logprob"], first["bytes"]) == ("Pa", -1.5, [80, 97])
    assert [t["token"] for t in first["top_logprobs"]] == ["The", "It"]
    assert [t["token"] for t in second["top_logprobs"]] == ["ris", "rm"]
    assert chat_logprobs([PA], top=0)["content"][0]["top_logprobs"] == []


def test_an_impossible_token_gets_a_finite_floor_and_utf8_bytes():
    entry = chat_logprobs([NEVER], top=1)["content"][0]
    assert entry["logprob"] == LOGPROB_FLOOR and entry["bytes"] == [195, 169]
    json.dumps(entry, allow_nan=False)  # Starlette writes JSON without NaN or inf


def test_completion_logprobs_are_parallel_lists_with_text_offsets():
    shaped = completion_logprobs([PA, RIS], top=1, offset=4)
    assert shaped["tokens"] == ["Pa", "ris"]
    assert shaped["token_logprobs"] == [-1.5, -0.01]
    assert shaped["text_offset"] == [4, 6]
    # the best token and the sampled one, as OpenAI's legacy API lists them
    assert shaped["top_logprobs"] == [{"The": -0.2, "Pa": -1.5}, {"ris": -0.01}]


def test_logprobs_travel_in_sampling_parameters_and_a_tensor_model_refuses_them():
    info = ModelInfo(
        "router", {"messages": "TYPE_STRING", "sampling_parameters": "TYPE_STRING"}, False
    )
    generation = parse_chat({**CHAT, "logprobs": True, "top_logprobs": 3})
    (sampling,) = [t for t in build_inputs(generation, info) if t.name() == "sampling_parameters"]
    assert generation.logprobs == 3
    # TRT-LLM's ensemble takes one tensor per sampling value and none for logprobs
    ensemble = ModelInfo(
        "ensemble", {"text_input": "TYPE_STRING", "max_tokens": "TYPE_INT32"}, True
    )
    with pytest.raises(OpenAIError) as caught:
        build_inputs(parse_completion({"model": "e", "prompt": "a", "logprobs": 1}), ensemble)
    assert caught.value.status == 400 and caught.value.param == "logprobs"
    assert sampling is not None


def app(script, **options):
    triton = FakeTriton(script)
    return TestClient(create_app("unused", triton, **options)), triton


def piece(text, reason=None, tokens_out=1, logprobs=None):
    return Piece(text, reason, 5, tokens_out, "smollm2", logprobs)


def events(response) -> list:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    assert response.text.rstrip().endswith("data: [DONE]")
    return out


def test_n_whole_is_one_call_per_choice_with_the_seed_moved_on():
    client, triton = app([piece("Par", tokens_out=1), piece("is", "stop", tokens_out=2)])
    with client:
        response = client.post("/v1/chat/completions", json={**CHAT, "n": 3, "seed": 40})
    answer = ChatCompletion.model_validate(response.json())
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert {c.message.content for c in answer.choices} == {"Paris"}
    assert [g.sampling["seed"] for _, g in triton.streamed] == [40, 41, 42]
    # the prompt counted once, the completions of every choice
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (5, 6)
    assert all(call.finished and not call.cancelled for call in triton.calls)


def test_n_streamed_tags_each_choice_and_sums_usage():
    client, triton = app([[piece("Par")], [piece("is", "length", tokens_out=2)]])
    with client:
        response = client.post(
            "/v1/chat/completions",
            json={**CHAT, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
        )
    chunks = [ChatCompletionChunk.model_validate(e) for e in events(response)]
    by_index: dict = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        by_index[choice.index].append(choice)
    for choices in by_index.values():
        assert choices[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in choices) == "Paris"
        assert [c.finish_reason for c in choices if c.finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_streamed_chat_logprobs_ride_with_their_text():
    client, _ = app([piece("Pa", logprobs=[PA]), piece("ris", "stop", 2, [RIS])])
    with client:
        response = client.post(
            "/v1/chat/completions",
            json={**CHAT, "stream": True, "logprobs": True, "top_logprobs": 1},
        )
    chunks = [ChatCompletionChunk.model_validate(e) for e in events(response)]
    tokens = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.token for t in tokens] == ["Pa", "ris"]
    assert [len(t.top_logprobs) for t in tokens] == [1, 1]
    assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices) == "Paris"


def test_whole_completion_logprobs_cover_every_token():
    client, _ = app([piece("Pa", logprobs=[PA]), piece("ris", "stop", 2, [RIS])])
    with client:
        response = client.post(
            "/v1/completions", json={"model": "router", "prompt": "The capital", "logprobs": 2}
        )
    answer = Completion.model_validate(response.json())
    (choice,) = answer.choices
    assert choice.text == "Paris" and choice.logprobs.tokens == ["Pa", "ris"]
    assert choice.logprobs.text_offset == [0, 2]


def test_a_refusal_before_any_choice_answers_keeps_its_status():
    error = OpenAIError(400, "bad", "invalid_request_error", "logit_bias")
    client, triton = app([error])
    with client:
        response = client.post("/v1/chat/completions", json={**CHAT, "n": 2, "stream": True})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "logit_bias"
    # A refusal's siblings are left to end on their own, not cancelled across their own
    # refusal's final flag (Call.abandon; tests/serve/test_openai_batches.py).
    assert all(call.abandoned and not call.cancelled for call in triton.calls)


class SlowCall(FakeCall):
    """Its error comes a moment after its first batch: after every choice started."""

    async def batches(self):
        for item in self.script:
            if isinstance(item, Exception):
                await asyncio.sleep(0.05)
                raise item
            yield [item]


def test_a_failure_after_the_start_is_an_error_event():
    error = OpenAIError(500, "engine died", "server_error")
    client, triton = app([piece("Par"), error])
    triton.stream = lambda generation, info: (
        triton.calls.append(SlowCall(triton.script)) or triton.calls[-1]
    )
    with client:
        response = client.post("/v1/chat/completions", json={**CHAT, "n": 2, "stream": True})
    assert response.status_code == 200
    assert events(response)[-1]["error"]["message"] == "engine died"


@pytest.mark.parametrize(
    "body, n, logprobs",
    [
        ({}, 1, None),
        ({"n": 4}, 4, None),
        ({"n": None}, 1, None),
        ({"logprobs": True}, 1, 0),
        ({"logprobs": False}, 1, None),
        ({"logprobs": True, "top_logprobs": 5}, 1, 5),
        ({"logprobs": True, "top_logprobs": 0, "n": 2}, 2, 0),
        ({"user": "someone@example.com"}, 1, None),
    ],
)
def test_chat_fields_that_were_refused_are_read(body, n, logprobs):
    generation = parse_chat({**CHAT, **body})
    assert (generation.n, generation.logprobs) == (n, logprobs)
    assert "user" not in generation.sampling and "user" not in generation.hints


@pytest.mark.parametrize("logprobs", [0, 3, 5])
def test_completion_logprobs_are_a_count(logprobs):
    generation = parse_completion({"model": "m", "prompt": "a", "logprobs": logprobs})
    assert generation.logprobs == logprobs and not generation.echo


def test_each_choice_gets_its_own_seed_only_when_there_is_one():
    seeded = choice_generations(parse_chat({**CHAT, "n": 3, "seed": 2}))
    assert [g.sampling["seed"] for g in seeded] == [2, 3, 4]
    unseeded = choice_generations(parse_chat({**CHAT, "n": 2}))
    assert len(unseeded) == 2 and all("seed" not in g.sampling for g in unseeded)


def test_the_n_choices_name_one_fan_out_and_a_router_gets_it_as_parameters():
    """Issue 34: the router's tenant gate admits the n calls of one request as one unit;
    it knows them by these request parameters (bls/tenants.py, fan_out_of)."""
    choices = choice_generations(parse_chat({**CHAT, "n": 3}))
    groups = {g.choice[0] for g in choices}
    assert len(groups) == 1 and [g.choice[1] for g in choices] == [0, 1, 2]
    (group,) = groups
    assert (
        len(group) == 32 and choice_generations(parse_chat({**CHAT, "n": 2}))[0].choice[0] != group
    )
    assert choice_generations(parse_chat(CHAT))[0].choice is None  # n = 1: no fan-out
    router = ModelInfo("router", {"messages": "TYPE_STRING", "tenant": "TYPE_STRING"}, False)
    engine = ModelInfo("smollm2", {"messages": "TYPE_STRING"}, False)
    parameters = fan_out_parameters(choices[2], router)
    assert parameters == {"fan_out_group": group, "fan_out_n": 3, "fan_out_index": 2}
    assert fan_out_parameters(choices[2], engine) is None  # no tenant gate there
    request = request_of("router", build_inputs(choices[2], router), "id", parameters)
    assert request.parameters["fan_out_group"].string_param == group
    assert request.parameters["fan_out_n"].int64_param == 3
    assert request.parameters["fan_out_index"].int64_param == 2
    assert not request_of("router", build_inputs(choices[2], router), "id").parameters
