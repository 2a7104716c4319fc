"""The router's control requests to its backends: aborts, and health probes of a backend
whose stream went silent. Both are BLS calls carrying only `abort_request_id` and the
router's proof for it (trust.py); they run on the router's event loop and never block a
stream."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

import triton_python_backend_utils as pb_utils

from bls.relay import Retired, first_error
from trident_common import trust
from trident_common.interface import ERRORS_IN_BAND, ROUTER_PROOF
from trident_common.request import CLIENT_FAULT_PREFIX

if TYPE_CHECKING:
    from bls.adapters import Adapters

SILENCE_PROBE_S = 2.0  # a stream quiet this long gets its backend health-probed
PROBE_TIMEOUT_S = 5.0  # no answer this fast: the backend is busy (not counted as dead)
PROBE_REQUEST_ID = "trident-router-health-probe"  # aborting it is a no-op


class AbortCounter(Protocol):
    """What the controls count on the router's metrics (RouterMetrics)."""

    def abort(self, backend: str) -> None: ...


class Controls:
    def __init__(
        self,
        adapters: Adapters,
        metrics: AbortCounter,
        pool: Executor,
        retired: Retired,
        proof_key: bytes | None = None,
    ) -> None:
        self.adapters, self.metrics, self.pool, self.retired = adapters, metrics, pool, retired
        self.proof_key = proof_key  # None: the engine models refuse the aborts
        self.loop: asyncio.AbstractEventLoop | None = None
        # control-request tasks (kept referenced until done)
        self.background: set[asyncio.Task[str | None]] = set()
        # backend → (its shared health-probe task, started at)
        self.probes: dict[str, tuple[asyncio.Task[str | None], float]] = {}

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on this event loop (the stub's; tests run several in turn)."""
        self.loop, self.probes = loop, {}

    def _bound(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:  # the model binds its loop before its first request
            raise RuntimeError("Controls used before bind()")
        return self.loop

    def abort(self, backend: str, request_id: str) -> None:
        """Tell the backend to abort a request (BLS response iterators cannot cancel)."""
        inputs = self.adapters[backend].abort_inputs(request_id)
        if inputs is None:
            return
        self.metrics.abort(backend)
        self._keep(self._bound().create_task(self._send(backend, inputs, request_id)))

    async def probe(self, backend: str) -> str | None:
        """None unless the backend answers a no-op control request with an error (stub
        dead, model unloaded). One probe per backend at a time, shared by every silent
        stream, and its answer reused for SILENCE_PROBE_S."""
        now = time.monotonic()
        task: asyncio.Task[str | None] | None
        task, started = self.probes.get(backend, (None, 0.0))
        if task is None or (task.done() and now - started >= SILENCE_PROBE_S):
            task = self._bound().create_task(self._probe(backend))
            self.probes[backend] = (task, now)
        return await asyncio.shield(task)

    def _keep(self, task: asyncio.Task[str | None]) -> None:
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _probe(self, backend: str) -> str | None:
        inputs = self.adapters[backend].abort_inputs(PROBE_REQUEST_ID)
        if inputs is None:
            return None  # no control input (TRT-LLM's ensemble): cannot tell
        control = self._bound().create_task(self._send(backend, inputs, PROBE_REQUEST_ID))
        done, _ = await asyncio.wait((control,), timeout=PROBE_TIMEOUT_S)
        if not done:
            # Slow is busy, not dead: a loaded engine answers late. A dead stub fails the
            # probe at once; a hung one is cut off by first_token_timeout_s / deadline_s.
            self._keep(control)
            return None
        problem = control.result()
        if problem is not None and problem.startswith(CLIENT_FAULT_PREFIX):
            return None  # it refused the abort (no router secret): a live stub answered
        return problem

    async def _send(
        self, backend: str, inputs: list[pb_utils.Tensor], request_id: str
    ) -> str | None:
        """Send a control request for request_id; the first error it gets, or None."""
        # Errors in band (interface.ERRORS_IN_BAND): an error response would never end
        # this call's iterator. So the `error` output is the one asked for.
        parameters: dict[str, Any] = {ERRORS_IN_BAND: True}
        if self.proof_key is not None:
            parameters[ROUTER_PROOF] = trust.abort_proof(self.proof_key, request_id)
        control = pb_utils.InferenceRequest(
            model_name=backend,
            inputs=inputs,
            requested_output_names=["error"],
            parameters=parameters,
        )
        try:
            responses = await control.async_exec(decoupled=True)
            loop = self._bound()
            problem: str | None = await loop.run_in_executor(
                self.pool, first_error, responses, self.retired, self.adapters[backend].split
            )
            return problem
        except Exception as e:  # stub unhealthy, not loaded
            return str(e) or type(e).__name__
