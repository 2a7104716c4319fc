"""The frontend's own bounds on what a connection may hold, before any request reaches
the app (and so before the API-key check): how many connections are open at once, how
long a request's headers and body may take to arrive, and how large its headers may be.

Why at the connection: a client that opens connections and sends a request line, then
one header line every few seconds, needs no key and costs a file descriptor each; 21,000
of them filled `trident serve`'s descriptor limit, and the keeper in the same process
then failed to read /proc and stopped tritonserver (issue 34). One 64 MiB header raised
the process by 120 MB. uvicorn bounds none of this (no header deadline, no header size
with httptools, and its `limit_concurrency` is checked only once headers are complete,
so a slow client holds its descriptor for as long as it likes). Every refusal is an HTTP
answer in OpenAI's error shape, then the connection closes:

- 503 `server_overloaded` (with Retry-After) when the connection would be one over
  `max_connections`, which is also kept below the process's descriptor limit;
- 408 `request_timeout` when the headers are not complete `header_timeout_s` after the
  connection opened (or after the previous answer, on a kept-alive connection), or the
  body not `body_timeout_s` after the headers, while no answer has started;
- 431 `request_header_fields_too_large` past `max_header_bytes` of request line and
  headers (counted as they arrive, so a huge header is refused before it is held).

A streamed answer in progress is never cut by these deadlines: they stop at the
request's last byte.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import ClassVar, cast

from builder.serve.openai.coalesce import CoalescingHTTPProtocol, CoalescingTransport
from builder.serve.openai.limits import Limits

# Descriptors the process keeps for everything but the frontend's connections: the
# gRPC channel to Triton, the keeper's reads of /proc, tritonserver's pipes, logs.
RESERVED_FDS = 256
LINGER_S = 2.0  # how long a refused connection's remaining bytes are read and dropped
_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def connection_cap(limits: Limits, soft_fd_limit: int | None = None) -> int:
    """The most connections the frontend holds: its limit, and never so many that the
    process runs out of descriptors (at least 1)."""
    if soft_fd_limit is None:
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_fd_limit == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(1, min(limits.max_connections, soft_fd_limit - RESERVED_FDS))


def refusal(status: int, message: str, code: str, retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, its body an OpenAI error."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}
    ).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after_s is not None:
        head.append(f"retry-after: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedHTTPProtocol(CoalescingHTTPProtocol):
    """uvicorn's HTTP protocol (httptools) with the bounds above. `guarded(limits)` makes
    the class uvicorn is given; its instances share the server's connection set."""

    limits: ClassVar[Limits] = Limits()
    cap: ClassVar[int] = Limits().max_connections

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._refused = False
        self._in_headers = True  # until the request's headers are complete
        # Two counts of one request's header bytes: as received (what httptools holds of
        # a header not yet complete) and as parsed (one chunk may hold them all).
        self._received = self._parsed = 0
        self._timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.cap:
            self._refuse(
                503,
                f"the server is at its limit of {self.cap} open connections; retry shortly",
                "server_overloaded",
                retry_after_s=1,
            )
            return
        self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._in_headers and not self._refused:
            self._received += len(data)
            if self._received > self.limits.max_header_bytes:
                self._too_large()

    # httptools' callbacks, in the order of one request

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        if self._timer is None:
            self._arm_header_deadline()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return  # the rest of a refused request's bytes start nothing
        self._in_headers = False
        self._received = self._parsed = 0
        self._disarm()
        self._timer = self.loop.call_later(
            self.limits.body_timeout_s,
            self._late,
            f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
        )
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._in_headers = True  # the next request on this connection, if any
        self._received = self._parsed = 0

    # the bounds

    def _count(self, size: int) -> None:
        """Parsed bytes of the request line and headers (one chunk may hold them all)."""
        if self._in_headers and not self._refused:
            self._parsed += size
            if self._parsed > self.limits.max_header_bytes:
                self._too_large()

    def _too_large(self) -> None:
        self._refuse(
            431,
            f"the request line and headers are over {self.limits.max_header_bytes} bytes",
            "request_header_fields_too_large",
        )

    def _arm_header_deadline(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(
            self.limits.header_timeout_s,
            self._late,
            f"the request headers did not arrive within {self.limits.header_timeout_s:g} s",
        )

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self, message: str) -> None:
        self._timer = None
        if self.cycle is not None and self.cycle.response_started:
            return  # answering already: the app's own deadline applies
        if self.cycle is None and not self._in_headers:
            return  # idle between requests: uvicorn's keep-alive timeout closes it
        self._refuse(408, message, "request_timeout")

    def _refuse(self, status: int, message: str, code: str, retry_after_s: int | None = None):
        self._refused = True
        self._disarm()
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app, if it runs, sees the client gone
            self.cycle.message_event.set()
        if self.transport.is_closing():
            return
        self.transport.write(refusal(status, message, code, retry_after_s))
        # A close with unread bytes in the socket is a reset, which can reach the client
        # before the answer: so the answer and a FIN first, then what the client still
        # sends is read and dropped (data_received) until it closes or LINGER_S passes.
        cast(CoalescingTransport, self.transport).flush()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()  # the client is done too
            return
        super().eof_received()


def guarded(limits: Limits) -> type[GuardedHTTPProtocol]:
    """The protocol class for one frontend: its limits, and its connection cap."""
    return type(
        "GuardedHTTPProtocol",
        (GuardedHTTPProtocol,),
        {"limits": limits, "cap": connection_cap(limits)},
    )
