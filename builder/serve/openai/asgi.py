"""The ASGI side of the generation routes, kept short: they carry every token, so
they skip FastAPI's per-request machinery (middleware layers, routing, dependency
solving, the endpoint's response handling), and a streamed answer is written without
Starlette's anyio task group.

Measured (docs/performance.md, "The OpenAI frontend's own cost"): FastAPI's route and
StreamingResponse cost a few tenths of a millisecond per request and a send wrapper
per chunk, on the path where a token waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

from fastapi import FastAPI
from starlette.responses import Response

Handler = Callable[[dict, Callable, Callable], Awaitable[None]]


class LaneApp(FastAPI):
    """FastAPI, with some POST paths answered by a plain ASGI handler (`lane`) before
    FastAPI sees the request. Everything else (other routes and methods, lifespan,
    404/405) stays FastAPI's."""

    def __init__(self, **options):
        super().__init__(**options)
        self.lanes: dict[str, Handler] = {}

    def lane(self, path: str, handler: Handler) -> None:
        self.lanes[path] = handler

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.lanes.get(scope["path"])
            if handler is not None:
                scope["app"] = self
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class SSEResponse(Response):
    """A text/event-stream answer from an async generator of bytes. The client going
    away cancels the writing (the generator is closed, its `finally` runs), as
    Starlette's StreamingResponse does, with one watcher task and no task group; then
    `on_leave` runs too, for a generator that had not started (its `finally` never
    would). A Response, so that it can also be returned from a FastAPI route."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        headers: Mapping[str, str],
        on_leave: Callable[[], None] | None = None,
    ):
        self.events, self.on_leave = events, on_leave
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        writer = asyncio.current_task()
        assert writer is not None  # an ASGI app is called from inside a task
        state = {"gone": False, "finished": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["finished"]:
                state["gone"] = True
                writer.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["finished"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            writer.uncancel()  # the client left: the answer ends here, quietly
        finally:
            state["finished"] = True
            watcher.cancel()
            await self.events.aclose()  # its finally cancels the gRPC call if unfinished
            if state["gone"] and self.on_leave is not None:
                self.on_leave()
