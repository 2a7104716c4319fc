"""gpu_rate's clients: one asyncio loop, one streamed request per concurrent stream, every
text response's arrival time and token count recorded (bench.rate_stats.Request).

- gRPC (the engine model direct, or `router`): one tritonclient.grpc.aio client for all
  streams, each request on its own gRPC stream; the token count is the cumulative
  `num_output_tokens` every response carries.
- HTTP SSE (the OpenAI frontend): /v1/completions with stream and usage, one httpx
  connection per stream, SSE split by hand (no openai package, whose parsing would count
  against the frontend). The doubles' tokens are the words " w<i>", so a chunk's tokens
  are counted from its text; the usage at the end must agree.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import tritonclient.grpc.aio as grpcaio

from bench.rate_stats import Request
from builder.serve.client import build_inputs, first_output

PROMPT = "Write a long story about a lighthouse keeper."
SAMPLING = {"temperature": 0, "ignore_eos": True}


class GrpcPath:
    def __init__(self, url: str, model: str):
        self.model = model
        self.client = grpcaio.InferenceServerClient(url)

    async def one(self, tokens: int) -> Request:
        inputs = build_inputs(
            prompt=PROMPT,
            max_tokens=tokens,
            stream=True,
            sampling=SAMPLING,
            exclude_input_in_output=True,
        )

        async def requests():
            yield {"model_name": self.model, "inputs": inputs, "request_id": uuid.uuid4().hex}

        request = Request(time.perf_counter())
        async for result, error in self.client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(f"{self.model}: {error.message()}")
            at = time.perf_counter()
            if first_output(result, "text_output"):
                request.add(at, int(first_output(result, "num_output_tokens") or 0))
            problem = first_output(result, "error")
            if problem:
                raise RuntimeError(f"{self.model}: {problem}")
        if request.output_tokens != tokens:
            raise RuntimeError(f"{self.model}: {request.output_tokens} tokens, wanted {tokens}")
        return request

    async def close(self) -> None:
        await self.client.close()


class AnchorPath(GrpcPath):
    """Triton's vllm_backend model over gRPC, in its own dialect (bench/anchor.py's
    request): its responses carry each one's own num_output_tokens, summed here."""

    async def one(self, tokens: int) -> Request:
        from bench.anchor import _inputs

        async def requests():
            yield {
                "model_name": self.model,
                "inputs": _inputs(PROMPT, tokens),
                "request_id": uuid.uuid4().hex,
            }

        request, count = Request(time.perf_counter()), 0
        async for result, error in self.client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(f"{self.model}: {error.message()}")
            at = time.perf_counter()
            counts = result.as_numpy("num_output_tokens")
            new = int(counts.reshape(-1)[0]) if counts is not None and counts.size else 0
            if new:
                count += new
                request.add(at, count)
        if count != tokens:
            raise RuntimeError(f"{self.model}: {count} tokens, wanted {tokens}")
        return request


def sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The complete `data:` payloads in buffer, and the unfinished rest."""
    *events, rest = buffer.split(b"\n\n")
    return [e[len(b"data: ") :] for e in events if e.startswith(b"data: ")], rest


class HttpPath:
    def __init__(self, url: str, model: str, streams: int):
        self.url, self.model = url + "/v1/completions", model
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        self.client = httpx.AsyncClient(timeout=600, limits=limits)

    async def one(self, tokens: int) -> Request:
        body = {
            "model": self.model,
            "prompt": PROMPT,
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **SAMPLING,
        }
        request, count, usage, buffer = Request(time.perf_counter()), 0, None, b""
        async with self.client.stream("POST", self.url, json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(
                    f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                )
            async for data in response.aiter_raw():
                at = time.perf_counter()
                events, buffer = sse_events(buffer + data)
                for event in events:
                    if event == b"[DONE]":
                        continue
                    chunk = json.loads(event)
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"].get("message", chunk["error"]))
                    if chunk.get("usage"):
                        usage = chunk["usage"]["completion_tokens"]
                    text = chunk["choices"][0].get("text") if chunk.get("choices") else ""
                    if text:
                        count += text.count(" w")
                        request.add(at, count)
        if usage != tokens or count != tokens:
            raise RuntimeError(f"frontend: {count} tokens counted, usage {usage}, wanted {tokens}")
        return request

    async def close(self) -> None:
        await self.client.aclose()


async def load_point(path, streams: int, tokens: int, timeout_s: float) -> tuple[list, int]:
    """`streams` requests at once; (the answered ones, how many failed)."""
    results = await asyncio.wait_for(
        asyncio.gather(*(path.one(tokens) for _ in range(streams)), return_exceptions=True),
        timeout_s,
    )
    answered = [r for r in results if isinstance(r, Request)]
    failures = [r for r in results if not isinstance(r, Request)]
    if failures:
        print(
            f"gpu_rate: {len(failures)} of {streams} requests failed: "
            f"{type(failures[0]).__name__}: {failures[0]}",
            flush=True,
        )
    return answered, len(failures)
