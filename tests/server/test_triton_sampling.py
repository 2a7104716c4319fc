"""The sampling values and the logprobs output for Triton's own clients (HTTP generate,
gRPC streams) of `router` and of the vLLM model, against the session's real server
(SmolLM2 on vLLM). The OpenAI side of the same values: test_openai_conformance.py."""

from __future__ import annotations

import json
import queue

import httpx
import pytest
import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs, first_output

pytestmark = [pytest.mark.server, pytest.mark.vllm]

PROMPT = "The capital of France is"


def sampled_ids(server, prompt: str, tokens: int) -> list[int]:
    """The token ids SmolLM2 generates greedily for prompt, straight from `router` over
    Triton gRPC (its logprobs output names each token's id, the sampled one first)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            "router", build_inputs(prompt, None, tokens, False, {"temperature": 0, "logprobs": 0})
        )
        result, error = answers.get(timeout=120)
        assert error is None, error
        return [int(next(iter(p))) for p in json.loads(first_output(result, "logprobs"))]
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", ["router", "smollm2"])
@pytest.mark.parametrize("stream", [False, True])
def test_triton_http_clients_get_logprobs_beside_the_usual_outputs(default_server, model, stream):
    # Before: the logprobs output came only with vllm_backend's return_* flags, which
    # drop served_by and the running totals.
    path = "generate_stream" if stream else "generate"
    body = {
        "text_input": PROMPT,
        "max_tokens": 4,
        "stream": stream,
        "exclude_input_in_output": True,
        "sampling_parameters": json.dumps({"temperature": 0, "logprobs": 2}),
    }
    response = httpx.post(
        f"{default_server.http_url}/v2/models/{model}/{path}", json=body, timeout=120
    )
    assert response.status_code == 200
    events = (
        [
            json.loads(line[len("data: ") :])
            for line in response.text.splitlines()
            if line.startswith("data: ")
        ]
        if stream
        else [response.json()]
    )
    positions = [p for e in events if e.get("logprobs") for p in json.loads(e["logprobs"])]
    text = "".join(e["text_output"] for e in events)
    assert len(positions) == events[-1]["num_output_tokens"] == 4
    assert "".join(next(iter(p.values()))["decoded_token"] for p in positions) == text
    assert all(2 <= len(p) <= 3 for p in positions)  # the sampled token and 2 best
    assert events[-1]["served_by"] == "smollm2"


@pytest.mark.parametrize(
    "sampling, words",
    [
        ({"n": 2}, "only n=1"),
        ({"logprobs": "many"}, "sampling_parameters.logprobs"),
        ({"logit_bias": {"x": 1}}, "sampling_parameters.logit_bias"),
        ({"seed": 2**70}, "sampling_parameters.seed"),
    ],
)
def test_triton_clients_get_the_engines_refusal_in_words(default_server, sampling, words):
    body = {"text_input": PROMPT, "max_tokens": 2, "sampling_parameters": json.dumps(sampling)}
    response = httpx.post(
        f"{default_server.http_url}/v2/models/router/generate", json=body, timeout=120
    )
    assert response.status_code == 400 and words in response.json()["error"]
