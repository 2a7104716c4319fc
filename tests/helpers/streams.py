"""A recording gRPC stream client for the server tests: every response, error and final
flag, with arrival times."""

from __future__ import annotations

import queue
import time
import uuid

import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs, first_output

GREEDY = {"temperature": 0}
ENDLESS = {"temperature": 0, "ignore_eos": True}  # streams that run until stopped


class Stream:
    """One gRPC stream to a model, recording every response (text, error, final flag)."""

    def __init__(
        self,
        server,
        model="router",
        prompt="Hello",
        chat=True,
        max_tokens=8,
        sampling=GREEDY,
        hints=None,
        parameters=None,
        raw_inputs=None,
        headers=None,
    ):
        self.events: queue.Queue = queue.Queue()
        self.texts, self.errors, self.finals, self.served_by = [], [], 0, set()
        self.responses = 0  # data responses, the final flag on one of them or alone
        self.chunk_times: list[float] = []
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(
            callback=lambda result, error: self.events.put((result, error, time.monotonic())),
            headers=headers,  # gRPC metadata of the stream (a traceparent, say)
        )
        messages = [{"role": "user", "content": prompt}] if chat else None
        inputs = raw_inputs or build_inputs(
            None if chat else prompt, messages, max_tokens, True, sampling, hints
        )
        self.started = time.monotonic()
        self.client.async_stream_infer(
            model,
            inputs,
            request_id=uuid.uuid4().hex,
            enable_empty_final_response=True,
            parameters=parameters,
        )

    def pump(self, timeout_s: float) -> bool:
        """Absorb responses until the final flag or timeout_s without one; True if final."""
        deadline = time.monotonic() + timeout_s
        while self.finals == 0:
            try:
                result, error, at = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            self._absorb(result, error, at)
        return True

    def wait_first_text(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.texts:
            result, error, at = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            self._absorb(result, error, at)
            assert not self.errors, self.errors

    def _absorb(self, result, error, at):
        if error is not None:
            self.errors.append(error.message())
            # Triton sends an error response and then a separate final flag; gRPC
            # surfaces the error alone, so the final is counted when it arrives.
            return
        self.responses += 1
        response = result.get_response()
        final = response.parameters.get("triton_final_response")
        text = first_output(result, "text_output")
        if text:
            self.texts.append(text)
            self.chunk_times.append(at)
        served = first_output(result, "served_by")
        if served:
            self.served_by.add(served)
        if final is not None and final.bool_param:
            self.finals += 1

    def extra_finals(self, settle_s: float = 0.3) -> int:
        """Responses after the final flag (there must be none)."""
        time.sleep(settle_s)
        extra = 0
        while not self.events.empty():
            self.events.get_nowait()
            extra += 1
        return extra

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def close(self, cancel=False):
        # A request without its final response is cancelled: stop_stream would otherwise
        # wait for it for ever, and a test whose server failed it would hang the run.
        self.client.stop_stream(cancel_requests=cancel or self.finals == 0)
        self.client.close()


def generate(server, **kwargs):
    stream = Stream(server, **kwargs)
    try:
        assert stream.pump(120), "no final response within 120 s"
        return stream
    finally:
        stream.close()
