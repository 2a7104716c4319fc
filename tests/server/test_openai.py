"""The OpenAI frontend against a real tritonserver serving deploy/default.yaml (SmolLM2 on
vLLM behind `router`), asked by the real `openai` client and by curl; the session's default
server and one frontend for the module.

Equality is checked at temperature 0 against answers from the same server (streamed vs
non-streamed; the OpenAI usage vs the engine's counts over gRPC). Waits poll a condition
with a bounded deadline; no latency is asserted.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from builder.serve.client import build_inputs, first_output
from builder.serve.openai.pod_metrics import KV_USAGE, RUNNING, WAITING
from builder.serve.openai.runner import Frontend
from builder.serve.server import free_port
from tests.helpers import metric_value, wait_for
from tests.helpers.servers import ROOT

pytestmark = [pytest.mark.vllm]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ENGINE = "smollm2"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def frontend(server):
    with Frontend(
        server.grpc_url, port=free_port(), repo=server.repository, metrics_url=server.metrics_url
    ) as frontend:
        yield frontend


@pytest.fixture(scope="module")
def client(frontend):
    return openai.OpenAI(
        base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


def chat(client, stream=False, messages=QUESTION, **kwargs):
    return client.chat.completions.create(
        model="router", messages=messages, stream=stream, temperature=0, **kwargs
    )


def streamed(chunks) -> tuple[str, list, object]:
    """The text, the finish reasons and the usage of a chat stream."""
    texts, reasons, usage = [], [], None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                texts.append(choice.delta.content)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return "".join(texts), reasons, usage


def grpc_counts(server, messages) -> tuple[int, int, str]:
    """(input tokens, output tokens, text) of the same request straight to `router` over
    a gRPC stream (one non-streamed response)."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            "router", build_inputs(None, messages, None, False, {"temperature": 0})
        )
        result, error = answers.get(timeout=120)
        assert error is None, error
        return (
            int(first_output(result, "num_input_tokens")),
            int(first_output(result, "num_output_tokens")),
            first_output(result, "text_output"),
        )
    finally:
        client.stop_stream()
        client.close()


def metric(server, name) -> float:
    return metric_value(server.metrics_url, name, model=ENGINE)


# -- models -------------------------------------------------------------------------------


def test_models_lists_the_router_only_and_the_engine_model_is_not_found(client):
    assert [model.id for model in client.models.list()] == ["router"]
    assert client.models.retrieve("router").id == "router"
    for name in (ENGINE, "nope"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(name)
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
        assert caught.value.body["code"] == "model_not_found"
        assert "router" not in caught.value.message


# -- chat and completions -----------------------------------------------------------------


def test_chat_stream_equals_non_stream_and_usage_is_the_engines(server, client):
    whole = chat(client)
    text, reasons, usage = streamed(
        chat(client, stream=True, stream_options={"include_usage": True})
    )
    assert whole.model == "router" and whole.object == "chat.completion"
    assert "Paris" in whole.choices[0].message.content
    assert text == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason] == ["stop"]
    tokens_in, tokens_out, grpc_text = grpc_counts(server, QUESTION)
    assert grpc_text == text
    assert (usage.prompt_tokens, usage.completion_tokens) == (tokens_in, tokens_out)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (tokens_in, tokens_out)
    assert usage.total_tokens == tokens_in + tokens_out


def test_chat_limits_stop_and_seed(client):
    short = chat(client, max_completion_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    assert chat(client, max_tokens=2).usage.completion_tokens == 2
    stopped = chat(client, stop=[" Paris"])
    assert "Paris" not in stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    sampled = [
        client.chat.completions.create(
            model="router",
            messages=QUESTION,
            temperature=1.0,
            top_p=0.9,
            seed=11,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            max_tokens=12,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_completions_stream_and_non_stream(client):
    kwargs = dict(model="router", prompt="The capital of France is", max_tokens=8, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.choices[0].text and text == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 8
    assert whole.choices[0].finish_reason == "length"
    echoed = client.completions.create(echo=True, **kwargs)
    assert echoed.choices[0].text == kwargs["prompt"] + whole.choices[0].text


def test_routing_hints_from_extra_body_and_headers(frontend, client):
    response = client.chat.completions.with_raw_response.create(
        model="router",
        messages=QUESTION,
        max_tokens=2,
        extra_body={"route": ENGINE, "task": "chat", "tenant": "acme", "conversation_id": "c-1"},
    )
    assert response.headers["x-trident-served-by"] == ENGINE
    assert response.parse().usage.completion_tokens == 2
    response = httpx.post(
        frontend.url + "/v1/chat/completions",
        timeout=120,
        headers={"X-Trident-Route": ENGINE, "X-Trident-Tenant": "acme"},
        json={"model": "router", "messages": QUESTION, "max_tokens": 2},
    )
    assert response.status_code == 200 and response.headers["x-trident-served-by"] == ENGINE


# -- errors -------------------------------------------------------------------------------


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="nope", messages=QUESTION)
    assert caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"n": 17}, "n"),  # past the fan-out bound (16)
        ({"extra_body": {"min_p": 5}}, "min_p"),  # refused by the engine, not the frontend
        ({"extra_body": {"top_k": -7}}, "top_k"),
    ],
)
def test_bad_requests_are_400_naming_the_parameter(client, kwargs, param):
    body = {"model": "router", "messages": QUESTION, "max_tokens": 2, **kwargs}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            result = client.chat.completions.create(stream=stream, **body)
            list(result)
        assert caught.value.status_code == 400
        assert caught.value.body["param"] == param, caught.value.body
        assert caught.value.body["message"]


def test_malformed_json_is_400(frontend):
    response = httpx.post(
        frontend.url + "/v1/chat/completions",
        content=b"{nope",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# -- streams ------------------------------------------------------------------------------


def test_client_disconnect_mid_stream_aborts_the_engine_request(server, frontend):
    aborted = metric(server, "trident_requests_aborted_total")
    body = {
        "model": "router",
        "messages": QUESTION,
        "stream": True,
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.stream(
        "POST", frontend.url + "/v1/chat/completions", json=body, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        wait_for(lambda: metric(server, "trident_requests_in_flight") >= 1, 30)
    # Leaving the block closed the connection mid-stream.
    wait_for(lambda: metric(server, "trident_requests_aborted_total") >= aborted + 1, 30)
    wait_for(lambda: metric(server, "trident_requests_in_flight") == 0, 30)


def test_sixteen_concurrent_streams_each_equal_their_answer(client):
    prompts = [[{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(16)]
    expected = [chat(client, messages=p, max_tokens=16) for p in prompts]
    results: dict[int, tuple] = {}

    def run(i):
        chunks = list(
            chat(
                client,
                stream=True,
                messages=prompts[i],
                max_tokens=16,
                stream_options={"include_usage": True},
            )
        )
        results[i] = (streamed(chunks), {c.id for c in chunks})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert sorted(results) == list(range(16))
    for i, ((text, reasons, usage), ids) in results.items():
        assert text == expected[i].choices[0].message.content, i
        assert reasons == [expected[i].choices[0].finish_reason], i
        assert usage.completion_tokens == expected[i].usage.completion_tokens, i
        assert len(ids) == 1, i  # every chunk of one stream is one completion


def test_curl_shows_raw_sse_ending_in_done(frontend):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl on this machine")
    body = {
        "model": "router",
        "messages": QUESTION,
        "stream": True,
        "max_tokens": 6,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    out = subprocess.run(
        [
            curl,
            "-sN",
            "-D",
            "-",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
            frontend.url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    head, _, events = out.partition("\n\n")  # text mode: \r\n reads as \n
    assert "text/event-stream" in head.lower()
    blocks = [b for b in events.split("\n\n") if b.strip()]
    assert all(b.startswith("data: ") for b in blocks)
    assert blocks[-1] == "data: [DONE]"
    chunks = [json.loads(b[len("data: ") :]) for b in blocks[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


def test_the_openai_command_serves_standalone(server, tmp_path):
    port = free_port()
    log = open(tmp_path / "openai.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "builder.cli",
            "openai",
            "--triton",
            server.grpc_url,
            "--port",
            str(port),
            "--expose",
            "router",
            "--expose",
            ENGINE,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def models():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
            except httpx.HTTPError:
                return None

        listed = wait_for(models, 60, 0.2)
        assert {m["id"] for m in listed["data"]} == {"router", ENGINE}
    finally:
        process.terminate()
        assert process.wait(15) == 0, (tmp_path / "openai.log").read_text()
        log.close()


def pod_gauges(frontend) -> dict[str, float]:
    with urllib.request.urlopen(frontend.url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_pods_load_on_metrics_rises_under_load_and_falls_back(frontend, client):
    """What an endpoint picker reads on the inference port (pod_metrics.py), from the
    real vLLM engine's own gauges: running requests rise while four streams run and fall
    back to 0 after them, nothing waits after them, and the KV usage is a fraction."""
    assert set(pod_gauges(frontend)) == {WAITING, RUNNING, KV_USAGE}
    seen = []
    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(chat, client, max_tokens=48) for _ in range(4)]
        while not all(a.done() for a in answers):
            seen.append(pod_gauges(frontend))
            time.sleep(0.05)
    assert all(a.result().choices[0].message.content for a in answers)
    assert max(g[RUNNING] for g in seen) >= 1, seen[-3:]
    assert all(0 <= g[KV_USAGE] <= 1 for g in seen)
    assert max(g[KV_USAGE] for g in seen) > 0  # the streams held KV blocks
    wait_for(lambda: pod_gauges(frontend)[RUNNING] == 0, timeout_s=10)
    assert pod_gauges(frontend)[WAITING] == 0
