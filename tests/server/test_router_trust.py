"""The router is the only trusted caller of the engine models (docs/security.md), in a
real tritonserver: trident's SGLang model on the SGLang double (support/sglang_double.py)
behind the router, with tenants, and a router secret in the server's environment.

A client that reaches the engine model directly (Triton's own gRPC port) cannot set a
cache salt or a priority, cannot end another client's stream by its request_id, nor
abort it before it starts; the router's own requests still carry their tenant's salt and
priority (the engine refuses both without the router's proof, so an answer means the
proof held) and still abort in the engine when their client cancels.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from builder.serve.client import build_inputs
from support.grpc_stream import Stream, generate
from support.sglang_double import MODEL
from tests.gpu import check_sglang
from tests.helpers import bad_requests
from trident_common import interface as INTERFACE

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(sglang_check_server):
    """The session's sglang_check_server (tests/server/configs.py): its tenants alice and
    bob are this module's; its router secret is the one every server started by
    builder.serve.server gets, as under `trident serve`."""
    environ = Path(f"/proc/{sglang_check_server.process.pid}/environ").read_bytes()
    assert f"{INTERFACE.ROUTER_SECRET_ENV}=".encode() in environ
    return sglang_check_server


def direct(server, *extra, max_tokens=40, request_id=None) -> Stream:
    """A stream straight to the engine model, as any client of Triton's port may open."""
    inputs = build_inputs(prompt="Count.", max_tokens=max_tokens) + list(extra)
    if request_id is not None:
        inputs.append(bad_requests.text("request_id", request_id))
    stream = Stream(server.grpc_url)
    stream.send(MODEL, inputs)
    return stream


def abort(server, request_id: str) -> list:
    """A second connection's abort of request_id; the errors it got."""
    control = Stream(server.grpc_url)
    control.send(MODEL, [bad_requests.text("abort_request_id", request_id)])
    try:
        return control.read(timeout_s=30).errors
    finally:
        control.close()


def finish(stream: Stream):
    try:
        return stream.read(timeout_s=60)
    finally:
        stream.close()


@pytest.mark.parametrize(
    "extra,name",
    [
        (lambda: bad_requests.text("cache_salt", "0" * 32), "cache_salt"),  # any tenant's salt
        (lambda: bad_requests.number("priority", 0), "priority"),
    ],
)  # the premium tier
def test_a_salt_or_a_priority_is_the_routers_to_set(server, extra, name):
    result = finish(direct(server, extra()))
    assert result.errors and result.errors[0].startswith(
        f"invalid request: {name} is set by the router only"
    ), result
    assert result.chunks == 0
    for tenant in ("alice", "bob"):  # the router sets both for them, with its proof
        answer = generate(
            server.grpc_url, "router", prompt="Count.", max_tokens=4, hints={"tenant": tenant}
        )
        assert not answer.errors and answer.output_tokens == 4, answer
        assert answer.served_by == MODEL


def test_a_second_connection_cannot_end_a_direct_clients_stream(server):
    victim_id = f"victim-{uuid.uuid4().hex}"
    victim = direct(server, request_id=victim_id)
    assert victim.read(until_chunks=2, timeout_s=60).chunks >= 2  # it is generating
    refused = abort(server, victim_id)
    assert refused and refused[0].startswith(
        "invalid request: abort_request_id is the router's own input"
    ), refused
    result = finish(victim)
    assert not result.errors and result.finish_reason == "length", result
    assert result.output_tokens == 40 and result.finals == 1
    check_sglang.check_abort(server, "router")  # a cancel through the router still aborts


def test_a_second_connection_cannot_abort_a_request_before_it_starts(server):
    victim_id = f"early-{uuid.uuid4().hex}"
    assert abort(server, victim_id)  # refused, forgotten
    result = finish(direct(server, request_id=victim_id, max_tokens=8))
    assert not result.errors and result.output_tokens == 8 and result.text, result
