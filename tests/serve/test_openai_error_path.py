"""The frontend's path from a Triton error to the client's OpenAI error, through the real
Triton.stream and Call with a stand-in gRPC call (milliseconds): the class comes from
the message's marker (trident_common/error_classes.py), and a refusal naming the route
or the adapter answers with the client's value only, never the deployment's names."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.grpc import service_pb2

from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.protocol import parse_chat
from builder.serve.openai.tensors import ModelInfo
from builder.serve.openai.triton import Triton

ROUTER = ModelInfo(
    "router",
    {
        "messages": "TYPE_STRING",
        "stream": "TYPE_BOOL",
        "sampling_parameters": "TYPE_STRING",
        "route": "TYPE_STRING",
    },
    False,
)


class OneErrorStream:
    """grpc.aio's ModelStreamInfer call, answering its request with one error response."""

    def __init__(self, message: str):
        self.message = message

    async def read(self):
        return service_pb2.ModelStreamInferResponse(error_message=self.message)

    def cancel(self):
        pass


def answer(message: str, **body) -> OpenAIError:
    triton = Triton("127.0.0.1:1")
    triton.open_stream = lambda _request: OneErrorStream(message)
    generation = parse_chat(
        {"model": "router", "messages": [{"role": "user", "content": "hi"}], **body}, {}
    )

    async def main():
        call = triton.stream(generation, ROUTER)
        async for _ in call.pieces():
            pass

    with pytest.raises(OpenAIError) as caught:
        asyncio.run(main())
    return caught.value


def test_an_unknown_route_names_the_clients_route_only():
    # Before ad8f647 a 500; after 35c3312 (Call without `asked`) a TypeError, a 500 too.
    error = answer(
        "invalid request: [route] unknown route 'nope' (valid routes: qwen, secret-backend)",
        route="nope",
    )
    assert (error.status, error.param, error.code) == (400, "route", "route_not_found")
    assert "'nope'" in error.message and "secret-backend" not in error.message


def test_an_unknown_adapter_names_the_clients_adapter_only():
    error = answer(
        "invalid request: [lora_name] unknown adapter 'x': no backend holds it "
        "(adapters: legal (secret-backend))",
        lora_name="x",
    )
    assert (error.status, error.param) == (400, "lora_name")
    assert "'x'" in error.message and "secret-backend" not in error.message


@pytest.mark.parametrize(
    "message, status, code",
    [
        ("rate limit: tenant 'eve' is over 1 requests per minute", 429, "rate_limit_exceeded"),
        ("overloaded: every backend of route 'default' is at its limit", 503, "overloaded"),
        (
            "unavailable: no backend available for route 'flaky': flaky: circuit breaker open",
            503,
            "unavailable",
        ),
        ("every backend failed before its first token: flaky: CUDA error", 500, "backend_error"),
    ],
)
def test_each_class_reaches_the_client_with_its_status(message, status, code):
    error = answer(message)
    assert (error.status, error.code) == (status, code)
