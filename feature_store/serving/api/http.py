"""uvicorn's HTTP/1.1 protocol (httptools) with a deadline for a request's headers.

uvicorn closes idle keep-alive connections, but a connection that sends its request headers
slowly, or never, is held open for as long as the client likes: a few hundred such clients
hold every connection a worker can serve. Here each request's headers must be complete
within ``header_timeout`` seconds of the connection opening or the request starting, or the
connection is closed. (The body has its own deadline, in ``app.FastPath``: a 408.)

This is a subclass of uvicorn's own protocol rather than a proxy in front because the
deadline needs the parser's events; it overrides four hooks and calls uvicorn for each.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    # set per process from the serving settings (cli._app_from_config) before serving starts;
    # uvicorn makes the protocol objects itself, so it is a class attribute
    header_timeout: float = 10.0

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()
