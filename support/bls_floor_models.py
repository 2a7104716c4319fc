"""Three bare BLS relays (support/bls_floor.py installs them): the floor of a Python BLS hop
in front of an engine model, for the benchmarks. Loaded inside a Triton stub only."""

from __future__ import annotations

import collections
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import triton_python_backend_utils as pb_utils

from trident_common.interface import ERRORS_IN_BAND

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# A finished BLS iterator is kept past the stub's own cleanup of it (bls/relay.py's
# Retired says why); a benchmark's requests are few, so the last ones are simply kept.
KEPT = 4096
THREADS = 64  # the threaded relay's pool: as many as zero_cost's most concurrent streams


class _Relay:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        self.target = config["parameters"]["target"]["string_value"]
        self.outputs = [output["name"] for output in config["output"]]
        self.kept: collections.deque[Any] = collections.deque(maxlen=KEPT)

    def child(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceRequest:
        return pb_utils.InferenceRequest(
            model_name=self.target,
            inputs=request.inputs(),
            requested_output_names=self.outputs,
            # as the router asks: an error response would never end the BLS call
            parameters={ERRORS_IN_BAND: True},
        )

    def relay(self, responses: Any, sender: pb_utils.ResponseSender) -> None:
        """Send on each response of the engine as it comes, then the final flag; an
        error (in band: the `error` output) goes to the client as an error response, as
        the router sends it (the router also keeps its class: not needed here)."""
        response = next(responses, None)  # next(), never `for`: bls/relay.py's pump
        while response is not None:
            error = pb_utils.get_output_tensor_by_name(response, "error")
            message = error.as_numpy().item() if error is not None else b""
            if message:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(message.decode()))
                )
            elif response.output_tensors():
                sender.send(pb_utils.InferenceResponse(output_tensors=response.output_tensors()))
            response = next(responses, None)
        sender.send(flags=FINAL)
        self.kept.append(responses)


class BlockingRelay(_Relay):
    """Relays each request on the stub's main thread, before `execute` returns."""

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            self.relay(self.child(request).exec(decoupled=True), sender)


class AsyncRelay(_Relay):
    """python_backend's decoupled BLS example's way: `await async_exec(decoupled=True)`
    in an `async def execute`, the responses read on the stub's event loop."""

    async def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            self.relay(await self.child(request).async_exec(decoupled=True), sender)


class ThreadedRelay(_Relay):
    """The least a relay that serves many streams at once pays: a synchronous `execute`
    makes the BLS request on the stub's main thread and hands its call to a pool thread,
    which relays the stream (one thread hop; no event loop, no routing)."""

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="relay")

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for request in requests:
            # The BLS request is made here, on the main thread: the pool thread only
            # calls and relays (what a router routing here would hand over).
            self.pool.submit(self.call, self.child(request), request.get_response_sender())

    def call(self, child: pb_utils.InferenceRequest, sender: pb_utils.ResponseSender) -> None:
        try:
            self.relay(child.exec(decoupled=True), sender)
        except Exception as e:  # the pool would keep it silently: the client waits on it
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
