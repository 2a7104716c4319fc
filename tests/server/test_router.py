"""The router against a real tritonserver: deploy/examples/cpu-fallback.yaml (two vLLM
engines, `primary` and `backup`, behind `router`): the session's fallback_server
(tests/server/conftest.py), shared with the other tests of that configuration.

The tests run in file order: routing and error cases first, then concurrency and
cancellation, then the failure story, marked destructive (after the other tests of the
server) (kill primary's stub mid-stream →
error then final flag; traffic moves to backup, breaker opens; unload/load primary →
traffic returns once the breaker closes). Waits poll a condition with a bounded deadline.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs, stream_generate
from builder.serve.watch import stub_processes
from tests.helpers import http_json, metric_value, wait_for
from tests.helpers.streams import ENDLESS, GREEDY, Stream, generate

pytestmark = [pytest.mark.server, pytest.mark.vllm]

MODELS = ["primary", "backup", "router"]


@pytest.fixture(scope="module")
def server(fallback_server):
    return fallback_server


# -- helpers ------------------------------------------------------------------------------


def metric(server, name: str, **labels) -> float:
    return metric_value(server.metrics_url, name, **labels)


def stub_pid(server, model: str) -> int | None:
    """The Python-backend stub process serving `model` in this server."""
    pids = [s.pid for s in stub_processes(server.process.pid).values() if s.model == model]
    return pids[0] if pids else None


def repository_call(server, model: str, action: str, timeout_s: float = 240) -> None:
    request = urllib.request.Request(
        f"{server.http_url}/v2/repository/models/{model}/{action}",
        data=b"{}",
        method="POST",
        headers=server.admin_headers,
    )  # model control needs the admin key
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        assert response.status == 200


# -- routing ------------------------------------------------------------------------------

CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, "primary"),  # default route
        ({"hints": {"route": "fast"}}, "backup"),  # rule by hint
        ({"hints": {"route": "backup"}}, "backup"),  # hint = backend name
        ({"hints": {"route": "chat"}}, "primary"),  # hint = rule name
        ({"hints": {"tier": "free"}}, "backup"),  # rule by tier
        ({"parameters": {"tier": "free"}}, "backup"),  # ... as a parameter
        ({"prompt": "word " * 200, "chat": False}, "backup"),  # long prompt
    ],
)
def test_rules_pick_the_backend(server, kwargs, expected):
    stream = generate(server, **{"max_tokens": 4, **kwargs})
    assert not stream.errors
    assert stream.served_by == {expected}
    assert stream.finals == 1


def test_multi_turn_chat_goes_to_primary(server):
    inputs = build_inputs(None, CHAT, 8, True, GREEDY, {"tier": "gold"})
    stream = generate(server, raw_inputs=inputs)
    assert stream.served_by == {"primary"}
    assert "Paris" in stream.text


def test_router_output_matches_the_backend(server):
    """Relaying changes nothing: greedy text through the router equals the backend's."""
    direct = stream_generate(
        server.grpc_url, "primary", "What is the capital of France?", max_tokens=12, sampling=GREEDY
    )
    routed = stream_generate(
        server.grpc_url, "router", "What is the capital of France?", max_tokens=12, sampling=GREEDY
    )
    assert routed.text == direct.text and routed.served_by == "primary"


@pytest.mark.parametrize("model", ["router", "primary"])
def test_sampling_values_sent_as_request_parameters(server, model):
    # vllm_backend's clients may send them as request parameters, floats included (the
    # router forwards a float as text: BLS takes bool/int/str parameter values only).
    greedy_five = {"temperature": 0, "max_tokens": 5, "ignore_eos": True}
    expected = generate(server, model="primary", max_tokens=None, sampling=greedy_five)
    stream = generate(
        server,
        model=model,
        max_tokens=None,
        sampling=None,
        parameters={"temperature": 0.0, "top_p": 1.0, "max_tokens": 5, "ignore_eos": True},
    )
    assert not stream.errors and stream.finals == 1
    assert stream.text == expected.text and expected.text


def test_unknown_route_names_the_valid_routes(server):
    stream = generate(server, hints={"route": "nope"})
    assert len(stream.errors) == 1 and not stream.texts
    for route in ("backup", "chat", "fast", "free-tier", "long-prompt", "primary"):
        assert route in stream.errors[0]
    assert "'nope'" in stream.errors[0]


def test_bad_sampling_json_is_an_error_and_the_server_stays_ready(server):
    inputs = build_inputs(None, [{"role": "user", "content": "Hi"}], 4, True)
    inputs.append(grpcclient.InferInput("sampling_parameters", [1], "BYTES"))
    inputs[-1].set_data_from_numpy(np.array([b"{not json"], dtype=np.object_))
    fallbacks = metric(server, "trident_router_fallbacks_total", backend="primary")
    stream = generate(server, raw_inputs=inputs)
    assert len(stream.errors) == 1 and "sampling_parameters" in stream.errors[0]
    assert server.http_get("/v2/health/ready") == 200
    # a client's mistake is not the backend's failure: no fallback, breaker closed
    assert "every backend failed" not in stream.errors[0]
    assert metric(server, "trident_router_fallbacks_total", backend="primary") == fallbacks
    assert metric(server, "trident_router_breaker_state", backend="primary") == 0
    assert generate(server, max_tokens=2).served_by == {"primary"}


def test_malformed_messages_get_an_error(server):
    for raw in (b'{"role": "user"}', b'["hi"]', b"not json"):
        messages = grpcclient.InferInput("messages", [1], "BYTES")
        messages.set_data_from_numpy(np.array([raw], dtype=np.object_))
        stream = generate(server, raw_inputs=[messages])
        assert len(stream.errors) == 1 and not stream.texts, raw
        assert "messages" in stream.errors[0]


# -- non-streaming requests: one response ------------------------------------------------


@pytest.mark.parametrize(
    "prompt_kind, hints, exclude",
    [
        ("text", None, None),
        ("chat", None, None),
        ("text", {"route": "backup"}, None),
        ("text", None, True),
    ],
)
def test_a_non_streaming_answer_is_one_final_response(server, prompt_kind, hints, exclude):
    """Through the router exactly as from the backend: one response carrying the final
    flag (Triton 2.51's BLS iterator, rewound by a second loop, once sent it twice)."""
    chat = [{"role": "user", "content": "Hello"}] if prompt_kind == "chat" else None
    text = "Hello" if prompt_kind == "text" else None
    backend = (hints or {}).get("route", "primary")
    streams = {}
    for model in (backend, "router"):
        inputs = build_inputs(
            text,
            chat,
            8,
            False,
            GREEDY,
            hints if model == "router" else None,
            exclude_input_in_output=exclude,
        )
        streams[model] = generate(server, model=model, raw_inputs=inputs)
    routed, direct = streams["router"], streams[backend]
    assert not routed.errors and routed.served_by == {backend}
    assert routed.responses == 1 and routed.finals == 1 and routed.extra_finals(0) == 0
    assert routed.texts == direct.texts and len(direct.texts) == 1


def test_a_one_token_stream_is_relayed_once(server):
    routed = generate(server, max_tokens=1)
    direct = generate(server, model="primary", max_tokens=1)
    assert routed.texts == direct.texts and len(routed.texts) == 1


def test_http_generate_through_the_router(server):
    url = f"{server.http_url}/v2/models/{{}}/generate"
    greedy = json.dumps(GREEDY)
    body = {"text_input": "Hello", "stream": False, "max_tokens": 8, "sampling_parameters": greedy}
    _, direct = http_json(url.format("primary"), body)
    status, routed = http_json(url.format("router"), body)
    assert status == 200 and "text_output" in json.loads(routed), routed
    assert json.loads(routed)["text_output"] == json.loads(direct)["text_output"]
    assert json.loads(routed)["served_by"] == "primary"
    # messages as the JSON generate endpoint takes them: a string holding the list, or
    # one message object (a bare JSON array of objects never reaches a model).
    for messages in ([{"role": "user", "content": "Hi"}], {"role": "user", "content": "Hi"}):
        status, routed = http_json(
            url.format("router"),
            {"messages": json.dumps(messages), "max_tokens": 4, "sampling_parameters": greedy},
        )
        assert status == 200 and json.loads(routed)["text_output"], routed


def test_client_errors_never_trip_a_breaker(server):
    for _ in range(10):
        stream = generate(server, max_tokens=4, sampling={"temperature": -1})
        assert len(stream.errors) == 1 and not stream.texts
        assert "temperature" in stream.errors[0], stream.errors[0]
        assert "every backend failed" not in stream.errors[0]
    for backend in ("primary", "backup"):
        assert metric(server, "trident_router_breaker_state", backend=backend) == 0
    assert generate(server, max_tokens=2).served_by == {"primary"}


# -- concurrency --------------------------------------------------------------------------


def test_sixteen_streams_progress_in_parallel(server):
    streams = [
        Stream(
            server,
            prompt=f"Count to {i}.",
            max_tokens=24,
            sampling=ENDLESS,
            hints={"route": "primary"},
        )
        for i in range(16)
    ]
    try:
        for stream in streams:
            assert stream.pump(180), "a stream never finished"
    finally:
        for stream in streams:
            stream.close()
    for stream in streams:
        assert not stream.errors and stream.finals == 1
        assert stream.served_by == {"primary"}
        assert stream.extra_finals(0) == 0
    # Serialised streams would start one after another's end; parallel ones overlap.
    last_start = max(s.chunk_times[0] for s in streams)
    first_end = min(s.chunk_times[-1] for s in streams)
    assert last_start < first_end, "streams were relayed one after another"


# -- cancellation -------------------------------------------------------------------------


def test_cancel_reaches_the_backend(server):
    aborted_before = metric(server, "trident_requests_aborted_total", model="primary")
    stream = Stream(
        server,
        prompt="Tell me a long story.",
        max_tokens=400,
        sampling=ENDLESS,
        hints={"route": "primary"},
    )
    stream.wait_first_text(60)
    stream.close(cancel=True)
    wait_for(
        lambda: metric(server, "trident_requests_aborted_total", model="primary") > aborted_before,
        10,
    )
    assert metric(server, "trident_router_aborts_total", backend="primary") >= 1
    wait_for(lambda: metric(server, "trident_requests_in_flight", model="primary") == 0, 10)
    after = generate(server, max_tokens=4)
    assert after.served_by == {"primary"} and not after.errors


# -- failures: kill primary, watch the fallback, restart it --------------------------------


@pytest.mark.destructive
def test_backend_killed_mid_stream_gives_error_then_final(server):
    stream = Stream(
        server,
        prompt="Tell me a long story.",
        max_tokens=400,
        sampling=ENDLESS,
        hints={"route": "primary"},
    )
    try:
        stream.wait_first_text(60)
        pid = stub_pid(server, "primary")
        assert pid is not None, "primary's stub process not found"
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert stream.pump(30), "no final flag after the backend died"
        assert time.monotonic() - killed_at < 30
        assert stream.extra_finals() == 0
    finally:
        stream.close(cancel=stream.finals == 0)
    assert len(stream.errors) == 1 and "primary failed mid-stream" in stream.errors[0]
    assert stream.finals == 1


@pytest.mark.destructive
def test_traffic_moves_to_backup_and_the_breaker_opens(server):
    started = time.monotonic()
    served = [generate(server, max_tokens=2) for _ in range(3)]
    assert time.monotonic() - started < 30, "fallback took too long"
    for stream in served:
        assert not stream.errors and stream.served_by == {"backup"}
    assert metric(server, "trident_router_breaker_state", backend="primary") == 2
    assert metric(server, "trident_router_fallbacks_total", backend="primary") >= 1


@pytest.mark.destructive
def test_traffic_returns_after_primary_restarts(server):
    repository_call(server, "primary", "unload")
    wait_for(lambda: server.http_get("/v2/models/primary/ready") != 200, 60)
    assert generate(server, max_tokens=2).served_by == {"backup"}
    repository_call(server, "primary", "load")
    assert server.http_get("/v2/models/primary/ready") == 200
    # After the cooldown one probe request goes to primary; success closes the breaker.
    wait_for(lambda: generate(server, max_tokens=2).served_by == {"primary"}, 60, interval_s=0.5)
    assert metric(server, "trident_router_breaker_state", backend="primary") == 0
    assert (
        metric(server, "trident_router_requests_total", route="default", served_by="primary") >= 1
    )
