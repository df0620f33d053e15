"""What every HTTP route shares: the JSON answer type and the parsing of a JSON body."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from fastapi.responses import Response

from feature_store.serving.service import MalformedRequestError

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
