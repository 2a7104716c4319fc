"""The embedded default for real: SmolLM2 on vLLM inside tritonserver, behind `router`."""

from __future__ import annotations

import json
import queue
import urllib.error

import pytest
import tritonclient.grpc as grpcclient

from builder.serve import client as infer
from tests.helpers import http_json, metric_value, wait_for

pytestmark = [pytest.mark.server, pytest.mark.vllm]
GREEDY = {"temperature": 0}


def test_streamed_chat_through_router_says_paris(default_server):
    chunks = []
    result = infer.stream_generate(
        default_server.grpc_url,
        "router",
        "What is the capital of France?",
        max_tokens=24,
        sampling=GREEDY,
        on_text=chunks.append,
    )
    assert "Paris" in result.text
    assert result.served_by == "smollm2"
    assert result.finish_reason in ("stop", "length")
    assert len(chunks) > 1 and "".join(chunks) == result.text  # streamed, deltas only
    assert result.output_tokens >= len(chunks)


def test_router_output_matches_backend_byte_for_byte(default_server):
    direct = infer.stream_generate(
        default_server.grpc_url, "smollm2", "Name three colours.", max_tokens=16, sampling=GREEDY
    )
    routed = infer.stream_generate(
        default_server.grpc_url, "router", "Name three colours.", max_tokens=16, sampling=GREEDY
    )
    assert routed.text == direct.text and routed.output_tokens == direct.output_tokens == 16


def test_http_generate_stream_sse(default_server):
    request = urllib.request.Request(
        default_server.http_url + "/v2/models/router/generate_stream",
        data=json.dumps(
            {
                "text_input": "The capital of France is",
                "stream": True,
                "max_tokens": 8,
                "sampling_parameters": json.dumps(GREEDY),
                "exclude_input_in_output": True,
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    events = []
    with urllib.request.urlopen(request, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    texts = [e["text_output"] for e in events if e.get("text_output")]
    assert len(texts) > 1
    assert "Paris" in "".join(texts)
    assert all(e.get("served_by") in (None, "smollm2") for e in events)


def test_non_streaming_request_gets_one_whole_response(default_server):
    status, body = http_json(
        default_server.http_url + "/v2/models/smollm2/generate",
        {
            "text_input": "The capital of France is",
            "max_tokens": 8,
            "sampling_parameters": json.dumps(GREEDY),
        },
    )
    answer = json.loads(body)
    assert status == 200
    assert answer["text_output"].startswith("The capital of France is")  # prompt included
    assert "Paris" in answer["text_output"]
    assert answer["num_output_tokens"] == 8


def test_cancelled_stream_aborts_engine_request(default_server):
    url = default_server.metrics_url
    aborted_before = metric_value(url, "trident_requests_aborted_total", model="smollm2")
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(default_server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(
        "router",
        infer.build_inputs(
            "Write a very long story about a dragon.",
            None,
            2000,
            True,
            {**GREEDY, "ignore_eos": True},
        ),
    )  # cannot finish on its own before the cancel
    result, error = responses.get(timeout=120)  # the first token arrived
    assert error is None
    client.stop_stream(cancel_requests=True)
    client.close()
    wait_for(
        lambda: (
            metric_value(url, "trident_requests_aborted_total", model="smollm2") > aborted_before
        ),
        timeout_s=30,
    )
    wait_for(lambda: metric_value(url, "trident_requests_in_flight", model="smollm2") == 0)
    after = infer.stream_generate(
        default_server.grpc_url, "router", "Say hi.", max_tokens=4, sampling=GREEDY
    )
    assert after.output_tokens == 4


BAD_REQUESTS = [
    (
        "bad sampling JSON",
        {"text_input": "hi", "sampling_parameters": "{temperature: 0"},
        "sampling_parameters is not valid JSON",
    ),
    (
        "unknown sampling key",
        {"text_input": "hi", "sampling_parameters": json.dumps({"temprature": 0})},
        "unknown sampling parameter(s) for vllm: temprature",
    ),
    ("prompt too long", {"text_input": "hello " * 3000}, "maximum context length is 2048"),
    ("missing input", {"max_tokens": 4}, "one of 'text_input' or 'messages' is required"),
    ("bad messages", {"messages": json.dumps([{"role": "user"}])}, "messages[0] must be"),
    ("bad max_tokens", {"text_input": "hi", "max_tokens": 0}, "max_tokens must be a positive"),
]


@pytest.mark.parametrize("model", ["smollm2", "router"])
@pytest.mark.parametrize("name,body,message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_error_and_server_keeps_serving(
    default_server, model, name, body, message
):
    with pytest.raises(urllib.error.HTTPError) as failure:
        http_json(f"{default_server.http_url}/v2/models/{model}/generate", body)
    error = json.loads(failure.value.read())["error"]
    assert message in error
    assert default_server.http_get("/v2/health/ready") == 200


def test_server_still_answers_after_bad_requests(default_server):
    result = infer.stream_generate(
        default_server.grpc_url, "router", "Say hi.", max_tokens=4, sampling=GREEDY
    )
    assert result.output_tokens == 4


def test_metrics_are_exported(default_server):
    infer.stream_generate(
        default_server.grpc_url, "smollm2", "Hello", max_tokens=4, sampling=GREEDY
    )
    url = default_server.metrics_url
    assert metric_value(url, "trident_generation_tokens_total", model="smollm2") >= 4
    assert metric_value(url, "trident_prompt_tokens_total", model="smollm2") > 0
    assert metric_value(url, "trident_time_to_first_token_seconds_count", model="smollm2") >= 1
    assert metric_value(url, "trident_inter_token_latency_seconds_count", model="smollm2") >= 1
    assert (
        metric_value(url, "trident_router_requests_total", route="default", served_by="smollm2")
        >= 1
    )
