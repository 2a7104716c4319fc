"""A decoupled Triton Python model around an asyncio LLM engine (vLLM, SGLang).

The engine lives on an event loop in a thread of its own; `execute` only parses each
request and schedules a coroutine on that loop, so Triton's thread never waits for the
engine. Subclasses say how to start the engine, map sampling parameters, stream deltas
and abort; everything else (interface, cancellation, errors, metrics) is here once.
"""
from __future__ import annotations

import abc
import asyncio
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from trident_common import devices
from trident_common.request import (AbortRequest, BadRequest, GenerateRequest,
                                    parse_generate)
from trident_common.triton_io import (FINAL, LlmMetrics, ResponseFactory, input_getter,
                                      send_error)

ENGINE_CONFIG_FILE = "model.json"
CANCEL_CHECK_S = 0.05   # how stale a client's cancellation may be before we notice it


@dataclass
class Delta:
    """New text since the previous delta, and the request's counts so far."""

    text: str
    finish_reason: Optional[str]
    input_tokens: int
    output_tokens: int


@dataclass
class _Active:
    engine_id: str
    task: "asyncio.Task"
    started: bool = False     # a data response has been sent


class AsyncEngineModel(abc.ABC):
    engine_name = "engine"

    # -- for subclasses -----------------------------------------------------------------
    @abc.abstractmethod
    async def start_engine(self, config: dict) -> None:
        """Create the engine from the rendered engine arguments (model.json)."""

    @abc.abstractmethod
    def make_sampling(self, request: GenerateRequest):
        """Engine sampling parameters for a request; raises BadRequest."""

    @abc.abstractmethod
    async def render_chat(self, messages: list) -> str:
        """The prompt for chat messages (the model's chat template)."""

    @abc.abstractmethod
    def stream(self, prompt: str, sampling, engine_id: str) -> AsyncIterator[Delta]:
        """Generate, yielding a Delta per engine output; the last has a finish_reason."""

    @abc.abstractmethod
    async def abort(self, engine_id: str) -> None:
        """Stop generating for engine_id and free its resources."""

    @abc.abstractmethod
    async def stop_engine(self) -> None:
        """Shut the engine down (model unload)."""

    # -- Triton's interface -------------------------------------------------------------
    def initialize(self, args: dict) -> None:
        self.model_name = args["model_name"]
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, ENGINE_CONFIG_FILE)) as f:
            config = json.load(f)
        apply_device_placement(args)
        self.responses = ResponseFactory(self.model_name)
        self.metrics = LlmMetrics(self.model_name)
        self._ids = itertools.count()
        self._active: dict[str, _Active] = {}
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever,
                                             name=f"{self.engine_name}-loop", daemon=True)
        self._loop_thread.start()
        try:
            self._run(self.start_engine(config))
        except BaseException:
            # Triton calls no finalize after a failed load: free the loop thread and the
            # metrics (before their families) here, so the stub exits cleanly.
            self._stop_loop()
            self.metrics.finalize()
            raise

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            arrival = time.monotonic()
            try:
                parsed = parse_generate(input_getter(request))
            except BadRequest as e:
                self._count_error()
                sender.send(self.responses.error(str(e), client_fault=True), flags=FINAL)
                continue
            if isinstance(parsed, AbortRequest):
                self.loop.call_soon_threadsafe(self._abort_by_client_id, parsed, sender)
            else:
                asyncio.run_coroutine_threadsafe(self._generate(parsed, sender, arrival),
                                                 self.loop)
        return None

    def finalize(self) -> None:
        try:
            for active in list(self._active.values()):
                self.loop.call_soon_threadsafe(active.task.cancel)
            self._run(self.stop_engine(), timeout=30)
        finally:
            self._stop_loop()
            self.metrics.finalize()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self._loop_thread.is_alive():
            self.loop.close()

    # -- internals ----------------------------------------------------------------------
    def _run(self, coroutine, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _count_error(self) -> None:
        self.metrics.errors.increment(1)
        self.metrics.requests.increment(1)

    def _abort_by_client_id(self, abort: AbortRequest, sender) -> None:
        """The router's abort: cancel the task that streams that request (which aborts
        it in the engine), then close the control request."""
        active = self._active.get(abort.request_id)
        if active is not None:
            active.task.cancel()
        sender.send(flags=FINAL)

    async def _generate(self, request: GenerateRequest, sender, arrival: float) -> None:
        engine_id = f"{self.model_name}-{next(self._ids)}"
        client_id = request.request_id or engine_id
        active = self._active[client_id] = _Active(engine_id, asyncio.current_task())
        self.metrics.in_flight.increment(1)
        try:
            prompt = request.prompt
            if prompt is None:
                prompt = await self.render_chat(request.messages)
            sampling = self.make_sampling(request)
            await self._relay(request, prompt, sampling, active, sender, arrival)
        except asyncio.CancelledError:
            await self._aborted(engine_id, sender)
        except BadRequest as e:
            self._count_error()
            self._send_error(sender, str(e), active.started, client_fault=True)
        except Exception as e:  # an engine failure: report it, keep serving
            self._count_error()
            self._send_error(sender, f"{self.engine_name} error: {e}", active.started)
        else:
            self.metrics.requests.increment(1)
        finally:
            self.metrics.in_flight.increment(-1)
            self._active.pop(client_id, None)

    async def _relay(self, request: GenerateRequest, prompt: str, sampling, active: _Active,
                     sender, arrival: float) -> None:
        """Stream the engine's deltas to the client (or collect them for one response).

        Per chunk this costs one send: metrics go to Triton once per request and the
        cancellation check (an IPC round trip) runs at most every CANCEL_CHECK_S."""
        pieces: list[str] = []
        final: Optional[Delta] = None
        first_at: Optional[float] = None
        next_check = arrival + CANCEL_CHECK_S
        async for delta in self.stream(prompt, sampling, active.engine_id):
            now = time.monotonic()
            if first_at is None and delta.output_tokens:
                first_at = now
                self.metrics.ttft.observe(now - arrival)
            if now >= next_check:
                next_check = now + CANCEL_CHECK_S
                if sender.is_cancelled():
                    raise asyncio.CancelledError
            if request.stream:
                sender.send(self.responses.chunk(delta.text, delta.finish_reason,
                                                 delta.input_tokens, delta.output_tokens),
                            flags=FINAL if delta.finish_reason else 0)
                active.started = True
            else:
                pieces.append(delta.text)
            if delta.finish_reason:
                final = delta
                break
        if final is None:
            raise RuntimeError("the engine ended the stream without a finish reason")
        self._record_tokens(final, first_at)
        if not request.stream:
            text = "".join(pieces)
            if request.prompt is not None and not request.exclude_input_in_output:
                text = request.prompt + text
            sender.send(self.responses.chunk(text, final.finish_reason, final.input_tokens,
                                             final.output_tokens), flags=FINAL)

    def _record_tokens(self, final: Delta, first_at: Optional[float]) -> None:
        self.metrics.prompt_tokens.increment(final.input_tokens)
        self.metrics.generation_tokens.increment(final.output_tokens)
        if first_at is not None and final.output_tokens > 1:
            # The mean gap between tokens after the first, one observation per request.
            self.metrics.itl.observe((time.monotonic() - first_at) / (final.output_tokens - 1))

    def _send_error(self, sender, message: str, started: bool,
                    client_fault: bool = False) -> None:
        try:
            send_error(sender, self.responses, message, started, client_fault)
        except Exception:
            pass  # the client is gone (or the sender closed): nothing left to tell it

    async def _aborted(self, engine_id: str, sender) -> None:
        try:
            await self.abort(engine_id)
        finally:
            self.metrics.aborted.increment(1)
            self.metrics.requests.increment(1)
            try:
                sender.send(flags=FINAL)
            except Exception:
                pass  # the client is gone; nothing left to tell it


def apply_device_placement(args: dict) -> None:
    """Bind this instance (its own stub process) to the devices the placement chose.

    `INSTANCE_DEVICES` is one entry per instance, ';'-separated; each entry is what
    CUDA_VISIBLE_DEVICES gets (GPU ordinals, or a MIG slice that devices.resolve turns
    into its UUID). The instance index is the
    last part of Triton's instance name (`<model>_<group>_<index>`)."""
    config = json.loads(args.get("model_config", "{}"))
    params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    per_instance = params.get("INSTANCE_DEVICES")
    if per_instance:
        entries = per_instance.split(";")
        index = int(args.get("model_instance_name", "x_0").rsplit("_", 1)[-1])
        os.environ["CUDA_VISIBLE_DEVICES"] = devices.resolve(entries[index % len(entries)],
                                                             devices.nvidia_smi_list)
    elif params.get("GPU_DEVICE_IDS"):
        os.environ["CUDA_VISIBLE_DEVICES"] = params["GPU_DEVICE_IDS"]
    elif args.get("model_instance_kind") == "GPU":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.get("model_instance_device_id", "0"))
