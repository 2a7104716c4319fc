"""How long an engine may take to start answering a request with a constraint (a
structured-output schema, regex or grammar, or a forced tool choice's schema), measured
from trident's side.

Why from trident's side: both engines compile a constraint into a grammar inside the
engine process, on a thread pool of their own, before the request is scheduled, and
neither says how long it has been at it. vLLM 0.32 bounds only a regex's compile
(VLLM_REGEX_COMPILATION_TIMEOUT_S, 5 s); a JSON schema or grammar compiles for as long as
it takes. SGLang gives up after SGLANG_GRAMMAR_MAX_POLL_ITERATIONS scheduler steps (10,000:
50 s at the least, minutes on a busy engine). Measured with xgrammar and SmolLM2's
tokenizer on a 2-core machine: everyday schemas compile in under 0.5 s, yet 3,000 optional
properties took 31 s and a 42-character `pattern` of `a{1,50000}` over 10 minutes. The
router meanwhile waits for a first token (first_token_timeout_s, 60 s by default), then
tries the same request on the next backend, which compiles it again, and counts the
timeout against the first backend's breaker (issue 34: both replicas ran past the timeout
on a heavy schema, and the requests behind it timed out too).

So a constrained request that gets no first output within COMPILE_TIMEOUT_S is ended as
the client's error (BadRequest, naming the parameter): the router neither retries it nor
counts it against the backend. A request behind older ones that have not started either
is waiting in the engine's queue, not compiling: it is given the benefit of the doubt
until every older one has started or ended. The json_object constraint is trivial
(structured.needs_compile) and never bounded here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from trident_common.faults import BadRequest

_T = TypeVar("_T")

# 30 s: half the router's default first_token_timeout_s (60 s), so the engine's verdict
# reaches the router before the router gives up on the backend and retries elsewhere; and
# 60 times what an everyday schema takes to compile on a 2-core CPU (0.5 s), so only a
# pathological constraint or an engine stalled for other reasons gets here.
COMPILE_TIMEOUT_S = 30.0
# Past the bound, while older requests still wait for their first output (the queue, not
# the compile, may be what holds this one), how often to look again.
RECHECK_S = 0.5
# How long a cancelled wait may take to unwind (the engine's request is aborted in it).
UNWIND_S = 5.0


class CompileTimeout(BadRequest):
    """The engine did not start answering a constrained request within the bound."""

    def __init__(self, tag: str, timeout_s: float):
        super().__init__(
            f"{tag}no output within {timeout_s:g} s: the engine was still compiling "
            "the constraint into a grammar. Compile time grows with optional properties "
            "and repetition counts ({n,m}, minLength) far more than with size: "
            "a simpler schema compiles in well under a second"
        )


class FirstOutputs:
    """The requests of one engine waiting for their first output, oldest first (a dict
    keeps the order in which they were handed to the engine). On the model's event loop
    only."""

    def __init__(self, timeout_s: float = COMPILE_TIMEOUT_S, recheck_s: float = RECHECK_S):
        self.timeout_s = timeout_s
        self.recheck_s = recheck_s
        self._waiting: dict[str, float] = {}

    def waiting(self) -> list[str]:
        return list(self._waiting)

    async def first(self, engine_id: str, output: Awaitable[_T], tag: str = "") -> _T:
        """await `output` (the engine's first output for engine_id). `tag` is the
        parameter tag of a constraint that needs compiling ("" for none): then no output
        within the bound, while no older request still waits, raises CompileTimeout
        (the wait for `output` is cancelled, which ends the engine's request)."""
        self._waiting[engine_id] = time.monotonic()
        try:
            if not tag:
                return await output
            return await self._bounded(engine_id, output, tag)
        finally:
            self._waiting.pop(engine_id, None)

    async def _bounded(self, engine_id: str, output: Awaitable[_T], tag: str) -> _T:
        task = asyncio.ensure_future(output)
        try:
            wait = self.timeout_s
            while True:
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    return task.result()
                if next(iter(self._waiting)) == engine_id:  # no older one waits
                    raise CompileTimeout(tag, self.timeout_s)
                wait = self.recheck_s
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=UNWIND_S)
                if task.done() and not task.cancelled():
                    task.exception()  # what it raised unwinding: retrieved, not logged
