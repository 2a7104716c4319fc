"""The frontend's gRPC call as batches: what arrived together is taken together, a lone
response is handed on at once, an error keeps its place after the pieces before it, and
cancel() stops both the reader and the gRPC call. A stand-in gRPC stream (an asyncio
queue) replaces tritonclient's; the responses are real InferResults."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException

from builder.serve.openai.errors import OpenAIError
from builder.serve.openai.triton import Call

END = object()


def result(text: str, finish: str = "", error: str = "") -> InferResult:
    response = service_pb2.ModelInferResponse()
    for name, value in (("text_output", text), ("finish_reason", finish), ("error", error)):
        out = response.outputs.add()
        out.name, out.datatype, out.shape[:] = name, "BYTES", [1]
        response.raw_output_contents.append(
            len(value.encode()).to_bytes(4, "little") + value.encode()
        )
    return InferResult(response)


class Stream:
    """tritonclient.grpc.aio's response iterator, fed by the test."""

    def __init__(self):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is END:
            raise StopAsyncIteration
        return item

    def cancel(self):
        self.cancelled = True


class Triton:
    url = "stand-in"

    def __init__(self):
        self.stream = Stream()
        self.client = self
        self.drained = []

    def stream_infer(self, _requests):
        return self.stream

    def _keep_draining(self, call):
        self.drained.append(call)


def texts(batch) -> list:
    return [piece.text for piece in batch]


def test_what_arrived_together_is_one_batch_and_a_lone_response_is_not_held():
    async def scenario():
        triton = Triton()
        call = Call(triton, "router", [])
        for text in ("a", "b", "c"):
            triton.stream.queue.put_nowait((result(text), None))
        batches = call.batches()
        assert texts(await batches.__anext__()) == ["a", "b", "c"]
        # The reader is waiting now: the next response alone is the next batch.
        asyncio.get_running_loop().call_later(
            0.01, triton.stream.queue.put_nowait, (result("d"), None)
        )
        assert texts(await asyncio.wait_for(batches.__anext__(), 5)) == ["d"]
        triton.stream.queue.put_nowait((result("", "stop"), None))
        triton.stream.queue.put_nowait((result("never read"), None))
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
            (result("", "error", "engine died"), None),
            (None, InferenceServerException(msg="unknown model 'x'")),
        ):
            triton = Triton()
            call = Call(triton, "router", [])
            triton.stream.queue.put_nowait((result("Hel"), None))
            triton.stream.queue.put_nowait((result("lo"), None))
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
