"""Requests the engine model refuses, sent through the router, cost nothing past their
answer, in a real tritonserver (the SGLang double): each gets its own refusal, however
many arrive at once; none keeps a router thread, and none counts against the engine, so
a good request after them is served. Before the engine models answered the router in band
(interface.ERRORS_IN_BAND), every refused request kept a relay thread waiting on a BLS
iterator that never ended (python_backend loses an error response's id), until the
router's pool was used up and the model's breaker opened for every client."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from builder.serve import client as infer
from builder.serve.watch import stub_processes

pytestmark = [pytest.mark.server]
# More than the router's relay pool holds (2 x its streams + 64 = 128 threads here).
REFUSED = 160
CLIENTS = 8  # at a time: the relay pool keeps about one thread per request in flight


def _router_threads(server) -> int:
    stubs = stub_processes(server.process.pid).values()
    (router,) = [stub.pid for stub in stubs if stub.model == "router"]
    return len(os.listdir(f"/proc/{router}/task"))


def _refusal(server, n: int) -> str:
    """The router's answer to a request asking for -n tokens (the engine refuses it)."""
    try:
        infer.stream_generate(server.grpc_url, "router", "Hello", max_tokens=-n, timeout_s=30)
    except infer.InferError as e:
        return str(e)
    return "answered"


def test_refused_requests_keep_no_thread_and_never_trip_the_breaker(sglang_check_server):
    server = sglang_check_server
    assert infer.stream_generate(server.grpc_url, "router", "Hello", max_tokens=4).text
    before = _router_threads(server)
    with ThreadPoolExecutor(CLIENTS) as pool:
        refusals = list(pool.map(lambda n: _refusal(server, n), range(1, REFUSED + 1)))
    for n, refusal in enumerate(refusals, 1):  # each its own, none another's
        assert f"invalid request: max_tokens must be a positive integer, got -{n}" in (refusal), (
            refusal
        )
    grown = _router_threads(server) - before  # 7 in two runs here; 120+ when they leak
    assert grown < 3 * CLIENTS, f"the router stub has {grown} more threads"
    good = infer.stream_generate(server.grpc_url, "router", "Hello", max_tokens=4)
    assert good.text and good.finish_reason
