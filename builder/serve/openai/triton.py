"""The Triton side of the OpenAI frontend: which models serve text, and one request as
one gRPC stream, cancellable.

The index and configs are read with tritonclient.grpc.aio. A request's stream is
Triton's ModelStreamInfer called as a unary-stream method: one request, then the
responses. On the wire that is what a bidirectional call with one request is (the
request, then the half-close), but gRPC sends the call's start, the request and the
half-close as one operation, where tritonclient's stream_infer (a request-iterator task,
a write, a half-close, two async generators) made three round trips through gRPC's
poller thread before the request left: 1 ms of the first token's path on the 2-core
host (docs/performance.md, "The OpenAI frontend's own cost").

A stream ends when Triton ends the gRPC call, once the request's final flag is sent
(the router's flags-only final included). The frontend may stop reading at the engine's
finish reason; the rest is drained in the background.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]  # no stubs in the venv
from google.protobuf.json_format import MessageToDict
from tritonclient.grpc import service_pb2

from builder.serve import admin
from builder.serve.openai.errors import OpenAIError, from_triton, model_not_found
from builder.serve.openai.protocol import Generation
from builder.serve.openai.tensors import ModelInfo, Piece, build_inputs, read_response
from builder.serve.openai.traces import TRACEPARENT
from trident_common import interface as _INTERFACE

INDEX_TTL_S = 2.0  # how long the repository index (ready models) is believed
# How long Triton's metrics text is reused: the endpoint picker may scrape every 50 ms, and
# each read is the whole text of Triton's metrics port.
METRICS_TTL_S = 0.2
DRAIN_TIMEOUT_S = 10.0  # after the finish reason: wait this long for the call to end
# After another choice of the same answer failed: how long a call may take to end on its
# own (its own refusal is milliseconds away when the router refused the fan-out whole).
ABANDON_GRACE_S = 1.0
# As tritonclient's channel: no limit of gRPC's own on a prompt's or answer's size (the
# frontend's limits.py bounds what a client may send).
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
SERVICE = "/inference.GRPCInferenceService/"
# The methods of Triton's service the frontend calls: name -> (shape, request, response).
RPCS = {
    "ModelStreamInfer": (
        "unary_stream",  # one request in, responses out: a stream that can be cancelled
        service_pb2.ModelInferRequest,
        service_pb2.ModelStreamInferResponse,
    ),
    "RepositoryIndex": (
        "unary_unary",
        service_pb2.RepositoryIndexRequest,
        service_pb2.RepositoryIndexResponse,
    ),
    "ModelConfig": ("unary_unary", service_pb2.ModelConfigRequest, service_pb2.ModelConfigResponse),
}


class TritonUnavailable(OpenAIError):
    def __init__(self, url: str, why: str):
        super().__init__(
            503,
            f"Triton at {url} does not answer: {why}",
            "server_error",
            None,
            "triton_unavailable",
        )


class Triton:
    """A gRPC connection to one tritonserver, made on the frontend's event loop: one
    grpc.aio channel carries the requests' streams and the index and config reads (a
    tritonclient aio client beside it was a second channel, with its own connection to
    the same server, for two calls every INDEX_TTL_S)."""

    def __init__(self, url: str, admin_key: str | None = None, metrics_url: str | None = None):
        self.url = url
        # Triton's metrics port, for the pod's load on /metrics (pod_metrics.py); None:
        # the frontend serves no /metrics.
        self.metrics_url = metrics_url
        self._metrics: tuple[float, str] = (-METRICS_TTL_S, "")
        # The index is behind trident's admin key (builder/serve/admin.py): `trident
        # serve` hands its own in; a separate frontend takes the operator's.
        self._admin = admin.grpc_headers(admin_key or os.environ.get(admin.KEY_ENV))
        self._channel: grpc.aio.Channel | None = None
        self._rpcs: dict[str, Any] = {}  # RPCS' methods on the channel, by name
        self._models: dict[str, ModelInfo] = {}
        self._configs: dict[tuple, ModelInfo | None] = {}  # (name, version) -> info
        self._index_at = -INDEX_TTL_S
        self._index_lock: asyncio.Lock | None = None
        self._draining: set = set()
        self._refreshing: asyncio.Future | None = None

    def _rpc(self, name: str) -> Any:
        """One of RPCS on the channel, which opens on first use (on the running loop)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            for rpc, (shape, request, response) in RPCS.items():
                self._rpcs[rpc] = getattr(self._channel, shape)(
                    SERVICE + rpc,
                    request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString,
                )
        return self._rpcs[name]

    def open_stream(self, request: service_pb2.ModelInferRequest):
        """A ModelStreamInfer call carrying `request` (grpc.aio's unary-stream call:
        read, cancel). The request leaves as soon as the loop runs. A traced request's
        traceparent goes along: Triton's spans are its children (traces.py). It goes as a
        request parameter too (interface.TRACEPARENT), for the router's span when
        tritonserver 2.51 loses the metadata's (tests/server/trace_parent_loss.py)."""
        traceparent = TRACEPARENT.get()
        if traceparent is None:
            return self._rpc("ModelStreamInfer")(request)
        request.parameters[_INTERFACE.TRACEPARENT].string_param = traceparent
        return self._rpc("ModelStreamInfer")(request, metadata=(("traceparent", traceparent),))

    async def _unary(self, name: str, request, headers: dict[str, str]) -> dict:
        """One unary call's answer as JSON (protobuf's field names, as tritonclient's
        as_json gives them)."""
        response = await self._rpc(name)(request, metadata=tuple(headers.items()))
        return MessageToDict(response, preserving_proto_field_name=True)

    async def close(self) -> None:
        for task in [*self._draining, self._refreshing]:
            if task is not None:
                task.cancel()
        if self._channel is not None:
            await self._channel.close()
            self._channel, self._rpcs = None, {}

    async def models(self, fresh: bool = False) -> dict[str, ModelInfo]:
        """The READY text models, by name (the repository index, briefly cached)."""
        if self._index_lock is None:
            self._index_lock = asyncio.Lock()
        async with self._index_lock:
            if fresh or time.monotonic() - self._index_at > INDEX_TTL_S:
                self._models = await self._read_index()
                self._index_at = time.monotonic()
        return self._models

    async def metrics_text(self) -> str:
        """The text of Triton's metrics port (briefly cached); "" when it does not answer."""
        at, text = self._metrics
        if self.metrics_url is None or time.monotonic() - at < METRICS_TTL_S:
            return text
        text = await asyncio.to_thread(_read_text, self.metrics_url)
        self._metrics = (time.monotonic(), text)
        return text

    async def _read_index(self) -> dict[str, ModelInfo]:
        try:
            index = await self._unary(
                "RepositoryIndex", service_pb2.RepositoryIndexRequest(), self._admin
            )
            models: dict[str, ModelInfo] = {}
            for entry in index.get("models", []):
                if entry.get("state") != "READY":
                    continue
                key = (entry["name"], entry.get("version", ""))
                if key not in self._configs:
                    asked = service_pb2.ModelConfigRequest(name=entry["name"])
                    config = await self._unary("ModelConfig", asked, {})
                    self._configs[key] = ModelInfo.from_config(config.get("config", {}))
                info = self._configs[key]
                if info is not None:
                    models[entry["name"]] = info
            return models
        except grpc.aio.AioRpcError as e:
            raise TritonUnavailable(self.url, _rpc_reason(e)) from None

    async def info(self, model: str) -> ModelInfo:
        """The model's info; 404 when it is not a READY text model. A model already
        known is answered from the cache, and a stale index is re-read in the
        background: a request never waits for the index (Triton's own answer says if
        the model has gone since, as a 404)."""
        found = self._models.get(model)
        if found is not None:
            if time.monotonic() - self._index_at > INDEX_TTL_S:
                self._refresh_index()
            return found
        found = (await self.models(fresh=True)).get(model)  # loaded a moment ago?
        if found is None:
            raise model_not_found(model)
        return found

    def _refresh_index(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self.models(fresh=True)
        except OpenAIError:
            pass  # Triton is away: the request that comes next says so

    def stream(self, generation: Generation, info: ModelInfo) -> Call:
        asked = {"lora_name": generation.lora_name, "route": generation.hints.get("route")}
        inputs = build_inputs(generation, info)
        return Call(self, info.name, inputs, asked, fan_out_parameters(generation, info))

    def _keep_draining(self, call: Call, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        task = asyncio.ensure_future(call.drain(timeout_s))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)


class Call:
    """One request's gRPC stream. Iterate `batches()` (or `pieces()`); `cancel()` aborts
    it in Triton (the engine stops); `finish()` after the finish reason lets the call end
    on its own.

    A reader task takes the responses off the stream as they come and the consumer takes
    all that arrived since its last turn: when the loop is busy, several responses go
    out as one SSE write (what costs the frontend most per chunk is the write to the
    client's socket, not the response's bytes); an idle path still hands each response
    on the moment it arrives, never holding one back for company."""

    def __init__(
        self,
        triton: Triton,
        model: str,
        inputs: list,
        asked: dict | None = None,
        parameters: dict[str, str | int] | None = None,
    ):
        self.triton, self.model = triton, model
        self.asked = asked  # what the client named (errors.from_triton)
        self.request_id = uuid.uuid4().hex
        self.done = False  # the call ended, or is no longer ours to end
        self.cancelled = False  # cancelled by cancel() (the client went away)
        self._ready: list[Piece] = []  # read, not yet taken by batches()
        self._failure: OpenAIError | None = None  # raised once _ready is taken
        self._ended = False  # the reader is done: finish reason, end or failure
        self._wake: asyncio.Future | None = None  # batches() waits on it
        self._reader: asyncio.Task | None = None

        self._stream = triton.open_stream(request_of(model, inputs, self.request_id, parameters))

    async def batches(self) -> AsyncIterator[list[Piece]]:
        """Every Piece that arrived since the last batch (never an empty batch), up to
        the one with a finish reason; raises OpenAIError for an error response (or an
        `error` output mid-stream) once the pieces before it are taken."""
        if self._reader is None and not self._ended:  # (ended: cut off before it began)
            self._reader = asyncio.ensure_future(self._read())
        # Looked up once per stream, not once per chunk: Python 3.11's
        # get_running_loop() makes a getpid() system call each time (its fork check).
        loop = asyncio.get_running_loop()
        while True:
            if not self._ready and not self._ended:
                self._wake = loop.create_future()
                await self._wake
            if self._ready:
                batch, self._ready = self._ready, []
                yield batch
            elif self._failure is not None:
                raise self._failure
            else:
                return

    async def pieces(self) -> AsyncIterator[Piece]:
        """The responses one by one (a whole answer has no use for batches)."""
        async for batch in self.batches():
            for piece in batch:
                yield piece

    async def _read(self) -> None:
        try:
            while True:
                try:
                    response = await self._stream.read()
                except asyncio.CancelledError:
                    self.done = True  # cancel(): the gRPC call is cancelled with us
                    return
                except Exception as e:  # grpc.aio.AioRpcError: cancelled, or the server left
                    self.done = True
                    if not self.cancelled and self._failure is None:  # (not cut off)
                        self._failure = TritonUnavailable(self.triton.url, _rpc_reason(e))
                    return
                if response is grpc.aio.EOF:
                    self.done = True
                    return
                if response.error_message:
                    self._failure = from_triton(response.error_message, self.model, self.asked)
                    return
                piece, problem = read_response(response.infer_response)
                if problem:
                    self._failure = from_triton(problem, self.model, self.asked)
                    return
                self._ready.append(piece)
                self._signal()
                if piece.finish_reason:
                    return
        finally:
            self._ended = True
            self._signal()

    def _signal(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Read to the end of the call (the final flag), cancelling it if that takes
        longer than timeout_s."""
        self.done = True
        try:

            async def rest():
                if self._reader is not None:
                    # Shielded: the reader swallows a cancel (see _read), so the
                    # timeout's cancel would otherwise end it and carry rest() on.
                    await asyncio.shield(self._reader)  # it stops at the finish reason
                while await self._stream.read() is not grpc.aio.EOF:
                    pass

            await asyncio.wait_for(rest(), timeout_s)
        except TimeoutError:
            self._stream.cancel()
            if self._reader is not None:
                self._reader.cancel()
        except Exception:
            pass

    def finish(self) -> None:
        """The answer is complete: let the call end in the background."""
        if not self.done:
            self.done = True
            self.triton._keep_draining(self)

    def abandon(self) -> None:
        """Another choice of this answer failed, so this one is not wanted. The router
        refuses a fan-out whole, so this call's own refusal is on its way, and a cancel
        now would race its final flag (cancel() says what Triton 2.51 does then: a CI
        check met a router that never unloaded after test_openai_errors' refused n=2).
        So the call is read to its end if that comes within ABANDON_GRACE_S, and
        cancelled if it is still running then."""
        if not self.done:
            self.done = True
            self.triton._keep_draining(self, ABANDON_GRACE_S)

    def cut_off(self, error: OpenAIError) -> None:
        """The drain's timeout: end the answer now with `error`. The consumer gets what
        was read, then the error, at once (a stream waiting for its next token is woken
        by the reader's end); Triton cancels the request. An answer already complete or
        abandoned is left alone."""
        if self.done or self._ended:
            return
        self._failure = error
        self.done = True
        self._stream.cancel()
        if self._reader is not None:
            self._reader.cancel()  # its finally ends batches() with the failure
        else:
            self._ended = True

    def cancel(self) -> None:
        """Cancel the gRPC call: Triton cancels the request, and trident's models abort
        it in the engine. A call Triton already answered to its end (the finish reason,
        or an error response: the reader stopped there) is finished instead, its final
        flag drained: Triton 2.51 leaks a stream whose cancel races that final flag, and
        the request it keeps holds its model, which then never unloads (after the tools
        path cancelled a refused call: issue 33)."""
        if self._ended and not self.done:
            self.finish()
            return
        if not self.done:
            self.done = self.cancelled = True
            self._stream.cancel()
        if self._reader is not None:
            self._reader.cancel()


def fan_out_parameters(generation: Generation, info: ModelInfo) -> dict[str, str | int] | None:
    """The request parameters of one of a fan-out's n choices, for a model that takes
    the tenant (a router: its tenant gate admits the n as one unit); None otherwise."""
    if generation.choice is None or "tenant" not in info.inputs:
        return None
    group, index = generation.choice
    return {
        _INTERFACE.FAN_OUT_GROUP: group,
        _INTERFACE.FAN_OUT_N: generation.n,
        _INTERFACE.FAN_OUT_INDEX: index,
    }


def request_of(
    model: str, inputs: list, request_id: str, parameters: dict[str, str | int] | None = None
) -> service_pb2.ModelInferRequest:
    """One inference request of tritonclient InferInputs, as tritonclient's own
    stream_infer builds it (each input's tensor and raw contents, from the accessors
    tritonclient's request builder reads), with its request parameters."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, value in (parameters or {}).items():
        if isinstance(value, str):
            request.parameters[name].string_param = value
        else:
            request.parameters[name].int64_param = value
    for tensor in inputs:
        request.inputs.append(tensor._get_tensor())
        content = tensor._get_content()
        if content is not None:
            request.raw_input_contents.append(content)
    return request


def _rpc_reason(error: Exception) -> str:
    details = getattr(error, "details", None)
    if callable(details):
        try:
            return str(details() or error)
        except Exception:
            pass
    return str(error) or type(error).__name__


def _read_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return ""
