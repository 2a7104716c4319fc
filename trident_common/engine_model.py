"""A decoupled Triton Python model around an asyncio LLM engine (vLLM, SGLang).

The engine lives on an event loop in a thread of its own; `execute` only parses each
request and schedules a coroutine on that loop, so Triton's thread never waits for the
engine. Subclasses say how to start the engine, map sampling parameters, stream deltas
and abort; everything else (interface, cancellation, errors, metrics) is here once.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import functools
import gc
import itertools
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trident_common import tracing, trust
from trident_common.aborts import Aborts
from trident_common.compile_bound import CompileTimeout, FirstOutputs
from trident_common.deltas import Delta
from trident_common.drain import DrainWatch
from trident_common.error_classes import DRAINING, SHUTDOWN
from trident_common.interface import DRAIN_DIR_ENV, ROUTER_SECRET_ENV, TRACEPARENT
from trident_common.log import Log
from trident_common.outbox import Outbox, Outlet, quietly
from trident_common.placement import apply_device_placement
from trident_common.request import (
    AbortRequest,
    BadRequest,
    GenerateRequest,
    describe,
    parse_generate,
)
from trident_common.returns import Outputs
from trident_common.triton_io import (
    FINAL,
    LlmMetrics,
    ResponseFactory,
    errors_in_band,
    input_getter,
    request_parameters,
    send_error,
)

if TYPE_CHECKING:
    from typing import TypeVar

    # Annotations only: the stub adds pb_utils' classes after the model's files import.
    import triton_python_backend_utils as pb_utils

    from trident_common.metrics import Metric

    _T = TypeVar("_T")

ENGINE_CONFIG_FILE = "model.json"
CANCEL_CHECK_S = 0.05  # how stale a client's cancellation may be before we notice it
HEALTH_CHECK_S = 2.0  # how often the engine's health is checked (and the gauge set)
ABORT_TIMEOUT_S = 5.0  # an engine abort that takes longer is given up (the request ends)
OUTBOX_CLOSE_S = 5.0  # at unload, how long what is queued may take to go out


class EngineDead(Exception):
    """The engine cannot serve any request any more (e.g. vLLM's engine core died)."""


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Active:
    """One generation. All fields are touched on the model's event loop only."""

    engine_id: str
    client_id: str  # the router's request_id ("" for a direct client's request)
    sender: pb_utils.ResponseSender
    # Its responses' way out (outbox.py) and its task: both set by _start right after the
    # generation is made, before anything reads them (typed as set, hence the ignores).
    outlet: Outlet = None  # type: ignore[assignment]
    task: asyncio.Task[None] = None  # type: ignore[assignment]
    submitted: bool = False  # handed to the engine: abort it there if it ends early
    started: bool = False  # a data response has been sent
    closed: bool = False  # the final flag has been sent (or tried: the client left)
    dead: str | None = None  # why the engine died under this request
    cut: bool = False  # the drain's timeout ended it (drain.py)
    send_error: Exception | None = None  # sending one of its responses raised
    in_band: bool = False  # its caller takes errors in band (interface.ERRORS_IN_BAND)
    # Its span, when traces are on and the router sent a traceparent (tracing.py), and
    # what the span says when it ends.
    span: Any = None
    final: Delta | None = None
    ttft_s: float | None = None
    error: str | None = None


class AsyncEngineModel(abc.ABC):
    engine_name = "engine"

    # -- for subclasses -----------------------------------------------------------------
    @abc.abstractmethod
    async def start_engine(self, config: dict[str, Any]) -> None:
        """Create the engine from the rendered engine arguments (model.json)."""

    @abc.abstractmethod
    def make_sampling(self, request: GenerateRequest) -> Any:
        """Engine sampling parameters for a request; raises BadRequest."""

    @abc.abstractmethod
    async def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The prompt for chat messages and tools (the model's chat template)."""

    @abc.abstractmethod
    def stream(self, prompt: str, sampling: Any, engine_id: str) -> AsyncIterator[Delta]:
        """Generate, yielding a Delta per engine output; the last has a finish_reason."""

    @abc.abstractmethod
    async def abort(self, engine_id: str) -> None:
        """Stop generating for engine_id and free its resources."""

    @abc.abstractmethod
    async def stop_engine(self) -> None:
        """Shut the engine down (model unload)."""

    def engine_dead(self) -> str | None:
        """Why the engine can serve nothing any more, or None while it can. Called on
        the loop every HEALTH_CHECK_S and before each request: keep it cheap."""
        return None

    # -- Triton's interface -------------------------------------------------------------
    def initialize(self, args: dict[str, Any]) -> None:
        self.model_name = args["model_name"]
        self.instance_name = args.get("model_instance_name") or self.model_name
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, ENGINE_CONFIG_FILE)) as f:
            config = json.load(f)
        apply_device_placement(args)
        self.log = Log(self.engine_name)
        # Only the router's requests may set priority, cache_salt and abort ids (trust.py).
        self._proof_key = trust.proof_key(os.environ)
        if self._proof_key is None:
            self.log.info(
                f"no {ROUTER_SECRET_ENV}: no caller may set priority, "
                "cache_salt or abort_request_id"
            )
        self.responses = ResponseFactory(self.model_name)
        self._adapter_responses: dict[str, ResponseFactory] = {}  # served_by model:adapter
        self.metrics = LlmMetrics(self.model_name)
        self.traces = tracing.EngineTraces.from_env(
            os.environ, self.model_name, on_loss=self._count_lost_spans
        )
        # The spans lost on their way out (made only with traces on).
        self._trace_losses = self.metrics.trace_losses() if self.traces is not None else None
        self.outbox = Outbox(
            f"{self.engine_name}-send",
            lambda active, error: self.loop.call_soon_threadsafe(self._client_left, active, error),
        )
        self._ids = itertools.count()
        self._running: set[_Active] = set()
        self._aborts = Aborts()  # the router's request ids, and its early aborts
        # The subclasses' stream() awaits each request's first engine output through it:
        # a constraint that compiles too long is the client's error (compile_bound.py).
        self.first_outputs = FirstOutputs()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self.loop.run_forever, name=f"{self.engine_name}-loop", daemon=True
        )
        self._loop_thread.start()
        self.log.info(f"Starting the engine of model {self.model_name}")
        try:
            self._run(self.start_engine(config))
        except BaseException as e:
            self.log.error(f"The engine of model {self.model_name} failed to start: {describe(e)}")
            # Triton calls no finalize after a failed load: stop the loop thread and close
            # the metrics (later writes are dropped; the series stay, see metrics.py) here.
            self._stop_loop()
            self.outbox.close(OUTBOX_CLOSE_S)
            self.metrics.finalize()
            raise
        self._health = asyncio.run_coroutine_threadsafe(self._watch_health(), self.loop)
        # Started once the engine serves: a server that drains asks how busy it is.
        self.drain = DrainWatch(
            os.environ.get(DRAIN_DIR_ENV),
            self.instance_name,
            lambda: len(self._running),
            lambda: self.loop.call_soon_threadsafe(self._cut_off),
        )
        self.log.info(f"The engine of model {self.model_name} is ready")

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            arrival = time.monotonic()
            parameters = request_parameters(request)
            in_band = errors_in_band(parameters)
            try:
                parsed = parse_generate(input_getter(request), parameters, self._proof_key)
            except BadRequest as e:
                self._count(None, self.metrics.errors)
                quietly(send_error, sender, self.responses, str(e), False, True, in_band)
                continue
            except Exception as e:  # a defect of ours: still answer, and keep serving
                self.log.error(f"Could not read a request: {type(e).__name__}: {describe(e)}")
                self._count(None, self.metrics.errors)
                quietly(
                    send_error,
                    sender,
                    self.responses,
                    f"{self.engine_name} could not read the request: "
                    f"{type(e).__name__}: {describe(e)}",
                    False,
                    False,
                    in_band,
                )
                continue
            if isinstance(parsed, AbortRequest):
                self.loop.call_soon_threadsafe(self._abort_by_client_id, parsed, sender)
            elif self.drain.draining and (self.drain.cut or not parsed.proven):
                # The router's requests were admitted before the drain (it admits none
                # during one): they finish. Nobody else's start now.
                self._count(None, self.metrics.errors)
                quietly(send_error, sender, self.responses, self._refusal(), False, False, in_band)
            else:
                trace = None
                if self.traces is not None and parameters.get(TRACEPARENT):
                    trace = (str(parameters[TRACEPARENT]), time.time_ns())
                self.loop.call_soon_threadsafe(self._start, parsed, sender, arrival, in_band, trace)
        return None

    def finalize(self) -> None:
        self.log.info(f"Stopping the engine of model {self.model_name}")
        self.drain.close()
        try:
            self.loop.call_soon_threadsafe(self._health.cancel)
            for active in list(self._running):
                self.loop.call_soon_threadsafe(active.task.cancel)
            self._run(self.stop_engine(), timeout=30)
        finally:
            self._stop_loop()
            self.outbox.close(OUTBOX_CLOSE_S)  # the final flags of the cancelled ones
            self.metrics.finalize()
            if self.traces is not None:
                self.traces.close()
            gc.collect()  # any sender left in cyclic garbage: freed while the stub lives

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self._loop_thread.is_alive():
            self.loop.close()

    # -- internals ----------------------------------------------------------------------
    def _run(self, coroutine: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _count(self, active: _Active | None, outcome: Metric) -> None:
        """A request's outcome. Metric writes are round trips to the server: a request's
        go out on its outlet, in order with its responses (a client that got the last
        one finds it counted), so the loop never waits for them."""
        for metric in {outcome, self.metrics.requests}:  # a set: requests counts once
            if active is None:
                metric.increment(1)
            else:
                self._later(active, metric.increment, 1)

    def _count_relayed(self, outlet: Outlet) -> None:
        """On the outbox thread, after the last response: a client that left while its
        answer was on its way (the loop may be done first) makes it an aborted one."""
        self._count(None, self.metrics.aborted if outlet.stopped else self.metrics.requests)

    @staticmethod
    def _client_left(active: _Active | None, error: Exception | None) -> None:
        """(On the loop.) The outbox found the streaming client gone, or a send raised
        `error`: stop generating for it (_generate tells which). None: it had ended."""
        if active is None:
            return
        active.send_error = error
        if active.task is not None and not active.task.done():
            active.task.cancel()

    def _start(
        self,
        request: GenerateRequest,
        sender: pb_utils.ResponseSender,
        arrival: float,
        in_band: bool = False,
        trace: tuple[str, int] | None = None,
    ) -> None:
        """On the loop: register the generation and start its task in one step, so an
        abort queued after this request always finds it. Only the router's requests are
        registered by id: a direct client stops its own by cancelling its stream.
        `trace`: the router's traceparent and the arrival (ns since the epoch), for the
        request's span."""
        client_id = request.request_id if request.proven else ""
        if client_id and self._aborts.overtaken(client_id):
            self._count(None, self.metrics.aborted)  # aborted before it arrived: never start
            quietly(sender.send, None, FINAL)
            return
        active = _Active(f"{self.model_name}-{next(self._ids)}", client_id, sender, in_band=in_band)
        if trace is not None and self.traces is not None:
            active.span = self.traces.start(*trace, client_id or active.engine_id)
        active.outlet = Outlet(
            sender,
            None,  # type: ignore[arg-type]  # _relay sets build before it pushes a delta
            FINAL,
            arrival + CANCEL_CHECK_S,
            CANCEL_CHECK_S,
            owner=active,
        )
        if active.client_id:
            self._aborts.register(active.client_id, active)
        self._running.add(active)
        self._later(active, self.metrics.in_flight.increment, 1)
        active.task = self.loop.create_task(self._generate(request, active, arrival))
        # A done callback runs however the task ends, even when it is cancelled before
        # its first step (when none of _generate runs): the one place a request ends.
        active.task.add_done_callback(lambda _: self._finished(active))

    def _finished(self, active: _Active) -> None:
        self._close(active)
        if active.span is not None:
            final = active.final
            tracing.end(
                active.span,
                final.input_tokens if final else None,
                final.output_tokens if final else None,
                final.finish_reason if final else None,
                active.ttft_s,
                active.error,
            )
            active.span = None
        self._later(active, self.metrics.in_flight.increment, -1)
        self._running.discard(active)
        self._aborts.unregister(active.client_id, active)
        # Breaks the active <-> outlet cycle: collected at the stub's exit, its sender
        # segfaults in ~ResponseSender (tests/server/test_reload.py, the vLLM reloads).
        active.outlet.owner = None

    def _abort_by_client_id(self, abort: AbortRequest, sender: pb_utils.ResponseSender) -> None:
        """The router's abort (parse_generate checked its proof): cancel the task that
        streams that request (which aborts it in the engine), then close the control
        request. Only the router's ids are registered: the engine's own ids cannot be
        aborted from outside."""
        # What _start registered, or None (then remembered for its request)
        active: _Active | None = self._aborts.take(abort.request_id)  # type: ignore[assignment]
        if active is not None:
            active.task.cancel()
        quietly(sender.send, None, FINAL)

    async def _generate(self, request: GenerateRequest, active: _Active, arrival: float) -> None:
        try:
            dead = self.engine_dead()
            if dead is not None:
                raise EngineDead(dead)
            prompt = request.prompt
            if prompt is None:
                # parse_generate: a request without a prompt has messages
                prompt = await self.render_chat(request.messages, request.tools)  # type: ignore[arg-type]
            sampling = self.make_sampling(request)
            if active.span is not None:  # this task's context only: its engine's spans' parent
                tracing.ENGINE_SPAN.set(active.span)
            active.submitted = True
            await self._relay(request, prompt, sampling, active, arrival)
            self._later(active, self._count_relayed, active.outlet)
            return
        except asyncio.CancelledError:
            if active.dead is not None:  # cancelled by the health check: not an abort
                self._fail(active, f"{self.engine_name} engine is dead: {active.dead}")
            elif active.cut:
                self._fail(active, self._refusal())
            elif active.send_error is not None:
                self._failed(active, active.send_error)
            else:
                self.log.info(f"Cancelling the request {active.client_id or active.engine_id}")
                self._count(active, self.metrics.aborted)
                self._close(active)  # now: the engine's abort below may be slow
        except BadRequest as e:
            if isinstance(e, CompileTimeout):  # the engine may go on compiling it a while
                self.log.warning(
                    f"Request {active.client_id or active.engine_id}: no output within "
                    f"{self.first_outputs.timeout_s:g} s for a constrained request: "
                    "ended as the client's error"
                )
            self._fail(active, str(e), client_fault=True)
        except Exception as e:
            self._failed(active, e)
        if active.submitted:  # it may still be generating: stop it
            await self._abort_quietly(active.engine_id)

    def _failed(self, active: _Active, error: Exception) -> None:
        """Classify a failure: the client left, the engine died, or the engine failed."""
        dead = self.engine_dead()
        if dead is not None or isinstance(error, EngineDead):
            self._fail(active, f"{self.engine_name} engine is dead: {dead or describe(error)}")
        elif self._client_gone(active):
            self._count(active, self.metrics.aborted)  # e.g. a send to a cancelled client raised
            active.closed = True
        else:
            self._fail(active, f"{self.engine_name} error: {describe(error)}")

    @staticmethod
    def _client_gone(active: _Active) -> bool:
        if active.closed:
            # Its final flag went out (or was tried: a failed final send here). Triton
            # 2.51 deleted the request's response factory with it, and would answer
            # is_cancelled() from the freed memory: tritonserver may segfault.
            return True
        try:
            return bool(active.sender.is_cancelled())
        except Exception:
            return True  # the sender itself is unusable: nobody can be told anything

    async def _abort_quietly(self, engine_id: str) -> None:
        try:
            await asyncio.wait_for(self.abort(engine_id), ABORT_TIMEOUT_S)
        except asyncio.CancelledError:
            pass  # cancelled again while aborting (client cancel and router abort): done
        except Exception as e:  # the request has ended for the client: only say so
            self.log.warning(f"Aborting {engine_id} in the engine failed: {describe(e)}")

    async def _watch_health(self) -> None:
        """Set the health gauge; when the engine died, end the requests in flight with an
        error (they would otherwise wait forever for an engine that will not answer)."""
        reported = False
        while True:
            dead = self.engine_dead()
            self.metrics.engine_healthy.set(0 if dead else 1)
            if dead is not None and not reported:
                reported = True
                self.log.error(f"The engine of model {self.model_name} died: {dead}")
            if dead is not None:
                for active in list(self._running):
                    if active.dead is None:
                        active.dead = dead
                        active.task.cancel()
            await asyncio.sleep(HEALTH_CHECK_S)

    def _count_lost_spans(self, dropped: int, failed: int) -> None:
        """SpanLosses' on_loss, on the thread that counted the loss (the loop, at a span's
        end, or the SDK's export thread): the counter writes are the outbox thread's."""
        for metric, lost in zip(self._trace_losses or (), (dropped, failed), strict=False):
            if lost:
                self.outbox.call(metric.increment, lost)

    def _refusal(self) -> str:
        """Why a draining server's model takes no request (error_classes.py)."""
        if self.drain.cut:
            return SHUTDOWN.mark(
                f"{self.model_name}: the server is stopping and its drain timeout ended this answer"
            )
        return DRAINING.mark(
            f"{self.model_name}: the server is draining and takes no new requests; retry on another"
        )

    def _cut_off(self) -> None:
        """(On the loop.) The drain's timeout passed: end what still runs, with an error."""
        if self._running:
            self.log.warning(
                f"The drain timeout ended {len(self._running)} requests of {self.model_name}"
            )
        for active in list(self._running):
            active.cut = True
            active.task.cancel()

    async def _relay(
        self, request: GenerateRequest, prompt: str, sampling: Any, active: _Active, arrival: float
    ) -> None:
        """Hand the engine's deltas to the stream's outlet (or collect them for one
        response). The loop never waits for the server: responses, metric writes and a
        streaming client's cancellation checks are the outbox thread's (outbox.py)."""
        pieces: list[str] = []
        final: Delta | None = None
        first_at: float | None = None
        next_check = arrival + CANCEL_CHECK_S
        responses = self.responses_for(request)
        outputs, usual = Outputs(request.returns, request.stream), request.returns is None

        # On the outbox thread, for one response.
        def build(delta: Delta) -> pb_utils.InferenceResponse:
            if delta.finish_reason:  # counted before the final flag lets the client go
                self._record_tokens(delta, first_at)
            return responses.chunk(outputs.values(delta, delta.text), usual)

        active.outlet.build = build
        async for delta in self.stream(prompt, sampling, active.engine_id):
            if first_at is None and delta.output_tokens:
                first_at = time.monotonic()  # written after this token's send (defer)
                active.ttft_s = first_at - arrival
                self.outbox.defer(
                    active.outlet, functools.partial(self.metrics.ttft.observe, first_at - arrival)
                )
            if delta.finish_reason:
                final = active.final = delta
            if request.stream:
                active.closed = final is not None  # the outlet sends its final flag
                self.outbox.push(active.outlet, delta)
                active.started = True
            else:
                # No response to check it with: a round trip here, now and then.
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CANCEL_CHECK_S
                    if active.sender.is_cancelled():
                        raise asyncio.CancelledError
                outputs.take(delta)
                pieces.append(delta.text)
            if final is not None:
                break
        if final is None:
            raise RuntimeError("the engine ended the stream without a finish reason")
        if not request.stream:
            text = "".join(pieces)
            if request.prompt is not None and not request.exclude_input_in_output:
                text = request.prompt + text
            active.closed = True
            self.outbox.push(active.outlet, dataclasses.replace(final, text=text))

    def responses_for(self, request: GenerateRequest) -> ResponseFactory:
        """Answers of a LoRA adapter say so: served_by is `model:adapter`. (Only known
        adapters get here: make_sampling refused the others.)"""
        name = request.lora_name
        if not name:
            return self.responses
        self.metrics.adapter_requests(name).increment(1)
        if name not in self._adapter_responses:
            self._adapter_responses[name] = ResponseFactory(f"{self.model_name}:{name}")
        return self._adapter_responses[name]

    def _record_tokens(self, final: Delta, first_at: float | None) -> None:
        self.metrics.prompt_tokens.increment(final.input_tokens)
        self.metrics.generation_tokens.increment(final.output_tokens)
        if first_at is not None and final.output_tokens > 1:
            # The mean gap between tokens after the first, one observation per request.
            self.metrics.itl.observe((time.monotonic() - first_at) / (final.output_tokens - 1))

    def _close(self, active: _Active) -> None:
        """The final flag (flags only), unless the request already had it."""
        if not active.closed:
            active.closed = True
            self._later(active, active.sender.send, None, FINAL)  # run quietly there

    def _later(self, active: _Active, function: Callable[..., None], *args: Any) -> None:
        """function(*args) on the outbox thread, after what the request queued before."""
        self.outbox.push(active.outlet, functools.partial(function, *args))

    def _fail(self, active: _Active, message: str, client_fault: bool = False) -> None:
        """End a request with an error (and the final flag), once."""
        self._count(active, self.metrics.errors)
        active.error = active.error or message
        if not client_fault:
            self.log.error(f"Request {active.client_id or active.engine_id} failed: {message}")
        if active.closed:
            return
        active.closed = True
        self._later(
            active,
            send_error,
            active.sender,
            self.responses,
            message or "unknown error",
            active.started,
            client_fault,
            active.in_band,
        )
