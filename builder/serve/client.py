"""A small streaming client on tritonclient's gRPC API (`trident infer`, tests, bench)."""

from __future__ import annotations

import json
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from builder.errors import TridentError


class InferError(TridentError):
    """The server answered with an error, or did not answer."""


@dataclass
class GenerateResult:
    text: str = ""
    chunks: int = 0
    served_by: str = ""
    finish_reason: str = ""
    output_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    chunk_times: list = field(default_factory=list)


def _string(name: str, value: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return tensor


def _scalar(name: str, value, dtype: str, np_dtype) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], dtype)
    tensor.set_data_from_numpy(np.array([value], dtype=np_dtype))
    return tensor


def build_inputs(
    prompt: str | None = None,
    messages: list | None = None,
    max_tokens: int | None = None,
    stream: bool = True,
    sampling: dict | None = None,
    hints: dict | None = None,
    exclude_input_in_output: bool | None = None,
) -> list:
    inputs = []
    if prompt is not None:
        inputs.append(_string("text_input", prompt))
    if messages is not None:
        inputs.append(_string("messages", json.dumps(messages)))
    inputs.append(_scalar("stream", stream, "BOOL", bool))
    if max_tokens is not None:
        inputs.append(_scalar("max_tokens", max_tokens, "INT32", np.int32))
    if sampling:
        inputs.append(_string("sampling_parameters", json.dumps(sampling)))
    if exclude_input_in_output is not None:
        inputs.append(_scalar("exclude_input_in_output", exclude_input_in_output, "BOOL", bool))
    for name, value in (hints or {}).items():
        inputs.append(_string(name, value))
    return inputs


def first_output(result, name: str):
    """The first element of one output of a streamed result (decoded), or None."""
    array = result.as_numpy(name)
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value


_UNREACHABLE = "StatusCode.UNAVAILABLE"  # gRPC's status when nothing answers at the address


def _unreachable(model: str, url: str, error: grpcclient.InferenceServerException) -> InferError:
    return InferError(f"{model} at {url}: cannot reach Triton's gRPC endpoint ({error.message()})")


def _stream_error(
    responses: queue.Queue, wait_s: float = 1.0
) -> grpcclient.InferenceServerException | None:
    """The error the stream's callback got, if one comes within wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            _, error, _ = responses.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if error is not None:
            return error


def _next_response(responses: queue.Queue, model: str, timeout_s: float) -> tuple:
    """The stream's next (result, error, arrival time); InferError when none comes in time."""
    try:
        return responses.get(timeout=timeout_s)
    except queue.Empty:
        raise InferError(f"no response from {model} within {timeout_s:.0f} s") from None


def _answered_error(model: str, url: str, error: grpcclient.InferenceServerException) -> InferError:
    """The InferError for an error response the stream's callback got."""
    if error.status() == _UNREACHABLE:
        return _unreachable(model, url, error)
    return InferError(f"{model}: {error.message()}")


def _stream_failure(
    model: str, url: str, responses: queue.Queue, e: grpcclient.InferenceServerException
) -> InferError:
    """The InferError for a stream that failed: the cause its callback got, else e."""
    # A stream that never opened (nothing listening, say) reports why to the
    # callback; the exception itself only says the stream is no longer valid.
    cause = _stream_error(responses) or e
    if cause.status() == _UNREACHABLE:
        return _unreachable(model, url, cause)
    return InferError(f"{model} at {url}: {cause.message()}")


def stream_generate(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int = 64,
    chat: bool = True,
    on_text: Callable[[str], None] | None = None,
    sampling: dict | None = None,
    hints: dict | None = None,
    timeout_s: float = 300.0,
    client: grpcclient.InferenceServerClient | None = None,
) -> GenerateResult:
    """Stream one generation over gRPC; raises InferError on an error response."""
    own_client = client is None
    if client is None:
        client = grpcclient.InferenceServerClient(url)
    messages = [{"role": "user", "content": prompt}] if chat else None
    inputs = build_inputs(None if chat else prompt, messages, max_tokens, True, sampling, hints)
    responses: queue.Queue = queue.Queue()
    result = GenerateResult()
    start = time.perf_counter()
    finished = False
    try:
        client.start_stream(
            callback=lambda result, error: responses.put((result, error, time.perf_counter()))
        )
        client.async_stream_infer(
            model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True
        )
        while True:
            response, error, at = _next_response(responses, model, timeout_s)
            if error is not None:
                # The server answered (its final flag follows): the stream ends on its
                # own, so it is closed, not cancelled. Triton 2.51 keeps a request whose
                # cancel races that final flag, and its model then never unloads.
                finished = True
                raise _answered_error(model, url, error)
            if _absorb(result, response, at - start, on_text):
                finished = True
                break
    except grpcclient.InferenceServerException as e:
        raise _stream_failure(model, url, responses, e) from None
    finally:
        # Leaving before the server answered (a timeout, Ctrl-C), the request is
        # cancelled: closing the stream otherwise waits for the server to end it, for
        # ever if it never does (Triton 2.51 never ends the streams of a router request
        # whose stub was killed).
        client.stop_stream(cancel_requests=not finished)
        if own_client:
            client.close()
    result.total_s = time.perf_counter() - start
    return result


def _absorb(result: GenerateResult, response, at: float, on_text) -> bool:
    """Fold one streamed response into result; True when it was the final one."""
    final = response.get_response().parameters.get("triton_final_response")
    text = first_output(response, "text_output")
    if text is not None and not result.ttft_s:
        result.ttft_s = at  # the first token, even one that decodes to no text yet
    if text:
        result.chunks += 1
        result.chunk_times.append(at)
        result.text += text
        if on_text:
            on_text(text)
    result.served_by = first_output(response, "served_by") or result.served_by
    result.finish_reason = first_output(response, "finish_reason") or result.finish_reason
    result.output_tokens = int(first_output(response, "num_output_tokens") or result.output_tokens)
    return bool(final and final.bool_param)
