"""A gRPC stream client that folds one streamed request into a Result: text, chunks,
final flags, finish reason, token count, served_by, TTFT. Used by the SGLang GPU check
(tests/gpu/check_sglang.py), the server tests and bench/tenant_check.py."""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass, field

import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs, first_output


@dataclass
class Result:
    text: str = ""
    chunks: int = 0
    finals: int = 0
    finish_reason: str = ""
    output_tokens: int = 0
    served_by: str = ""
    ttft_s: float = 0.0
    errors: list = field(default_factory=list)


class Stream:
    """One gRPC stream carrying one request; read() folds its responses into a Result."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        self.start = time.perf_counter()
        self.result = Result()

    def send(self, model: str, inputs: list) -> None:
        self.client.async_stream_infer(
            model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True
        )

    def read(self, until_chunks: int | None = None, timeout_s: float = 120.0) -> Result:
        while until_chunks is None or self.result.chunks < until_chunks:
            try:
                response, error = self.responses.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"no response within {timeout_s:.0f} s") from None
            if error is not None:
                self.result.errors.append(error.message())
                return self.result
            if self._absorb(response):
                return self.result
        return self.result

    def _absorb(self, response) -> bool:
        r = self.result
        text = first_output(response, "text_output")
        if text:
            r.ttft_s = r.ttft_s or time.perf_counter() - self.start
            r.chunks += 1
            r.text += text
        if first_output(response, "error"):
            r.errors.append(first_output(response, "error"))
        r.finish_reason = first_output(response, "finish_reason") or r.finish_reason
        r.output_tokens = int(first_output(response, "num_output_tokens") or r.output_tokens)
        r.served_by = first_output(response, "served_by") or r.served_by
        final = response.get_response().parameters.get("triton_final_response")
        if final and final.bool_param:
            r.finals += 1
            return True
        return False

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def generate(url: str, model: str, **inputs) -> Result:
    stream = Stream(url)
    try:
        stream.send(model, build_inputs(**inputs))
        return stream.read()
    finally:
        stream.close()
