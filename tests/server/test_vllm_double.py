"""trident's real vLLM model on the paced AsyncLLM double (support/vllm_double.py), in a
real tritonserver: what bench/gpu_rate.py stands on. The double must be what the stub's
`import vllm` gets (through EXECUTION_ENV_PATH), answer at the configured pace, direct and
through the router, and take a new rate from its control file without a reload.
Lower bounds on time only: a busy machine can make the double later, never sooner."""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs, first_output
from support.grpc_stream import generate
from support.pacing import Rate
from support.vllm_double import write_rate
from tests.server.configs import VLLM_DOUBLE_MODEL as MODEL
from tests.server.configs import VLLM_DOUBLE_PACE, double_rate_file

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def paced(vllm_double_server):
    """The session's vllm_double_server (tests/server/configs.py) and its rate file."""
    return vllm_double_server, double_rate_file(vllm_double_server)


@pytest.mark.parametrize("model", [MODEL, "router"])
def test_the_vllm_model_streams_at_the_doubles_pace(paced, model):
    server, _ = paced
    result = generate(
        server.grpc_url,
        model,
        prompt="go",
        max_tokens=20,
        sampling={"temperature": 0, "ignore_eos": True},
    )
    assert not result.errors, result.errors
    assert result.output_tokens == 20 and result.finish_reason == "length"
    assert result.text == "".join(f" w{i}" for i in range(20))  # the double's words
    assert result.ttft_s >= 0.2 and result.served_by == MODEL


def test_a_new_rate_applies_to_the_next_request(paced):
    server, control = paced
    write_rate(control, Rate(ttft_s=0.5, tokens_per_s=1000))
    result = generate(server.grpc_url, MODEL, prompt="go", max_tokens=50)
    assert not result.errors and result.output_tokens == 50
    assert result.ttft_s >= 0.5


def _stream_all(url: str, model: str, count: int, max_tokens: int, per_response: bool):
    """`count` concurrent streams; each one's responses as (text, num_output_tokens,
    final), read until 0.3 s after its final flag (a second one would show)."""

    def one(_):
        client, got = grpcclient.InferenceServerClient(url), queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        inputs = build_inputs(
            prompt="go", max_tokens=max_tokens, sampling={"temperature": 0, "ignore_eos": True}
        )
        if per_response:  # vllm_backend's dialect: counts per response
            flag = grpcclient.InferInput("return_num_output_tokens", [1], "BOOL")
            flag.set_data_from_numpy(np.array([True]))
            inputs.append(flag)
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        responses, deadline = [], None
        try:
            while deadline is None or time.monotonic() < deadline:
                try:
                    result, error = got.get(timeout=60 if deadline is None else 0.3)
                except queue.Empty:
                    break
                assert error is None, error
                final = result.get_response().parameters["triton_final_response"].bool_param
                responses.append(
                    (
                        first_output(result, "text_output") or "",
                        int(first_output(result, "num_output_tokens") or 0),
                        final,
                    )
                )
                if final and deadline is None:
                    deadline = time.monotonic() + 0.3
        finally:
            client.stop_stream()
            client.close()
        return responses

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("per_response", [False, True], ids=["totals", "vllm_dialect"])
def test_coalesced_responses_carry_every_token_once_and_one_final_flag(paced, per_response):
    """Far more tokens than the relay sends responses for: several tokens per response,
    yet every stream gets each token's text once, counts that add up, one final flag."""
    server, control = paced
    write_rate(control, Rate(ttft_s=0.0, tokens_per_s=2000))
    try:
        streams = _stream_all(server.grpc_url, MODEL, 24, 200, per_response)
    finally:
        write_rate(control, VLLM_DOUBLE_PACE)
    expected = "".join(f" w{i}" for i in range(200))
    for responses in streams:
        assert "".join(text for text, _, _ in responses) == expected
        assert [final for _, _, final in responses].count(True) == 1 and responses[-1][2]
        counts = [count for text, count, _ in responses if text]
        assert (sum(counts) if per_response else counts[-1]) == 200
    responses = sum(len([t for t, _, _ in r if t]) for r in streams)
    assert responses < 24 * 200  # the point: tokens did share responses
