"""The REST app of one worker: its routes (batch get, push write, registry, health,
readiness, metrics, Feast's API), their OpenAPI document, its lifespan (the runtime, the
gRPC server, the native REST front) and ``FastPath``, the ASGI path of the hot POSTs.

The contract is in docs/serving.md; the handlers of the two JSON POSTs, and the bytes of
their answers, are in ``rest_api``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from feature_store.serving import schemas
from feature_store.serving.auth import AUTH_MESSAGES, Authenticator, AuthError, Role
from feature_store.serving.feast_api import LOOKUP as FEAST_LOOKUP
from feature_store.serving.feast_api import FeastFront, feast_routes
from feature_store.serving.front_reads import FrontReads, planned_reads
from feature_store.serving.hits import FEAST, REST, NativeHits
from feature_store.serving.json_answer import (
    JSON,
    Answer,
    Handler,
    JSONBody,
    Route,
    error_answer,
)
from feature_store.serving.rest_api import RestHandlers
from feature_store.serving.runtime import ServingRuntime, tune_gc
from feature_store.serving.service import (
    Problem,
    problem,
)

if TYPE_CHECKING:
    from feature_store._native import RestCall

log = logging.getLogger(__name__)


def create_app(
    runtime: ServingRuntime, *, grpc_port: int | None = None, rest_backend: int | None = None
) -> FastPath:
    """The app of one worker. With ``grpc_port``, its lifespan also runs the gRPC server;
    with ``rest_backend`` (the loopback port uvicorn serves this app on), the native REST
    front on the REST port (``rest_front``)."""
    settings = runtime.settings
    auth = Authenticator(settings.read_keys, settings.admin_keys)
    handlers = RestHandlers(runtime, auth)
    fronts = Fronts(runtime, handlers, grpc_port, rest_backend)
    app = FastAPI(
        title="Feature store serving API",
        version="1",
        description="Batch feature lookups behind an in-process cache, push writes, registry.",
        lifespan=fronts.lifespan,
        default_response_class=JSONBody,
    )
    _api_routes(app, runtime, handlers, auth)
    feast = _feast_routes(app, runtime, auth, fronts.feast)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.openapi = _openapi(app, runtime)  # type: ignore[method-assign]
    routes = {
        "/v1/features/get": Route(handlers.get, Role.READ),
        "/v1/features/write": Route(handlers.write, Role.ADMIN),
        **feast,
    }
    fronts.fast = FastPath(
        app, routes, auth, settings.max_body_bytes, settings.request_body_timeout
    )
    return fronts.fast


class Fronts:
    """The worker's lifespan: the runtime, then what answers beside uvicorn (the gRPC
    server, the native REST front, the cache hits answered on the fronts' threads); stopped
    in the reverse order."""

    def __init__(
        self,
        runtime: ServingRuntime,
        handlers: RestHandlers,
        grpc_port: int | None,
        rest_backend: int | None,
    ) -> None:
        self.runtime = runtime
        self.handlers = handlers
        self.grpc_port = grpc_port
        self.rest_backend = rest_backend
        self.fast: FastPath | None = None  # the app the native REST front passes on to
        self.feast = FeastFront()  # what the native REST front needs of Feast's lookups

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        runtime, settings = self.runtime, self.runtime.settings
        await runtime.start()
        hits = self._hits()
        grpc_server = None
        if self.grpc_port is not None:
            from feature_store.serving.grpc_server import start_grpc_server

            grpc_server = await start_grpc_server(runtime, settings.host, self.grpc_port, hits)
        rest = None
        if self.rest_backend is not None:
            from feature_store.serving.fronts import listen
            from feature_store.serving.rest_front import NativeRestFront

            assert self.fast is not None
            if hits is not None:
                self.handlers.learn = hits.learner(REST)
                self.feast.learn = hits.learner(FEAST)
            sock = listen(settings.host, settings.port, settings.workers > 1, "REST")
            rest = NativeRestFront(
                self.fast, sock, self.rest_backend, settings, hits, self._fail_planned
            )
            log.info("REST on %s:%d (native front)", settings.host, settings.port)
        if hits is not None:
            hits.start()
        tune_gc(settings)
        if runtime.siblings is not None:
            runtime.siblings.join()  # answers on every port: its sockets are bound
        try:
            yield
        finally:
            if runtime.siblings is not None:
                runtime.siblings.leave()
            if rest is not None:
                await rest.stop(grace=1.0)
            if grpc_server is not None:
                await grpc_server.stop(grace=1.0)
            if hits is not None:
                await hits.close()
            await runtime.stop()

    def _hits(self) -> NativeHits | FrontReads | None:
        """Lookups answered on the fronts' threads, with a native front (REST, or gRPC on
        the native front) to answer them: cache hits with the L1 on (``NATIVE_HITS``),
        planned reads with it off (``NATIVE_READS``)."""
        settings = self.runtime.settings
        native_grpc = False
        if self.grpc_port is not None:
            from feature_store.serving.grpc_server import front_kind

            native_grpc = front_kind(settings) == "native"
        if self.rest_backend is None and not native_grpc:
            return None
        if self.runtime.reader.cache is None:
            return FrontReads(self.runtime) if planned_reads(self.runtime) else None
        return NativeHits(self.runtime) if settings.native_hits else None

    def _fail_planned(self, call: RestCall, error: BaseException, t0: float) -> None:
        """A planned lookup whose round trip failed: its handler's error answer (this
        API's, or Feast's)."""
        assert self.fast is not None
        feast = list(self.fast.routes)[call.route] == FEAST_LOOKUP and self.feast.fail
        answer = (feast or self.handlers.fail)(error, "get", t0)
        call.respond(answer.status, answer.body, list(answer.headers))


def _api_routes(
    app: FastAPI, runtime: ServingRuntime, handlers: RestHandlers, auth: Authenticator
) -> None:
    """This API's routes. They document it and serve the requests that reach FastAPI; POSTs
    to the two feature paths are answered by FastPath first, with the same functions."""
    fail = handlers.fail
    registry_body = orjson.dumps(runtime.service.describe_registry())
    metrics = runtime.metrics

    @app.post(
        "/v1/features/get",
        summary="Batch get of features for many entities",
        response_class=JSONBody,
        responses=_responses(schemas.GetFeaturesResponse, 400, 401, 403, 413, 415, 500, 503),
        openapi_extra=_request_body("GetFeaturesRequest"),
    )
    async def get_features(request: Request) -> Response:
        answer = await handlers.get(request.headers.get("authorization"), await request.body())
        return answer.response()

    @app.post(
        "/v1/features/write",
        summary="Push write of feature values of one group",
        response_class=JSONBody,
        responses=_responses(schemas.WriteFeaturesResponse, 400, 401, 403, 409, 413, 415, 503),
        openapi_extra=_request_body("WriteFeaturesRequest"),
    )
    async def write_features(request: Request) -> Response:
        answer = await handlers.write(request.headers.get("authorization"), await request.body())
        return answer.response()

    @app.get(
        "/v1/registry",
        summary="Entity types and feature groups with typed features",
        response_class=JSONBody,
        responses=_responses(schemas.RegistryResponse, 401),
    )
    async def get_registry(request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            auth.require(request.headers.get("authorization"), Role.READ)
        except AuthError as e:
            return fail(e, "registry", t0).response()
        return JSONBody(registry_body)

    @app.get(
        "/v1/admin/cache",
        summary="This worker's L1 cache: size, counters, shadow checks, batch writes seen",
        response_class=JSONBody,
        responses=_responses(schemas.CacheSummary, 401, 403),
    )
    async def cache_summary(request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            auth.require(request.headers.get("authorization"), Role.ADMIN)
        except AuthError as e:
            return fail(e, "cache", t0).response()
        return JSONBody(orjson.dumps(cache_summary_of(runtime)))

    @app.get(
        "/healthz",
        summary="Liveness: the process answers",
        response_class=JSONBody,
        responses={200: {"model": schemas.HealthResponse}},
    )
    async def healthz() -> Response:
        return JSONBody(b'{"status":"ok"}')

    @app.get(
        "/readyz",
        summary="Readiness: Redis answers a PING",
        response_class=JSONBody,
        responses={200: {"model": schemas.ReadyResponse}, 503: {"model": schemas.ReadyResponse}},
    )
    async def readyz() -> Response:
        circuit = runtime.reader.breaker.state.value
        redis = await runtime.redis_answers()
        body = {"status": "ready", "redis": "ok", "circuit": circuit}
        siblings = runtime.siblings
        starting = False
        if siblings is not None:
            serving = siblings.serving()
            body["workers"] = f"{serving} of {siblings.workers}"
            starting = serving < siblings.workers
        if not redis:
            body.update(status="unavailable", redis="unreachable")
        elif starting:
            body["status"] = "starting"
        return JSONBody(orjson.dumps(body), status_code=503 if not redis or starting else 200)

    @app.get(
        "/metrics",
        summary="Prometheus metrics of the deployment (every worker)",
        response_class=Response,
        responses={200: {"description": "Prometheus text exposition format"}},
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _feast_routes(
    app: FastAPI, runtime: ServingRuntime, auth: Authenticator, front: FeastFront
) -> dict[str, Route]:
    """Feast's feature-server API (docs/feast.md): answered by FastPath like this API's two
    POSTs; FastAPI's routes give other methods their 405. Feast's clients are Feast's own,
    so these stay out of this API's OpenAPI document."""
    feast = feast_routes(runtime, auth, front)
    for path, feast_route in feast.items():

        async def feast_post(request: Request, handler: Handler = feast_route.handler) -> Response:
            answer = await handler(request.headers.get("authorization"), await request.body())
            return answer.response()

        app.add_api_route(path, feast_post, methods=["POST"], include_in_schema=False)

    @app.get("/health", include_in_schema=False)
    async def feast_health() -> Response:
        """Feast's health check: 200 while Redis answers, 503 when not."""
        if await runtime.ready():
            return JSONBody(b'{"status":"ok"}')
        return JSONBody(b'{"status":"unavailable"}', status_code=503)

    return feast


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    code = codes.get(exc.status_code, "http_error")
    answer = error_answer(Problem(exc.status_code, code, str(exc.detail))).response()
    answer.headers.update(exc.headers or {})  # 405: Allow (RFC 9110)
    return answer


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
        app: FastAPI,
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
        authorization = None
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value
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
            answer = await route.handler(authorization, body)
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


def cache_summary_of(runtime: ServingRuntime) -> dict[str, object]:
    reader = runtime.reader
    cache = reader.cache
    stats = {} if cache is None else asdict(cache.stats)
    checks, mismatches = stats.get("shadow_checks", 0), stats.get("shadow_mismatches", 0)
    return {
        "enabled": cache is not None,
        "form": runtime.settings.cache_form,
        "entries": 0 if cache is None else len(cache),
        "bytes": 0 if cache is None else cache.bytes,
        "counters": stats,
        "shadow": {
            "fraction": reader.shadow_fraction,
            "checks": checks,
            "mismatches": mismatches,
            "mismatch_rate": mismatches / checks if checks else None,
        },
        "generations": dict(reader.generations),
        "circuit": reader.breaker.state.value,
    }


def _request_body(model: str) -> dict[str, object]:
    return {
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{model}"}}},
        }
    }


def _responses(model: type, *errors: int) -> dict[int | str, dict[str, object]]:
    out: dict[int | str, dict[str, object]] = {200: {"model": model}}
    for status in errors:
        out[status] = {"model": schemas.ErrorResponse}
    return out


def _openapi(app: FastAPI, runtime: ServingRuntime) -> Callable[[], dict[str, object]]:
    """The document: FastAPI's paths, answers from the pydantic models, request bodies from
    the served registry (``schemas.get_request_schema``), and the fixes FastAPI needs.

    FastAPI gives a response class that is not its JSONResponse the schema
    ``{"type": "string"}`` beside the model's ``$ref``; a client generated from that, or a
    validator, expects a string. The answers are JSON objects: the ``$ref`` stays alone.
    """

    def build() -> dict[str, object]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=app.description
            )
            _, defs = models_json_schema(
                [(m, "validation") for m in schemas.RESPONSE_MODELS],
                ref_template="#/components/schemas/{model}",
            )
            found = doc.setdefault("components", {}).setdefault("schemas", {})
            found.update(defs.get("$defs", {}))
            s = runtime.settings
            found["GetFeaturesRequest"] = schemas.get_request_schema(
                runtime.registry, s.max_entities, s.max_features
            )
            found["WriteFeaturesRequest"] = schemas.write_request_schema(
                runtime.registry, s.max_entities, time.time()
            )
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}, {}]
            for path in doc["paths"].values():
                for operation in path.values():
                    for answer in operation.get("responses", {}).values():
                        for media in answer.get("content", {}).values():
                            schema = media.get("schema", {})
                            if "$ref" in schema:
                                schema.pop("type", None)
            metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]
            metrics["content"] = {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}
            app.openapi_schema = doc
        return app.openapi_schema

    return build
