"""Every answer of the generation routes, whole or streamed: its choices' Triton calls
read into OpenAI's JSON or SSE chunks, one path for one choice and for n.

`n` is a fan-out: one Triton call per choice, all at once, each answer tagged with its
choice index (the engine models relay one sequence per request, so the engine's own `n`
is not used). With a `seed`, choice i samples with seed + i: reproducible, yet the
choices differ. Usage counts the prompt once (as OpenAI bills it) and the completion
tokens of every choice.

Per token (the path a GPU's token rate runs through): one choice is read straight from
its call, several through one queue fed by a task per call; a batch of plain text (no
logprobs, no tool calls) is one chunk from the answer's template (answers.py
text_chunk_json), a dict built and encoded only for the rest; a batch goes out as soon
as it is read, but the batch that ends the answer leaves with the end (finish reason,
usage, [DONE]) in one write. An error before the stream starts is a real 4xx/5xx; a
later one is an `error` event, then [DONE]; a client that leaves cancels every call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from builder.serve.openai import tools as chat_tools
from builder.serve.openai.answers import Answer, usage
from builder.serve.openai.asgi import SSEResponse
from builder.serve.openai.draining import DrainGate
from builder.serve.openai.errors import OpenAIError, client_closed, no_finish_reason
from builder.serve.openai.protocol import Generation
from builder.serve.openai.tensors import ModelInfo, Piece

SERVED_BY_HEADER = "X-Trident-Served-By"  # which engine model answered
DONE = b"data: [DONE]\n\n"  # an SSE stream's last event


def choice_generations(generation: Generation) -> list[Generation]:
    """One generation per choice: the same request, the seed moved on per choice, each
    choice marked with the fan-out's group (a random id per request) and its index, so
    that a router's tenant gate admits the n as one unit (bls/tenants.py)."""
    if generation.n == 1:
        return [generation]
    seed = generation.sampling.get("seed")
    group = secrets.token_hex(16)
    return [
        dataclasses.replace(
            generation,
            sampling=generation.sampling
            if seed is None
            else {**generation.sampling, "seed": seed + i},
            choice=(group, i),
        )
        for i in range(generation.n)
    ]


async def respond(
    triton, request: Request, generation: Generation, info: ModelInfo, drain: DrainGate
):
    """The answer (JSONResponse or SSEResponse) of a generation request. Each call is
    tracked by the drain, so that its cut_off() ends the answer."""
    calls = [triton.stream(g, info) for g in choice_generations(generation)]
    for call in calls:
        drain.track(call)
    answer = Answer(generation)
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, calls))
    feed = None
    try:
        if not generation.stream:
            return await _whole(answer, calls)
        feed = _Feed(calls, generation.model)
        served_by = await feed.start()
    except OpenAIError:
        # A choice failed before the answer began: the others end on their own if they
        # are about to (a fan-out is refused whole), else they are cancelled.
        if feed is not None:
            feed.close(set(), failed=True)
        for call in calls:
            call.abandon()
        raise
    except BaseException:
        if feed is not None:
            feed.close(set())  # every call cancelled, every reader stopped
        for call in calls:
            call.cancel()
        raise
    finally:
        watcher.cancel()  # from here on the SSE response watches the client
    return SSEResponse(
        _events(answer, feed),
        {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **_served(served_by)},
        # A client gone before the events began: their `finally` never runs.
        lambda: feed.close(set()),
    )


def _served(served_by: str) -> dict:
    """Which engine model answered (known at the first response), as a header."""
    return {SERVED_BY_HEADER: served_by} if served_by else {}


async def _cancel_on_disconnect(request: Request, calls: list) -> None:
    """Cancel the calls when the client disconnects before the answer starts."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            for call in calls:
                call.cancel()
            return


# -- whole answers ----------------------------------------------------------------------------


async def _whole(answer: Answer, calls: list) -> JSONResponse:
    if len(calls) == 1:  # no gather's task for the common case
        results = [await _one_whole(answer, calls[0], 0)]
    else:
        results = await asyncio.gather(
            *(_one_whole(answer, call, i) for i, call in enumerate(calls))
        )
    body = answer.head(streamed=False)
    body["choices"] = [choice for choice, _ in results]
    lasts = [last for _, last in results]
    body["usage"] = usage(lasts[0].input_tokens, sum(p.output_tokens for p in lasts))
    return JSONResponse(body, headers=_served(lasts[0].served_by))


async def _one_whole(answer: Answer, call, index: int) -> tuple[dict, Piece]:
    texts: list[str] = []
    positions: list[Any] = []
    last: Piece | None = None
    async for piece in call.pieces():
        texts.append(piece.text)
        if piece.logprobs:
            positions.extend(piece.logprobs)
        last = piece
    if call.cancelled:
        raise client_closed()
    if last is None or not last.finish_reason:
        raise no_finish_reason(answer.generation.model)
    call.finish()
    choice = answer.whole_choice("".join(texts), last.finish_reason, index, positions)
    return chat_tools.whole(choice, last.tool_calls), last


# -- streamed answers -------------------------------------------------------------------------


class _Feed:
    """Every choice's batches in the order they arrive, as (index, batch or None at its
    end, error or None). start() waits until each choice answered once (or one failed):
    a request the engine refuses fails with its own status, not inside a 200 stream.
    One choice is read from its call directly (no task, no queue: a token's path)."""

    def __init__(self, calls: list, model: str):
        self.calls, self.model = calls, model
        self._held: list = []
        self._closed = False
        self._queue: asyncio.Queue | None = None
        self._pumps: list[asyncio.Future] = []
        if len(calls) == 1:
            self._batches = calls[0].batches()
        else:
            self._queue = asyncio.Queue()
            self._pumps = [asyncio.ensure_future(self._pump(i, c)) for i, c in enumerate(calls)]

    async def _pump(self, index: int, call) -> None:
        assert self._queue is not None
        try:
            async for batch in call.batches():
                self._queue.put_nowait((index, batch, None))
            self._queue.put_nowait((index, None, None))
        except OpenAIError as error:
            self._queue.put_nowait((index, None, error))

    async def _read(self) -> tuple:
        if self._queue is not None:
            return await self._queue.get()
        try:
            return 0, await self._batches.__anext__(), None
        except StopAsyncIteration:
            return 0, None, None
        except OpenAIError as error:
            return 0, None, error

    async def start(self) -> str:
        answered: set = set()
        served_by = ""
        while len(answered) < len(self.calls):
            item = await self._read()
            index, batch, error = item
            if error is not None:
                raise error
            if batch is None and index not in answered:  # ended before any response
                raise no_finish_reason(self.model)
            served_by = served_by or (batch[0].served_by if batch else "")
            answered.add(index)
            self._held.append(item)
        return served_by

    async def next(self) -> tuple:
        return self._held.pop(0) if self._held else await self._read()

    def close(self, finished: set, failed: bool = False) -> None:
        """Stop every pump; the calls not finished are abandoned after a choice's failure
        (Call.abandon), cancelled otherwise (the client left). Once: the events' end and
        the response's on_leave may both ask."""
        if self._closed:
            return
        self._closed = True
        for pump in self._pumps:
            pump.cancel()
        for index, call in enumerate(self.calls):
            if index in finished:
                continue
            if failed:
                call.abandon()
            else:
                call.cancel()


async def _events(answer: Answer, feed: _Feed) -> AsyncGenerator[bytes, None]:
    """The SSE body, one write per batch of responses (OpenAI's chunks carry any number
    of tokens); the last batch leaves with the end. Closing this generator (the client
    left) cancels the calls not finished."""
    n = len(feed.calls)
    failed = False
    finished: set = set()
    begun: set = set()
    start = len(answer.generation.prompt or "") if answer.generation.echo else 0
    offsets = [start] * n  # completions' text_offset, per choice
    counts: dict = {}  # index -> (input tokens, output tokens)
    out = b""  # the last batch's chunks, held for the end
    try:
        while len(finished) < n:
            index, batch, error = await feed.next()
            if error is not None:
                raise error
            if batch is None:
                if index not in finished:
                    raise no_finish_reason(answer.generation.model)
                continue
            out = _batch_events(answer, index, batch, index not in begun, offsets, counts)
            begun.add(index)
            if batch[-1].finish_reason:
                finished.add(index)
                feed.calls[index].finish()
            if out and len(finished) < n:
                yield out
                out = b""
        if answer.generation.include_usage:
            tokens_in = counts[0][0] if counts else 0
            out += _sse(answer.usage_chunk(tokens_in, sum(o for _, o in counts.values())))
        yield out + DONE
    except OpenAIError as error:
        failed = True
        yield out + _sse(error.body()) + DONE
    finally:
        feed.close(finished, failed)


def _batch_events(
    answer: Answer, index: int, batch: list[Piece], first: bool, offsets: list, counts: dict
) -> bytes:
    """One choice's batch as its chunks: the text (with its logprobs), then the finish
    reason if the batch ends the choice."""
    last = batch[-1]
    text = batch[0].text if len(batch) == 1 else "".join(piece.text for piece in batch)
    plain = answer.generation.logprobs is None
    if plain and not (first or last.finish_reason or last.tool_calls):
        # A token's usual path: plain text, from the answer's template.
        return b"data: " + answer.text_chunk_json(text, index).encode() + b"\n\n" if text else b""
    positions = [p for piece in batch for p in (piece.logprobs or ())]
    logprobs = answer.logprobs(positions, offsets[index])
    if logprobs is not None and not answer.chat:
        offsets[index] += sum(len(token) for token in logprobs["tokens"])
    out = b""
    if text or first or positions:
        out += _sse(answer.chunk(text, None, first, index, logprobs))
    if last.tool_calls:
        out += _sse(chat_tools.chunk(answer.chunk(None, None, index=index), last.tool_calls))
    if last.finish_reason:
        counts[index] = (last.input_tokens, last.output_tokens)
        out += _sse(answer.chunk(None if answer.chat else "", last.finish_reason, index=index))
    return out


def _sse(data) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
