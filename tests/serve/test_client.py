"""builder/serve/client.py against real gRPC servers: one that accepts a streamed request
and never answers it (as Triton 2.51 does with a router request whose stub was killed),
where the client's timeout ends the call, cancelling the request, instead of waiting for
ever; and one that answers with an error, then ends the stream, which the client lets
end without a cancel (in Triton 2.51 a cancel racing the final flag keeps the request,
and its model never unloads)."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent import futures

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from builder.serve import client
from builder.serve.server import free_port


class SilentTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Takes a stream's requests and never sends a response; notes each cancelled call."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def ModelStreamInfer(self, request_iterator, context):
        context.add_callback(self.cancelled.set)
        for _request in request_iterator:
            pass  # read them all, answer none
        while context.is_active():
            time.sleep(0.05)
        return iter(())


@contextlib.contextmanager
def serving(servicer):
    """A real gRPC server of Triton's service on a free loopback port; yields its URL."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


@pytest.fixture
def silent():
    servicer = SilentTriton()
    with serving(servicer) as url:
        yield url, servicer


def test_a_stream_the_server_never_ends_is_cancelled_at_the_timeout(silent):
    url, servicer = silent
    started = time.monotonic()
    with pytest.raises(client.InferError, match="no response from router within 1 s"):
        client.stream_generate(url, "router", "hi", max_tokens=4, timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert servicer.cancelled.wait(5)  # the server saw the call end


class RefusingTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each streamed request with an error response, then ends the stream a
    moment later (as the router's final flag follows its refusal); notes whether the
    client cancelled the call before it ended."""

    def __init__(self) -> None:
        self.cancelled_early: list[bool] = []

    def ModelStreamInfer(self, request_iterator, context):
        next(request_iterator)
        yield service_pb2.ModelStreamInferResponse(error_message="router: unknown route 'x'")
        time.sleep(0.5)
        self.cancelled_early.append(not context.is_active())


def test_an_error_answer_is_not_cancelled_the_stream_ends_on_its_own():
    servicer = RefusingTriton()
    with serving(servicer) as url:
        with pytest.raises(client.InferError, match="unknown route"):
            client.stream_generate(url, "router", "hi", timeout_s=5.0)
        threading.Event().wait(0.2)  # the handler's last line
        assert servicer.cancelled_early == [False]
