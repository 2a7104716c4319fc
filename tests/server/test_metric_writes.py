"""Bad requests beside good ones at one engine model: the server keeps serving.

An engine model counts a bad request on the stub's main thread and a finished one on its
send thread, both in the same Triton counter. python_backend 2.51 rewrites a metric's own
shared-memory message without a lock once the GIL is released, so two threads writing one
series at once crashed tritonserver (signal 11) within the first few dozen requests of
this mix; trident_common/metrics.py now makes one such call at a time.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import tritonclient.grpc.aio as grpcaio

from builder.serve.client import build_inputs
from support import sglang_double

pytestmark = pytest.mark.server

WORKERS = 16  # half send bad requests, half good ones, each one after another
REQUESTS_PER_WORKER = 25  # the crash came within 20 requests of the mix


@pytest.fixture(scope="module")
def server(sglang_check_server):
    return sglang_check_server


async def _one(client: grpcaio.InferenceServerClient, bad: bool) -> str:
    """'ok', or the error's message."""
    inputs = build_inputs(
        messages=[{"role": "user", "content": "Say OK."}],
        max_tokens=-1 if bad else 4,
        stream=True,
        sampling={"temperature": 0},
    )

    async def request():
        yield {"model_name": sglang_double.MODEL, "inputs": inputs, "request_id": uuid.uuid4().hex}

    async for _, error in client.stream_infer(request()):
        if error is not None:
            return error.message()
    return "ok"


async def _mix(url: str) -> tuple[list[str], list[str]]:
    client = grpcaio.InferenceServerClient(url)
    bad: list[str] = []
    good: list[str] = []

    async def worker(is_bad: bool) -> None:
        for _ in range(REQUESTS_PER_WORKER):
            (bad if is_bad else good).append(await _one(client, is_bad))

    try:
        await asyncio.gather(*(worker(i % 2 == 0) for i in range(WORKERS)))
        after = await _one(client, False)  # still serving once the mix is over
    finally:
        await client.close()
    return bad, good + [after]


def test_bad_requests_beside_good_ones_leave_the_server_serving(server):
    bad, good = asyncio.run(_mix(server.grpc_url))
    half = WORKERS // 2 * REQUESTS_PER_WORKER
    assert len(bad) == half and all("max_tokens" in message for message in bad), bad[:3]
    assert good == ["ok"] * (half + 1), [g for g in good if g != "ok"][:3]
