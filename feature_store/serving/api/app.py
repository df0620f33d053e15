"""The REST app of one worker: its routes (batch get, push write, registry, health,
readiness, metrics, Feast's API) and their OpenAPI document. ``worker`` assembles the
worker around it (its lifespan, the fronts); ``fast.FastPath`` answers the hot POSTs first.

The contract is in docs/serving.md; the handlers of the two JSON POSTs, and the bytes of
their answers, are in ``rest_api``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from feature_store.serving.api import schemas
from feature_store.serving.api.feast_api import FeastFront, feast_routes
from feature_store.serving.api.json_answer import JSON, Handler, JSONBody, Route, error_answer
from feature_store.serving.api.rest_api import RestHandlers
from feature_store.serving.auth import Authenticator, AuthError, Role
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import Problem

# what FastAPI runs around the app's life (``worker.Fronts.lifespan``)
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def api_app(
    runtime: ServingRuntime,
    handlers: RestHandlers,
    auth: Authenticator,
    lifespan: Lifespan,
    feast_front: FeastFront,
) -> tuple[FastAPI, dict[str, Route]]:
    """The FastAPI app of one worker (this API's routes, Feast's, their OpenAPI document;
    ``lifespan`` runs what answers beside it) and the POST routes ``FastPath`` and the
    native REST front answer first, with the same handlers."""
    # The OpenAPI document lists every entity type and feature name, as /v1/registry does:
    # with keys set it is a read key's too (below), and the pages that fetch it without
    # one (/docs, /redoc) are off.
    public = not auth.enabled
    app = FastAPI(
        title="Feature store serving API",
        version="1",
        description="Batch feature lookups behind an in-process cache, push writes, registry.",
        lifespan=lifespan,
        default_response_class=JSONBody,
        openapi_url="/openapi.json" if public else None,
        docs_url="/docs" if public else None,
        redoc_url="/redoc" if public else None,
    )
    _api_routes(app, runtime, handlers, auth)
    feast = _feast_routes(app, runtime, auth, feast_front)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.openapi = _openapi(app, runtime)  # type: ignore[method-assign]
    if not public:

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi_document(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                auth.require(request.headers.get("authorization"), Role.READ)
            except AuthError as e:
                return handlers.fail(e, "openapi", t0).response()
            return JSONBody(orjson.dumps(app.openapi()))

    routes = {
        "/v1/features/get": Route(handlers.get, Role.READ),
        "/v1/features/write": Route(handlers.write, Role.ADMIN),
        **feast,
    }
    return app, routes


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
        answer = await handlers.get(
            request.headers.get("authorization"),
            await request.body(),
            request.headers.get("x-request-id"),
        )
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
            answer = await handler(
                request.headers.get("authorization"),
                await request.body(),
                request.headers.get("x-request-id"),
            )
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


def cache_summary_of(runtime: ServingRuntime) -> dict[str, object]:
    reader = runtime.reader
    cache = reader.cache
    stats = {} if cache is None else asdict(cache.stats)
    checks, mismatches = stats.get("shadow_checks", 0), stats.get("shadow_mismatches", 0)
    return {
        "enabled": cache is not None,
        "form": runtime.settings.cache_form,
        "entries": 0 if cache is None else cache.size()[0],
        "bytes": 0 if cache is None else cache.size()[1],
        "front_entries": 0 if cache is None else cache.front_entries(),
        "notices": 0 if runtime.listener is None else runtime.listener.received,
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
                runtime.registry, s.max_entities
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
