"""What every HTTP route shares: the JSON answer type, error answers, the routes of the
app's fast path, and the parsing of a JSON body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

import orjson
from fastapi.responses import Response

from feature_store.serving.auth import Role
from feature_store.serving.service import MalformedRequestError, Problem

JSON = "application/json"


class JSONBody(Response):
    media_type = JSON


@dataclass(frozen=True, slots=True)
class Answer:
    """A JSON answer, sendable as a FastAPI Response or straight over ASGI."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    def response(self) -> Response:
        return JSONBody(self.body, status_code=self.status, headers=dict(self.headers))


def error_headers(status: int, retry_after: float | None = None) -> tuple[tuple[str, str], ...]:
    """The headers of an error answer: the auth scheme of a 401, when to retry a 503."""
    headers: list[tuple[str, str]] = []
    if status == 401:
        headers.append(("WWW-Authenticate", "Bearer"))
    if retry_after is not None and status == 503:
        headers.append(("Retry-After", str(max(1, round(retry_after)))))
    return tuple(headers)


def error_answer(p: Problem, retry_after: float | None = None) -> Answer:
    """An error of this API: ``{"error": {"code", "message", ...details}}``."""
    body = orjson.dumps({"error": {"code": p.code, "message": p.message, **(p.details or {})}})
    return Answer(p.status, body, error_headers(p.status, retry_after))


# (the Authorization header, the body, the x-request-id header)
Handler = Callable[[str | None, bytes, str | None], Awaitable[Answer]]


class Route(NamedTuple):
    """A POST route of the app's fast path."""

    handler: Handler
    role: Role  # checked before the body is read
    errors: Callable[[Problem], Answer] = error_answer  # the shape of the route's errors


def parse_object(raw: bytes, limit: int) -> dict[str, object]:
    """The body as a JSON object, or MalformedRequestError saying what is wrong with it."""
    if len(raw) > limit:
        raise MalformedRequestError(f"the body is larger than the limit of {limit} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise MalformedRequestError(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise MalformedRequestError("the body must be a JSON object")
    return body
