"""vllm_backend's clients against the real server: SmolLM2 on real vLLM behind `router`
(deploy/default.yaml plus tenant limits): the session's default_server.

The return_* flags and the outputs they select, over gRPC to the router and the engine
model; streaming with the prompt in the output refused; and the OpenAI frontend with API
keys, asked by the real openai client (401 for a bad key, a tenant over its request limit
gets the router's refusal as a 429).
"""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from builder.serve.client import build_inputs, first_output
from builder.serve.openai.runner import Frontend
from builder.serve.server import free_port
from tests.helpers.streams import Stream

pytestmark = [pytest.mark.vllm]

GREEDY = {"temperature": 0}
FLAGS = ("finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens", "num_output_tokens")
KEYS = {"sk-test-limited": "limited", "sk-test-bob": "bob"}


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


class Recorded(Stream):
    """A stream that also keeps every response's outputs, by name."""

    def __init__(self, *args, **kwargs):
        self.outputs: list[dict] = []
        super().__init__(*args, **kwargs)

    def _absorb(self, result, error, at):
        super()._absorb(result, error, at)
        if error is None:
            names = [o.name for o in result.get_response().outputs]
            values = {name: first_output(result, name) for name in names}
            if values:
                self.outputs.append(values)


def ask(server, model="router", stream=True, flags=None, max_tokens=6, exclude=None):
    inputs = build_inputs(
        "The capital of France is",
        None,
        max_tokens,
        stream,
        GREEDY,
        exclude_input_in_output=exclude,
    )
    for name, value in (flags or {}).items():
        from tritonclient.grpc import InferInput

        tensor = InferInput(f"return_{name}", [1], "BOOL")
        tensor.set_data_from_numpy(np.array([value], dtype=bool))
        inputs.append(tensor)
    recorded = Recorded(server, model=model, raw_inputs=inputs)
    try:
        assert recorded.pump(120), "no final response within 120 s"
        return recorded
    finally:
        recorded.close()


@pytest.mark.parametrize("model", ["router", "smollm2"])
def test_without_flags_the_usual_outputs_with_running_totals(server, model):
    answer = ask(server, model)
    assert not answer.errors and answer.outputs
    usual = {
        "text_output",
        "finish_reason",
        "num_input_tokens",
        "num_output_tokens",
        "served_by",
        "error",
    }
    assert all(set(o) == usual for o in answer.outputs)
    counts = [o["num_output_tokens"] for o in answer.outputs]
    assert counts == sorted(counts) and counts[-1] == 6


@pytest.mark.parametrize("model", ["router", "smollm2"])
def test_flags_select_the_outputs_and_counts_per_response(server, model):
    plain = ask(server, model)
    answer = ask(server, model, flags={name: True for name in FLAGS})
    assert not answer.errors and answer.text == plain.text
    assert all(set(o) == {"text_output", *FLAGS} for o in answer.outputs)
    assert sum(o["num_output_tokens"] for o in answer.outputs) == 6
    steps = [json.loads(o["logprobs"]) for o in answer.outputs]
    assert sum(len(step) for step in steps) == 6
    position = steps[0][0]
    (entry,) = position.values()  # the sampled token's own logprob only
    assert entry["logprob"] <= 0 and entry["decoded_token"]
    assert answer.outputs[-1]["cumulative_logprob"] <= 0
    assert answer.outputs[-1]["finish_reason"] == "length"


def test_a_whole_answer_has_text_output_and_what_was_asked(server):
    answer = ask(
        server,
        "router",
        stream=False,
        exclude=True,
        flags={"num_output_tokens": True, "logprobs": False},
    )
    (only,) = answer.outputs
    assert set(only) == {"text_output", "num_output_tokens"}
    assert only["num_output_tokens"] == 6


def test_streaming_with_the_prompt_in_the_output_is_refused(server):
    for model in ("router", "smollm2"):
        answer = ask(server, model, exclude=False)
        assert answer.errors and "exclude_input_in_output=false" in answer.errors[0]
        assert not answer.texts


@pytest.fixture(scope="module")
def frontend(server):
    with Frontend(server.grpc_url, port=free_port(), api_keys=KEYS) as frontend:
        yield frontend


def client(frontend, key):
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key=key, max_retries=0, timeout=120)


def chat(client):
    return client.chat.completions.create(
        model="router",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        temperature=0,
        extra_body={"tenant": "bob"},
    )  # the key's tenant wins


def test_a_bad_key_is_401(frontend):
    with pytest.raises(openai.AuthenticationError) as error:
        chat(client(frontend, "sk-wrong"))
    assert error.value.status_code == 401 and error.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(frontend, "sk-wrong").models.list()


def test_a_tenant_over_its_limit_gets_429(frontend):
    limited, bob = client(frontend, "sk-test-limited"), client(frontend, "sk-test-bob")
    assert [m.id for m in bob.models.list().data] == ["router"]  # engines not exposed
    for _ in range(2):
        assert chat(limited).choices[0].message.content is not None
    with pytest.raises(openai.RateLimitError) as error:
        chat(limited)
    assert error.value.status_code == 429 and "limited" in str(error.value)
    # Naming the engine model does not get a tenant past its limit (it did: 7 of 7).
    with pytest.raises(openai.NotFoundError):
        limited.chat.completions.create(
            model="smollm2", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert chat(bob).choices[0].finish_reason == "length"  # bob is not limited
