"""The frontend's HTTP protocol: uvicorn's, with the writes one loop turn makes to a
connection sent as one.

uvicorn writes a response's status line and headers the moment the app sends
`http.response.start`, and each body part as it comes: a streamed answer's headers and
first chunk left as two socket writes. Each write wakes the client, and on a busy host
the frontend then waits for a core back between the two; measured at 1 stream on the
2-core host, the header write alone took 0.85 ms p50 of the first token's path
(docs/performance.md, "The OpenAI frontend's own cost"). Here the writes are collected
and leave together once the current callback ends (call_soon): nothing is held past
the loop turn that wrote it, so an idle path sends at once.
"""

from __future__ import annotations

import asyncio
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes within one loop turn go out as one write. Everything
    but write/writelines/close/abort/is_closing is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()  # a response's last bytes, then the close
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class CoalescingHTTPProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a CoalescingTransport (httptools, not h11: guard.py
    bounds a request's headers in httptools' callbacks)."""

    def connection_made(self, transport) -> None:
        coalescing = CoalescingTransport(transport, asyncio.get_running_loop())
        # A Transport by delegation (__getattr__ hands the rest to the wrapped one).
        super().connection_made(cast(asyncio.Transport, coalescing))
