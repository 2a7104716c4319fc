"""The frontend's gRPC call as batches: what arrived together is taken together, a lone
response is handed on at once, an error keeps its place after the pieces before it, and
cancel() stops both the reader and the gRPC call. A stand-in gRPC stream (an asyncio
queue) replaces grpc.aio's ModelStreamInfer call; the responses are real
ModelStreamInferResponses."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2

from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.triton import Call

END = grpc.aio.EOF


def result(text: str, finish: str = "", error: str = "") -> service_pb2.ModelStreamInferResponse:
    response = service_pb2.ModelInferResponse()
    for name, value in (("text_output", text), ("finish_reason", finish), ("error", error)):
        out = response.outputs.add()
        out.name, out.datatype, out.shape[:] = name, "BYTES", [1]
        response.raw_output_contents.append(
            len(value.encode()).to_bytes(4, "little") + value.encode()
        )
    return service_pb2.ModelStreamInferResponse(infer_response=response)


class Stream:
    """grpc.aio's stream-stream call, its responses fed by the test."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.requests: list = []  # what the call was opened with

    async def read(self):
        return await self.queue.get()

    def cancel(self):
        self.cancelled = True


class Triton:
    url = "stand-in"

    def __init__(self):
        self.stream = Stream()
        self.drained = []

    def open_stream(self, request):
        self.stream.requests.append(request)
        return self.stream

    def _keep_draining(self, call, timeout_s=None):
        self.drained.append(call)
        if timeout_s is not None:  # abandon(): run the drain, to see how it ends
            self.draining = asyncio.ensure_future(call.drain(timeout_s))


def texts(batch) -> list:
    return [piece.text for piece in batch]


def test_what_arrived_together_is_one_batch_and_a_lone_response_is_not_held():
    async def scenario():
        triton = Triton()
        call = Call(triton, "router", [])
        for text in ("a", "b", "c"):
            triton.stream.queue.put_nowait(result(text))
        batches = call.batches()
        assert texts(await batches.__anext__()) == ["a", "b", "c"]
        # The reader is waiting now: the next response alone is the next batch.
        asyncio.get_running_loop().call_later(0.01, triton.stream.queue.put_nowait, result("d"))
        assert texts(await asyncio.wait_for(batches.__anext__(), 5)) == ["d"]
        triton.stream.queue.put_nowait(result("", "stop"))
        triton.stream.queue.put_nowait(result("never read"))
        last = await batches.__anext__()
        assert [p.finish_reason for p in last] == ["stop"]
        with pytest.raises(StopAsyncIteration):
            await batches.__anext__()
        call.finish()  # the finish reason ends our reading; the rest is drained
        assert triton.drained == [call] and not triton.stream.cancelled

    asyncio.run(scenario())


def test_an_error_comes_after_the_pieces_that_arrived_before_it():
    async def scenario():
        for failure in (
            result("", "error", "engine died"),
            service_pb2.ModelStreamInferResponse(error_message="unknown model 'x'"),
        ):
            triton = Triton()
            call = Call(triton, "router", [])
            triton.stream.queue.put_nowait(result("Hel"))
            triton.stream.queue.put_nowait(result("lo"))
            triton.stream.queue.put_nowait(failure)
            batches = call.batches()
            assert texts(await batches.__anext__()) == ["Hel", "lo"]
            with pytest.raises(OpenAIError):
                await batches.__anext__()

    asyncio.run(scenario())


def test_cancel_ends_the_batches_and_cancels_the_grpc_call():
    async def scenario():
        triton = Triton()
        call = Call(triton, "router", [])
        batches = call.batches()
        waiting = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 5)
        assert triton.stream.cancelled and call.cancelled

    asyncio.run(scenario())


def test_cancel_after_triton_answered_drains_the_call_instead_of_cancelling_it():
    """The tools path cancels its calls on any error, the refused one too. Triton has
    answered that one (its error response; the finish reason likewise) and ends the call
    on its own within a millisecond: a cancel then races the request's final flag, which
    Triton 2.51 loses, keeping the request and so its model, which never unloads
    (issue 33: the router after test_openai_tools' refusals)."""

    async def scenario(last):
        triton = Triton()
        call = Call(triton, "router", [])
        triton.stream.queue.put_nowait(last)
        try:
            async for _ in call.pieces():
                pass
        except OpenAIError:
            pass  # the refusal: the tools path cancels every call on it
        call.cancel()
        return triton, call

    refusal = service_pb2.ModelStreamInferResponse(error_message="invalid request: [tools] no")
    for last in (refusal, result("Hi", "stop")):
        triton, call = asyncio.run(scenario(last))
        assert not triton.stream.cancelled and not call.cancelled
        assert triton.drained == [call]


def test_an_abandoned_call_ends_on_its_own_within_the_grace_else_is_cancelled(monkeypatch):
    """A fan-out's sibling refused with it ends by its own final flag, never by a cancel
    racing that flag (cancel()'s docstring; a CI check met the router of
    test_openai_errors' refused n=2 never unloading); one still generating when the
    grace ends is cancelled."""
    from builder.serve.openai import triton as module

    monkeypatch.setattr(module, "ABANDON_GRACE_S", 0.2)

    async def scenario(refused: bool):
        triton = Triton()
        call = Call(triton, "router", [])
        reading = asyncio.ensure_future(call.batches().__anext__())  # the reader runs
        await asyncio.sleep(0.01)
        call.abandon()  # the sibling's refusal came first
        if refused:
            refusal = "invalid request: [n] no"
            triton.stream.queue.put_nowait(
                service_pb2.ModelStreamInferResponse(error_message=refusal)
            )
            triton.stream.queue.put_nowait(END)
        else:
            triton.stream.queue.put_nowait(result("still generating"))
        await asyncio.wait_for(triton.draining, 5)
        reading.cancel()
        return triton.stream.cancelled

    assert asyncio.run(scenario(refused=True)) is False
    assert asyncio.run(scenario(refused=False)) is True


def test_the_call_carries_the_one_request_as_tritonclient_would_build_it():
    from tritonclient.grpc._utils import _get_inference_request

    from builder.serve.openai.tensors import OneValue

    inputs = [
        OneValue("messages", [1], "BYTES", b"\x02\x00\x00\x00[]"),
        OneValue("max_tokens", [1], "INT32", b"\x07\x00\x00\x00"),
    ]

    async def scenario():
        triton = Triton()
        call = Call(triton, "router", inputs)
        triton.stream.queue.put_nowait(result("Hi", "stop"))
        assert [p.text async for p in call.pieces()] == ["Hi"]
        return triton.stream, call.request_id

    stream, request_id = asyncio.run(scenario())
    expected = _get_inference_request(
        model_name="router",
        inputs=inputs,
        model_version="",
        request_id=request_id,
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    assert stream.requests == [expected]
