"""Token pacing for the engine doubles: answer like a GPU engine, at a configured rate.

A GPU engine makes tokens in steps: each decode step gives every running request one
token, and a step takes the longer of the per-stream time (1 / tokens_per_s) and the
time the whole batch needs at the engine's batch-wide limit (running / batch_tokens_per_s).
A request's first token comes ttft_s after it arrives (its prefill), then it joins the
steps. The engine runs beside the process that relays its tokens (vLLM's engine core is
a process of its own; a GPU does not wait for the CPU), so tokens due while the consumer
was busy are not lost: the next read returns all of them at once, as vLLM's DELTA output
collector merges the outputs a slow reader has not taken yet.

`Rate` and `step_interval` are pure; `PacedBatch` is the clock on an asyncio loop, shared
by the AsyncLLM double (support/engine_doubles/vllm) and the SGLang double
(support/fake_sglang.py). A rate may come from a JSON control file that the benchmark
rewrites between load points; it is read again when its mtime changes, checked once
per new request (never per token).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rate:
    ttft_s: float = 0.05  # arrival to first token (prefill)
    tokens_per_s: float = 50.0  # per stream, while decoding
    batch_tokens_per_s: float = 0.0  # the whole engine's limit; 0: none

    @classmethod
    def from_dict(cls, values: dict) -> Rate:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"rate: unknown field(s) {unknown}")
        rate = cls(**{k: float(v) for k, v in values.items()})
        if rate.tokens_per_s <= 0 or rate.ttft_s < 0 or rate.batch_tokens_per_s < 0:
            raise ValueError(
                f"rate: tokens_per_s must be > 0, ttft_s and batch_tokens_per_s >= 0: {rate}"
            )
        return rate


def step_interval(rate: Rate, running: int) -> float:
    """Seconds per decode step with `running` requests in the batch."""
    per_stream = 1.0 / rate.tokens_per_s
    if rate.batch_tokens_per_s and running:
        return max(per_stream, running / rate.batch_tokens_per_s)
    return per_stream


class RateSource:
    """The rate now: a fixed Rate, or a control file read again when it changes."""

    def __init__(self, rate: Rate | None = None, control: str | None = None):
        self._rate, self._control, self._mtime = rate or Rate(), control, None

    def current(self) -> Rate:
        if self._control:
            try:
                mtime = os.stat(self._control).st_mtime_ns
            except OSError:
                return self._rate  # not written yet: keep the last one
            if mtime != self._mtime:
                with open(self._control) as f:
                    self._rate = Rate.from_dict(json.load(f))
                self._mtime = mtime
        return self._rate


@dataclass(eq=False)
class PacedStream:
    """One request's tokens: `made` so far, `taken` by its reader, up to `limit`."""

    limit: int
    arrived: float = 0.0
    made: int = 0
    taken: int = 0
    done: bool = False  # all made, or aborted
    first_at: float | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def take(self) -> int:
        """Wait for new tokens; how many there are (0: the stream ended, none left)."""
        while self.made == self.taken and not self.done:
            self.ready.clear()
            await self.ready.wait()
        new, self.taken = self.made - self.taken, self.made
        return new


class PacedBatch:
    """The engine's step clock on one asyncio loop. `on_step(stats)` (optional) is called
    after each step with what it made, as an engine reports its iteration stats."""

    def __init__(
        self,
        source: RateSource,
        clock: Callable[[], float] = time.monotonic,
        on_step: Callable[[StepStats], None] | None = None,
    ):
        self._source, self._clock, self._on_step = source, clock, on_step
        self.rate = source.current()
        self._running: set[PacedStream] = set()
        self._waiting = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def add(self, max_tokens: int) -> PacedStream:
        """A new request; its first token comes after the rate's ttft_s."""
        self.rate = self._source.current()
        stream = PacedStream(limit=max(1, max_tokens), arrived=self._clock())
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._steps())
        self._waiting += 1
        loop.call_later(self.rate.ttft_s, self._first_token, stream)
        return stream

    def abort(self, stream: PacedStream) -> None:
        stream.done = True
        self._running.discard(stream)
        stream.ready.set()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for stream in list(self._running):
            self.abort(stream)

    def _first_token(self, stream: PacedStream) -> None:
        self._waiting -= 1
        if stream.done:  # aborted during its prefill
            return
        stream.made, stream.first_at = 1, self._clock()
        if self._on_step is not None:
            self._on_step(
                StepStats(0, 1, [stream.first_at - stream.arrived], [], [], self._state())
            )
        if stream.made >= stream.limit:
            stream.done = True
        else:
            self._running.add(stream)
            self._wake.set()
        stream.ready.set()

    def _state(self) -> tuple[int, int]:
        return len(self._running), self._waiting

    async def _steps(self) -> None:
        last = self._clock()
        while True:
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                last = self._clock()
            interval = step_interval(self.rate, len(self._running))
            delay = last + interval - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            now = self._clock()
            # Steps due since the last one (more than one when this loop was late: the
            # engine does not wait for its reader).
            steps = max(1, int((now - last) / interval))
            last += steps * interval
            self._advance(steps, interval)

    def _advance(self, steps: int, interval: float) -> None:
        made, gaps, finished = 0, [], []
        for stream in list(self._running):
            new = min(steps, stream.limit - stream.made)
            stream.made += new
            made += new
            gaps += [interval] * new
            if stream.made >= stream.limit:
                stream.done = True
                self._running.discard(stream)
                finished.append(stream)
            stream.ready.set()
        if self._on_step is not None and made:
            self._on_step(StepStats(made, 0, [], gaps, finished, self._state()))


@dataclass
class StepStats:
    """What one step made: tokens after the first, first tokens (with their TTFTs), the
    gaps between tokens, the requests it finished, and (running, waiting) after it."""

    generated: int
    first_tokens: int
    ttfts: list
    token_gaps: list
    finished: list
    state: tuple
