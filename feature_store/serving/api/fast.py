"""``FastPath``, the ASGI app of one worker: the hot POST routes answered over plain ASGI
(the key, the content type, the body's size and deadline, then the route's handler),
everything else through FastAPI. The native REST front answers the same routes first,
with the same handlers and the refusals rendered here (``refusal``).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from feature_store.serving.api.json_answer import JSON, Answer, Route
from feature_store.serving.auth import AUTH_MESSAGES, Authenticator, AuthError
from feature_store.serving.service import Problem, problem

_JSON_HEADER = (b"content-type", JSON.encode())


class FastPath:
    """The ASGI app: the two hot POST routes directly, everything else through FastAPI.

    FastAPI's routing, request and response objects cost more per request than a cached
    lookup itself. The hot
    routes read the body and answer over plain ASGI with the same handler functions that
    the documented FastAPI routes call, so behaviour and OpenAPI stay one.
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: dict[str, Route],
        auth: Authenticator,
        body_limit: int,
        body_timeout: float,
    ) -> None:
        self.app = app
        self.routes = routes
        self.auth = auth
        self.body_limit = body_limit
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes.get(scope["path"])
            if route is not None:
                await self._answer(route, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _answer(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = request_id = None
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value
            elif name == b"x-request-id":
                request_id = value.decode("latin-1")
        try:
            # the key before the body: a caller without one does not get to send 8 MiB
            self.auth.require(authorization, route.role)
        except AuthError as e:
            await self._send(send, route.errors(problem(e)))
            return
        if content_type.split(b";", 1)[0].strip().lower() != b"application/json":
            # also what keeps a web page from posting a text/plain "form" cross-site
            await self._send(send, self.refusal(route, 415))
            return
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._body(receive)
        except TimeoutError:
            await self._send(send, self.refusal(route, 408))
            return
        if body is None:
            return  # the client went away
        if len(body) > self.body_limit:
            answer = self.refusal(route, 413)
        else:
            answer = await route.handler(authorization, body, request_id)
        await self._send(send, answer)

    def refusal(self, route: Route, status: int) -> Answer:
        """The answer of a fast route to a request refused before its handler runs: these
        statuses, here and on the native REST front (which gets them all, rendered once)."""
        if status in (401, 403):
            return route.errors(problem(AuthError(AUTH_MESSAGES[status], status)))
        if status == 415:
            # also what keeps a web page from posting a text/plain "form" cross-site
            p = Problem(415, "unsupported_media_type", "send the body as application/json")
        elif status == 408:
            message = f"the request body did not arrive within {self.body_timeout:g} s"
            p = Problem(408, "body_timeout", message)
        elif status == 413:
            p = Problem(413, "batch_too_large", f"the body is larger than {self.body_limit} bytes")
        elif status == 400:
            p = Problem(400, "malformed_body", "the request body could not be read")
        else:
            p = Problem(503, "shutting_down", "the server is stopping: retry")
        return route.errors(p)

    async def _body(self, receive: Receive) -> bytes | None:
        """The request body (cut at the limit plus one byte), or None if the client left."""
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if size <= self.body_limit:
                chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    @staticmethod
    async def _send(send: Send, answer: Answer) -> None:
        headers = [_JSON_HEADER, (b"content-length", str(len(answer.body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in answer.headers]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer.body})
