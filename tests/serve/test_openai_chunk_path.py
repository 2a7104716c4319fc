"""The frontend's per-chunk path after its third round of cuts: one gRPC channel for
streams and the index, a streamed response decoded straight from its protobuf, and SSE
bytes unchanged by any of it (each chunk's bytes are what json.dumps of its dict gives).
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from tritonclient.grpc import InferResult, service_pb2

from builder.serve.openai import choices
from builder.serve.openai.answers import Answer
from builder.serve.openai.protocol import parse_chat, parse_completion
from builder.serve.openai.tensors import first_values, read_response
from builder.serve.openai.triton import Call, Triton, TritonUnavailable, request_of

END = grpc.aio.EOF


def test_streams_and_the_index_share_one_grpc_channel(monkeypatch):
    """A second channel (tritonclient's aio client) was a second connection to the same
    server, with its own HTTP/2 state, for two reads every couple of seconds."""
    opened = []
    real = grpc.aio.insecure_channel

    def counted(target, *args, **kwargs):
        opened.append(target)
        return real(target, *args, **kwargs)

    monkeypatch.setattr(grpc.aio, "insecure_channel", counted)

    async def scenario():
        triton = Triton("127.0.0.1:1")  # nothing listens there
        with pytest.raises(TritonUnavailable) as caught:
            await triton.models(fresh=True)
        assert "127.0.0.1:1" in caught.value.message
        stream = triton.open_stream(request_of("router", [], "r1"))
        stream.cancel()
        await triton.close()

    asyncio.run(scenario())
    assert opened == ["127.0.0.1:1"]


def response(**outputs) -> service_pb2.ModelInferResponse:
    """Outputs as Triton sends them: raw bytes for strings and UINT32 counts; a tuple
    (datatype, value) is sent as typed contents, without raw bytes."""
    message = service_pb2.ModelInferResponse()
    raws = []
    for name, value in outputs.items():
        out = message.outputs.add()
        out.name, out.shape[:] = name, [1]
        if isinstance(value, tuple):
            out.datatype = value[0]
            out.contents.bytes_contents.append(value[1])
            continue
        if isinstance(value, str):
            out.datatype = "BYTES"
            raw = value.encode()
            raws.append(len(raw).to_bytes(4, "little") + raw)
        else:
            out.datatype = "UINT32"
            raws.append(value.to_bytes(4, "little"))
    if len(raws) == len(outputs):
        message.raw_output_contents.extend(raws)
    return message


def tritonclients_values(message) -> dict:
    """The first element of each output as tritonclient's own as_numpy decodes it."""
    result, values = InferResult(message), {}
    for output in message.outputs:
        value = result.as_numpy(output.name).reshape(-1)[0]
        values[output.name] = value.decode() if isinstance(value, bytes) else int(value)
    return values


def test_a_response_reads_as_tritonclient_decodes_it():
    cases = [
        response(
            text_output=" caf\u00e9",
            finish_reason="",
            num_input_tokens=37,
            num_output_tokens=6,
            served_by="smollm2",
            error="",
        ),
        response(text_output="", finish_reason="error", error="engine died"),
        response(text_output="x", finish_reason="length", tool_calls='[{"name": "f"}]'),
        # typed contents (no raw bytes at all): tritonclient's own decoding
        response(finish_reason=("BYTES", b"length")),
    ]
    for message in cases:
        assert first_values(message) == tritonclients_values(message)
    piece, error = read_response(cases[-1])
    assert piece.finish_reason == "length" and error is None


class Stream:
    def __init__(self, messages):
        self.messages = list(messages)

    async def read(self):
        await asyncio.sleep(0)
        return self.messages.pop(0) if self.messages else END

    def cancel(self):
        pass


class OneStream:
    url = "stand-in"

    def __init__(self, messages):
        self.messages = messages

    def open_stream(self, _request):
        return Stream(service_pb2.ModelStreamInferResponse(infer_response=m) for m in self.messages)

    def _keep_draining(self, call, timeout_s=None):
        pass


TEXTS = ["Hel", "lo", ' "q" \\', "\u4e16\u754c", "\0", "\U0001f600", "\n"]


@pytest.mark.parametrize(
    "generation",
    [
        parse_chat(
            {
                "model": "router",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            {},
        ),
        parse_completion({"model": "router", "prompt": "Say", "echo": True, "stream": True}),
    ],
)
def test_the_sse_body_is_each_chunks_json_as_json_dumps_writes_it(generation):
    """Every byte of a streamed answer, against the chunks built as dicts and encoded
    with json.dumps (what the body was before the encoder was shared)."""
    messages = [
        response(text_output=t, num_input_tokens=3, num_output_tokens=i + 1)
        for i, t in enumerate(TEXTS)
    ]
    messages.append(
        response(text_output="", finish_reason="length", num_input_tokens=3, num_output_tokens=7)
    )

    async def body() -> tuple[bytes, Answer]:
        call = Call(OneStream(messages), "router", [])
        answer = Answer(generation)
        feed = choices._Feed([call], "router")
        await feed.start()
        # one response per batch, as an idle path hands them on
        assert len(feed._held[0][1]) == 1
        return b"".join([out async for out in choices._events(answer, feed)]), answer

    sent, answer = asyncio.run(body())

    def sse(chunk: dict) -> bytes:
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()

    expected = sse(answer.chunk(TEXTS[0], first=True))
    expected += b"".join(sse(answer.chunk(t)) for t in TEXTS[1:])
    expected += sse(answer.chunk(None if answer.chat else "", "length"))
    if generation.include_usage:
        expected += sse(answer.usage_chunk(3, 7))
    assert sent == expected + b"data: [DONE]\n\n"
