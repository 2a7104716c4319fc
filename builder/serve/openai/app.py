"""The FastAPI application: GET /v1/models, POST /v1/chat/completions, /v1/completions.

Every error leaves in OpenAI's shape with its status. A streamed answer starts (200,
text/event-stream) only after Triton's first response, so a request that fails before
its first token still gets a real 4xx/5xx; a failure after that is one `data:` event
with an `error` object (the openai client raises it), then `data: [DONE]`. A client
that goes away cancels the gRPC call, which aborts the request in the engine.

Only exposed models are listed and served (policy.py). A request is checked in the order
that costs the least first: the drain, the API key (headers only), the declared body
size, the body read in pieces up to the limit, the JSON's depth, then its fields
(limits.py).

While the server drains (draining.py) /health is a 503 (the load balancer takes the
server out), /health/live stays 200 (a liveness probe never kills a draining server),
new /v1 requests are 503 `server_draining` with Retry-After, and the answers admitted
before go on to their end, or until the drain's cut_off().
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response

from builder.serve.openai import choices
from builder.serve.openai.answers import Answer
from builder.serve.openai.asgi import LaneApp, SSEResponse
from builder.serve.openai.choices import DONE, SERVED_BY_HEADER
from builder.serve.openai.draining import RETRY_AFTER_S, DrainGate
from builder.serve.openai.errors import (
    OpenAIError,
    client_closed,
    invalid,
    model_not_found,
    no_finish_reason,
    server_draining,
    server_shutdown,
)
from builder.serve.openai.keys import tenant_of
from builder.serve.openai.limits import (
    Limits,
    body_too_large,
    check_body_json,
    check_max_tokens,
    declared_length,
)
from builder.serve.openai.pod_metrics import CONTENT_TYPE, pod_load
from builder.serve.openai.policy import DEFAULT_EXPOSE, as_tenant, resolve
from builder.serve.openai.protocol import Generation, parse_chat, parse_completion
from builder.serve.openai.tensors import Piece
from builder.serve.openai.traces import finish, request_span
from builder.serve.openai.triton import Call, Triton

log = logging.getLogger("trident.openai")
OWNER = "trident"


def create_app(
    triton_url: str,
    triton: Triton | None = None,
    api_keys: Mapping[str, str] | None = None,
    expose: Iterable[str] = DEFAULT_EXPOSE,
    limits: Limits = Limits(),
    drain: DrainGate | None = None,
    tracer: Any = None,
) -> FastAPI:
    """The application for the Triton at triton_url (`triton`: a stand-in, for tests),
    serving the models in `expose` only. With api_keys (key → tenant,
    builder.serve.openai.keys), every /v1 request needs one of the keys, and its tenant
    is the request's tenant (policy.as_tenant). `drain`: the drain's state, which its
    driver holds too (app.state.drain; a new one if not given). `tracer`: an
    OpenTelemetry tracer when traces are on (builder/serve/tracing.py), else None."""
    triton = triton or Triton(triton_url)
    exposed = frozenset(expose)
    drain = drain or DrainGate()

    def admit(request: Request) -> str | None:
        return _admit(request, drain, api_keys)

    async def generate(request: Request, parse) -> Response:
        name = admit(request)  # a 401 before a byte of the body is read
        generation = parse(await _body(request, limits), request.headers, limits)
        model, generation = resolve(as_tenant(generation, name), exposed)
        if drain.cut:  # admitted before the drain, its body still arriving at cut_off()
            raise server_shutdown()
        return await _generate(triton, request, model, generation, limits, drain)

    app = LaneApp(
        title="trident OpenAI frontend",
        lifespan=_lifespan(triton, drain),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.triton = triton
    app.state.drain = drain

    for kind in (Exception, HTTPException, OpenAIError):
        app.add_exception_handler(kind, _failed)
    _add_probes(app, triton, drain, tracer, exposed)
    _add_model_routes(app, triton, admit, exposed)
    _add_generation_routes(app, generate)
    app.lane("/v1/chat/completions", _lane(parse_chat, generate, drain, tracer))
    app.lane("/v1/completions", _lane(parse_completion, generate, drain, tracer))
    return app


def _admit(request: Request, drain: DrainGate, api_keys: Mapping[str, str] | None) -> str | None:
    """The request's tenant, once it may come in. The drain is checked before the
    key: a draining server's 503 tells a caller without a key nothing that /health
    (no key) does not say, and the refusal is the same for every caller."""
    if drain.draining:
        raise server_draining(RETRY_AFTER_S)
    return None if api_keys is None else tenant_of(api_keys, request.headers)


def _lifespan(triton: Triton, drain: DrainGate):
    """The app's lifespan: the drain bound to the server's loop, Triton's client closed
    at the end."""

    @asynccontextmanager
    async def lifespan(_app):
        drain.bind(asyncio.get_running_loop())
        yield
        await triton.close()

    return lifespan


async def _failed(_request, error: Exception):
    return error_response(error)


def _add_probes(
    app: FastAPI, triton: Triton, drain: DrainGate, tracer: Any, exposed: frozenset
) -> None:
    """/health, /metrics and /health/live: no key, no tenant."""

    @app.get("/health")
    async def health():
        """Readiness: a load balancer sends no more work once this fails."""
        if drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        await triton.models(fresh=True)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        """The pod's load for an endpoint picker (pod_metrics.py): no key, no tenant.
        With traces on, the frontend's lost spans too (builder/serve/tracing.py)."""
        text = b""
        if tracer is not None:
            from builder.serve.tracing import loss_exposition

            text = loss_exposition()
        elif triton.metrics_url is None:
            raise OpenAIError(404, "this frontend was given no Triton metrics port", "not_found")
        if triton.metrics_url is not None:
            load = pod_load(await triton.metrics_text(), await triton.models(), exposed)
            text = load.exposition() + text
        return Response(text, media_type=CONTENT_TYPE)

    @app.get("/health/live")
    async def live():
        """Liveness: the process serves (a drain included: it must not be killed for
        draining) and Triton answers."""
        await triton.models(fresh=True)
        return {"status": "ok"}


def _add_model_routes(
    app: FastAPI, triton: Triton, admit: Callable[[Request], str | None], exposed: frozenset
) -> None:
    """/v1/models and /v1/models/{model}."""

    @app.get("/v1/models")
    async def list_models(request: Request):
        admit(request)
        models = await triton.models(fresh=True)
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": OWNER}
                for name in sorted(exposed.intersection(models))
            ],
        }

    @app.get("/v1/models/{model}")
    async def get_model(model: str, request: Request):
        admit(request)
        if model not in exposed:
            raise model_not_found(model)
        await triton.info(model)
        return {"id": model, "object": "model", "created": int(time.time()), "owned_by": OWNER}


def _add_generation_routes(app: FastAPI, generate: Callable[..., Awaitable[Response]]) -> None:
    """The generation routes through FastAPI (LaneApp answers their POSTs first: _lane)."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, parse_chat)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, parse_completion)


def _lane(parse, generate: Callable[..., Awaitable[Response]], drain: DrainGate, tracer: Any):
    """The same as _add_generation_routes' routes, straight from ASGI (asgi.py: every
    request and token of a generation would otherwise pass FastAPI's layers). LaneApp
    answers every POST to these paths here, so this is where in_flight is counted: from
    admission until the answer's last byte was sent (or its client left)."""

    async def handle(scope, receive, send) -> None:
        if drain.draining:  # refused before it is counted: in_flight is the admitted
            await error_response(server_draining(RETRY_AFTER_S))(scope, receive, send)
            return
        drain.in_flight += 1
        try:
            if tracer is None:
                await answer(scope, receive, send)
            else:
                with request_span(tracer, scope) as span:
                    finish(span, await answer(scope, receive, send))
        finally:
            drain.in_flight -= 1

    async def answer(scope, receive, send) -> int:
        """Generate and send the answer; its HTTP status."""
        try:
            response = await generate(Request(scope, receive), parse)
        except Exception as error:
            response = error_response(error)
        await response(scope, receive, send)
        return response.status_code

    return handle


def error_response(error: Exception) -> JSONResponse:
    """An error in OpenAI's shape with its status; an unexpected one is logged."""
    if isinstance(error, OpenAIError):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
    if isinstance(error, HTTPException):
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(
            OpenAIError(error.status_code, str(error.detail), kind).body(),
            status_code=error.status_code,
        )
    log.exception("unexpected error", exc_info=error)
    return JSONResponse(
        OpenAIError(500, f"frontend error: {type(error).__name__}: {error}", "server_error").body(),
        status_code=500,
    )


async def _body(request: Request, limits: Limits):
    """The body as JSON, read no further than the limit: a declared length above it is
    refused unread, a chunked body once it passes it."""
    declared_length(request.headers, limits)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise body_too_large(limits)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise invalid(None, "the request body is not valid JSON", "invalid_json") from None
    check_body_json(body, limits.max_depth)
    return body


async def _generate(
    triton: Triton,
    request: Request,
    model: str,
    generation: Generation,
    limits: Limits,
    drain: DrainGate,
):
    info = await triton.info(model)
    check_max_tokens(generation.max_tokens, generation.max_tokens_param, info.name, limits)
    if choices.needed(generation):  # n > 1 or logprobs: choices.py's path
        return await choices.respond(triton, request, generation, info, drain)
    call = triton.stream(generation, info)
    drain.track(call)  # cut_off() ends it with an error, whole or streamed
    answer = Answer(generation)
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, call))
    try:
        if not generation.stream:
            body, served_by = await _whole(answer, call.pieces(), call)
            return JSONResponse(body, headers=_served(served_by))
        batches = call.batches()
        first = await _next(batches)
    except OpenAIError:
        call.finish()  # Triton answered with an error: let its call end
        raise
    except BaseException:
        call.cancel()
        raise
    finally:
        watcher.cancel()  # from here on Starlette watches the client (see _events)
    return SSEResponse(
        _events(answer, first or [], batches, call),
        {
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **_served(first[0].served_by if first else ""),
        },
        call.cancel,
    )


def _served(served_by: str) -> dict:
    """Which engine model answered (known at the first response), as a header."""
    return {SERVED_BY_HEADER: served_by} if served_by else {}


async def _cancel_on_disconnect(request: Request, call: Call) -> None:
    """Cancel the gRPC call when the client disconnects before the answer starts."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            call.cancel()
            return


async def _next(batches: AsyncIterator[list[Piece]]) -> list[Piece] | None:
    try:
        return await batches.__anext__()
    except StopAsyncIteration:
        return None


async def _whole(answer: Answer, pieces: AsyncIterator[Piece], call: Call) -> tuple:
    texts, last = [], None
    async for piece in pieces:
        texts.append(piece.text)
        last = piece
    if call.cancelled:
        raise client_closed()
    if last is None or not last.finish_reason:
        raise no_finish_reason(answer.generation.model)
    call.finish()
    return answer.whole(
        "".join(texts), last.finish_reason, last.input_tokens, last.output_tokens
    ), last.served_by


def _sse(data) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _events(
    answer: Answer, first: list[Piece], batches: AsyncIterator[list[Piece]], call: Call
) -> AsyncGenerator[bytes, None]:
    """The SSE body, one write per batch of responses: the texts of a batch go out as
    one chunk (OpenAI's chunks carry any number of tokens), and the end (finish reason,
    usage, [DONE]) leaves with the last text. Starlette cancels this generator when the
    client disconnects; the finally then cancels the gRPC call (Triton cancels the
    request, the engine aborts)."""
    ended = False  # the call was handed to finish()
    try:
        if not first:
            raise OpenAIError(
                502,
                f"{answer.generation.model}: the stream ended without a response",
                "server_error",
                None,
                "backend_error",
            )
        last = first[-1]
        out = _sse(answer.chunk("".join(p.text for p in first), None, first=True))
        while not last.finish_reason:
            if out:
                yield out
            batch = await _next(batches)
            if batch is None:
                raise no_finish_reason(answer.generation.model)
            last = batch[-1]
            text = "".join(p.text for p in batch)
            out = b"data: " + answer.text_chunk_json(text).encode() + b"\n\n" if text else b""
        call.finish()
        ended = True
        out += _sse(answer.chunk(None if answer.chat else "", last.finish_reason))
        if answer.generation.include_usage:
            out += _sse(answer.usage_chunk(last.input_tokens, last.output_tokens))
        yield out + DONE
    except OpenAIError as error:
        call.finish()
        ended = True
        yield _sse(error.body()) + DONE
    finally:
        if not ended:
            call.cancel()  # the client left (Starlette cancelled us) or we broke
