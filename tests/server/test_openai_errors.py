"""Each runtime error class (trident_common/error_classes.py) end to end: a real
tritonserver with the router in front of two SGLang models on the engine double (one
whose engine fails every request), tenant limits on a real Redis, the real OpenAI
frontend, asked by the real openai SDK (sync and async) and by Triton's own clients.

Cases: the router's client errors (unknown route, unknown adapter, a tenant name that is
not one) are 400 naming the parameter; a tenant over its limit is 429; every backend at
its in-flight limit is 503 overloaded; a failing engine is 500, and once its breaker is
open, 503 unavailable. Triton's own clients read the class from the message's marker:
a gRPC stream error is a message only, and Triton's HTTP generate endpoint answers 400
for any error of a decoupled model (measured here).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from builder.serve import loading
from builder.serve.openai.runner import Frontend
from builder.serve.server import free_port
from support.sglang_double import SHIM
from tests.helpers.servers import render
from tests.helpers.streams import Stream
from trident_common import error_classes as table

pytestmark = pytest.mark.server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# An engine that fails every request before its first token, as a crashed GPU would.
FAILING = (
    SHIM
    + """

class Engine(Engine):
    async def _generate(self, *args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
        yield  # an async generator, as the real one
"""
)


def deployment() -> dict:
    engine_args = {
        "tp_size": 1,
        "context_length": 4096,
        "mem_fraction_static": 0.4,
        "max_running_requests": 16,
    }
    models = [
        {
            "name": name,
            "engine": "sglang",
            "model": "/models/test-double",
            "family": "qwen",
            "tasks": ["chat"],
            "placement": {"devices": [0]},
            "engine_args": engine_args,
        }
        for name in ("qwen", "flaky")
    ]
    return {
        "name": "error-classes",
        "hardware": {"gpu": "cpu", "count": 1},
        "models": models,
        # One request in flight per backend (overloaded is easy to reach); a breaker
        # that opens after two failures and stays open for the test.
        "router": {
            "default": ["qwen"],
            "max_inflight_per_backend": 1,
            "breaker": {"consecutive_failures": 2, "min_requests": 100, "cooldown_s": 600},
        },
    }


@pytest.fixture(scope="module")
def server(redis, tmp_path_factory, pool):
    tmp = tmp_path_factory.mktemp("error-classes")
    spec = deployment()
    spec["tenants"] = {
        "default": {"requests_per_minute": 1000},
        "limits": {"eve": {"requests_per_minute": 1}, "finn": {"requests_per_minute": 1}},
        "redis": redis.url,
    }
    repo = render(spec, tmp / "repo")
    (repo / "qwen" / "1" / "sglang.py").write_text(SHIM)
    (repo / "flaky" / "1" / "sglang.py").write_text(FAILING)
    with pool.serving("error-classes", repo, timeout_s=90) as server:
        yield server


@pytest.fixture(scope="module")
def frontend(server):
    with Frontend(
        server.grpc_url, port=free_port(), repo=server.repository, admin_key=server.admin_key
    ) as frontend:
        yield frontend


@pytest.fixture(scope="module")
def client(frontend):
    return openai.OpenAI(base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, **extra):
    return client.chat.completions.create(
        model="router", messages=QUESTION, max_tokens=2, extra_body=extra
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"route": "nope"}, "route"),
        ({"lora_name": "nope"}, "lora_name"),
        ({"tenant": "not a name!"}, "tenant"),
    ],
)
def test_the_routers_client_errors_are_400_naming_the_parameter(client, extra, param):
    # Before: 500 backend_error for each (the router's words matched no substring, or
    # "bad request: " for the tenant); the adapter was 400 by a regex over its words.
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, **extra)
    body = caught.value.body
    assert body["param"] == param, body
    assert "nope" in body["message"] or param == "tenant"
    assert "qwen" not in body["message"] and "flaky" not in body["message"]


def test_a_router_client_error_is_400_when_streamed_too(frontend):
    async def main():
        client = openai.AsyncOpenAI(
            base_url=frontend.url + "/v1", api_key="unused", max_retries=0, timeout=60
        )
        with pytest.raises(openai.BadRequestError) as caught:
            stream = await client.chat.completions.create(
                model="router",
                messages=QUESTION,
                max_tokens=2,
                stream=True,
                extra_body={"route": "nope"},
            )
            async for _ in stream:
                pass
        await client.close()
        return caught.value.body

    assert asyncio.run(main())["param"] == "route"


def test_a_tenant_over_its_limit_is_429(client):
    assert ask(client, tenant="eve").usage.completion_tokens == 2
    with pytest.raises(openai.RateLimitError) as caught:
        ask(client, tenant="eve")
    assert caught.value.body["code"] == "rate_limit_exceeded"


def test_n_over_what_the_tenant_can_ever_have_is_a_400_naming_n(client):
    """Issue 34: a 5-per-minute tenant sending n=6 was charged 5 and got a 429 and
    nothing else. The n choices reach the router as one fan-out (its parameters), which
    refuses n over the tenant's whole minute at once; the tenant's one request of the
    minute is not charged. (Admitted whole and refused whole, and charged nothing:
    test_tenants.py.)"""
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, tenant="finn", n=2)
    body = caught.value.body
    assert body["param"] == "n" and body["code"] == "invalid_value", body
    assert "tenant 'finn' may never have more than 1 at once" in body["message"]
    # That the refusal charged nothing is tests/bls/test_tenants.py's and test_tenants.py's
    # to show: here a request right after it could meet the refused choices' calls still
    # holding this one-slot router's backend (`overloaded`, a CI check saw it).


def test_every_backend_at_its_limit_is_503_overloaded(server, client):
    busy = Stream(server, max_tokens=200)  # qwen's one slot, held while it streams
    try:
        busy.wait_first_text(30)
        with pytest.raises(openai.APIStatusError) as caught:
            ask(client)
        assert caught.value.status_code == 503, caught.value.body
        assert caught.value.body["code"] == "overloaded"
    finally:
        busy.close()


def test_a_failing_engine_is_500_then_503_once_its_breaker_opens(client):
    for _ in range(2):  # consecutive_failures: 2
        with pytest.raises(openai.InternalServerError) as caught:
            ask(client, route="flaky")
        assert caught.value.status_code == 500 and "CUDA error" in caught.value.message
    with pytest.raises(openai.APIStatusError) as caught:
        ask(client, route="flaky")
    assert caught.value.status_code == 503 and caught.value.body["code"] == "unavailable"


def test_triton_clients_read_the_class_from_the_stream_and_the_http_status(server):
    # gRPC stream: the error is a message only; its marker is the class.
    stream = Stream(server, hints={"route": "nope"})
    try:
        assert stream.pump(30)
        (message,) = stream.errors
        parsed = table.parse(message)
        assert (parsed.error_class, parsed.param) == (table.CLIENT, "route")
    finally:
        stream.close()
    # HTTP generate: Triton 2.51 answers a decoupled model's error response with 400
    # whatever its code (measured: INVALID_ARG, UNAVAILABLE and INTERNAL alike), so
    # there too the class travels in the message's marker.
    assert generate_error(server, "router", {"route": "nope"}) == (400, table.CLIENT)
    assert generate_error(server, "router", {"route": "flaky"}) == (400, table.UNAVAILABLE)
    assert generate_error(server, "flaky", {}) == (400, table.INTERNAL)


def generate_error(server, model: str, fields: dict) -> tuple:
    """(HTTP status, error class) of a request to Triton's generate endpoint."""
    body = json.dumps({"text_input": "Hello", "max_tokens": 2, **fields}).encode()
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/{model}/generate",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, None
    except urllib.error.HTTPError as e:
        return e.code, table.classify(json.loads(e.read())["error"])


def test_refused_fan_outs_leave_the_router_free_to_unload(server, client):
    """A CI check's pool could not unload this module's router after the one refused n=2
    above: the frontend had cancelled the sibling choice across its own refusal's final
    flag, and Triton 2.51 then keeps that request, so the router's unload never ends
    (builder/serve/openai/triton.py, Call.abandon). Before the fix, 30 refusals left it
    stuck (1 of 1 tries; 3 refusals: 0 of 1); after it, 30 refusals, then the unload
    ends within seconds. Last in this file (the module's own repository: its tests run
    in file order), as it leaves the router unloaded for the pool's swap."""
    for _ in range(30):
        with pytest.raises(openai.BadRequestError):
            ask(client, tenant="finn", n=2)
    loading.request(server.http_url, "router", "unload", 30, server.admin_headers)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {m["name"]: m.get("state") for m in server.model_states()}
        if states.get("router") not in ("READY", "UNLOADING"):
            return
        time.sleep(0.2)
    raise AssertionError(f"router still {states.get('router')} 30 s after its unload")
