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
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response

from builder.serve.openai import choices
from builder.serve.openai.asgi import LaneApp
from builder.serve.openai.draining import RETRY_AFTER_S, DrainGate
from builder.serve.openai.errors import (
    OpenAIError,
    invalid,
    model_not_found,
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
from builder.serve.openai.pod_metrics import CONTENT_TYPE, pod_load, sglang_gauges
from builder.serve.openai.policy import DEFAULT_EXPOSE, as_tenant, resolve
from builder.serve.openai.protocol import Generation, parse_chat, parse_completion
from builder.serve.openai.traces import finish, request_span
from builder.serve.openai.triton import Triton

log = logging.getLogger("trident.openai")
OWNER = "trident"


def create_app(
    triton_url: str,
    triton: Triton | None = None,
    api_keys: Mapping[str, str] | None = None,
    expose: Iterable[str] = DEFAULT_EXPOSE,
    limits: Limits = Limits(),
    drain: DrainGate | None = None,
    spans: Any = None,
    engine_gauges: Path | None = None,
) -> FastAPI:
    """The application for the Triton at triton_url (`triton`: a stand-in, for tests),
    serving the models in `expose` only. With api_keys (key → tenant,
    builder.serve.openai.keys), every /v1 request needs one of the keys, and its tenant
    is the request's tenant (policy.as_tenant). `drain`: the drain's state, which its
    driver holds too (app.state.drain; a new one if not given). `spans`: the
    frontend's spans when traces are on (builder/serve/tracing.py), else None.
    `engine_gauges`: the server's folder of SGLang's own gauges (pod_metrics.py)."""
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
    _add_probes(app, triton, drain, spans, exposed, engine_gauges)
    _add_model_routes(app, triton, admit, exposed)
    _add_generation_routes(app, generate)
    app.lane("/v1/chat/completions", _lane(parse_chat, generate, drain, spans))
    app.lane("/v1/completions", _lane(parse_completion, generate, drain, spans))
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
    app: FastAPI,
    triton: Triton,
    drain: DrainGate,
    spans: Any,
    exposed: frozenset,
    engine_gauges: Path | None,
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
        if spans is not None:
            from builder.serve.tracing import loss_exposition

            text = loss_exposition()
        elif triton.metrics_url is None:
            raise OpenAIError(404, "this frontend was given no Triton metrics port", "not_found")
        if triton.metrics_url is not None:
            models = await triton.models()
            sglang = sglang_gauges(engine_gauges, models)  # small files: read in place
            load = pod_load(await triton.metrics_text(), models, exposed, sglang)
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


def _lane(parse, generate: Callable[..., Awaitable[Response]], drain: DrainGate, spans: Any):
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
            if spans is None:
                await answer(scope, receive, send)
            else:
                with request_span(spans, scope) as span:
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
    return await choices.respond(triton, request, generation, info, drain)
