"""The gRPC API (serving.proto): the same service as REST, on grpc.aio in the same loop.

GetFeatures answers with wire bytes assembled from the cache (``feature_store.serving.wire``)
through an identity serializer; the other methods use the generated message classes.
Standard health checking (grpc.health.v1, status follows Redis readiness) and server
reflection are served too. Errors map to status codes: INVALID_ARGUMENT for bad requests
(with the same messages as REST), UNAUTHENTICATED / PERMISSION_DENIED, UNAVAILABLE when
Redis is down, INTERNAL for stored values that do not decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from feature_store.batch import EntityId
from feature_store.errors import ConfigError, FeatureStoreError
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving import wire
from feature_store.serving.auth import Authenticator, AuthError, Role
from feature_store.serving.client import proto_value
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import MalformedRequestError, group_states, problem

log = logging.getLogger(__name__)

SERVICE = "feature_store.v1.FeatureService"
API = "grpc"
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}
MAX_MESSAGE = 256 * 1024 * 1024
MAX_DETAILS = 4096  # characters of an error message: gRPC carries it in a trailer (16 KB cap)


class _Unparseable:
    """What a request that is not the method's protobuf message deserializes to."""

    def __init__(self, error: str) -> None:
        self.error = error


def _parser(message: type[Any]) -> Callable[[bytes], object]:
    """The method's deserializer; bad bytes give INVALID_ARGUMENT from the handler, where
    grpc would answer UNKNOWN for a deserializer that raises."""

    def parse(data: bytes) -> object:
        try:
            return message.FromString(data)
        except DecodeError as e:
            return _Unparseable(f"the request is not a {message.DESCRIPTOR.full_name}: {e}")

    return parse


def _metadata(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None


def _check_parsed(request: object) -> None:
    if isinstance(request, _Unparseable):
        raise MalformedRequestError(request.error)


def _entity_id(e: pb.EntityId) -> EntityId:
    kind = e.WhichOneof("id")
    if kind is None:
        raise MalformedRequestError("a row has no id")
    result: EntityId = getattr(e, kind)
    return result


class FeatureServicer:
    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self.service = runtime.service
        self.cache = runtime.reader.cache
        settings = runtime.settings
        self.auth = Authenticator(settings.read_keys, settings.admin_keys)
        self.observe = runtime.metrics.requests.labels
        self.entities_served = runtime.metrics.entities.labels(API)
        registry = runtime.registry
        self.registry_response = pb.GetRegistryResponse(
            entities=[
                pb.EntityTypeInfo(
                    name=e.name,
                    prefix=e.prefix,
                    id_type=e.id_type.value,
                    ttl_seconds=e.ttl_seconds,
                    description=e.description,
                )
                for e in registry.entities.values()
            ],
            groups=[
                pb.FeatureGroupInfo(
                    name=g.name,
                    entity_type=g.entity.name,
                    max_age_seconds=g.max_age_seconds or 0,
                    description=g.description,
                    features=[
                        pb.FeatureInfo(
                            name=f.name,
                            type=f.type.value,
                            dim=f.dim or 0,
                            description=f.description,
                        )
                        for f in g.features
                    ],
                )
                for g in registry.groups.values()
            ],
        )

    async def _abort(
        self, context: grpc.aio.ServicerContext, error: BaseException, method: str, t0: float
    ) -> None:
        if not isinstance(error, FeatureStoreError):
            log.exception("unexpected error in gRPC %s", method)
        p = problem(error, writing=method == "write")
        self.observe(API, method, str(p.status)).observe(time.perf_counter() - t0)
        code = _STATUS.get(p.status, grpc.StatusCode.INTERNAL)
        details = f"{p.code}: {p.message}"
        if len(details) > MAX_DETAILS:
            details = details[: MAX_DETAILS - 20] + " ... (truncated)"
        await context.abort(code, details)

    async def get_features(
        self, request: pb.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        t0 = time.perf_counter()
        try:
            role = self.auth.require(_metadata(context), Role.READ)
            _check_parsed(request)
            if request.bypass_cache and role < Role.ADMIN:
                raise AuthError("bypass_cache needs an admin API key", 403)
            if request.int_ids and request.string_ids:
                raise MalformedRequestError("set int_ids or string_ids, not both")
            ids: Sequence[EntityId] = list(request.int_ids or request.string_ids)
            lookup = await self.service.lookup(
                request.entity_type,
                ids,
                list(request.features),
                list(request.groups),
                bypass=request.bypass_cache,
            )
        except Exception as e:
            await self._abort(context, e, "get", t0)
            raise AssertionError("unreachable") from None  # abort raises
        proj = lookup.projection
        header = proj.memo.get(API)
        if header is None:
            header = proj.memo[API] = wire.header(proj.entity.name, proj.names)
        parts = [cast(bytes, header)]
        charge = self.cache.charge if self.cache is not None else None
        for entity_id, resolved in zip(lookup.ids, lookup.entries, strict=True):
            stale, ages = group_states(proj, resolved, lookup.now)
            if proj.whole_group:
                entry = resolved[0].entry
                values = wire.entry_values(entry, charge)
                statuses = wire.statuses(entry.present, stale[0])
            else:
                values, statuses = wire.picked_values(proj.picks, resolved, stale)
            parts.append(wire.row(wire.entity_id(entity_id) + values + statuses + wire.ages(ages)))
        self.entities_served.inc(len(lookup.ids))
        self.observe(API, "get", "200").observe(time.perf_counter() - t0)
        return b"".join(parts)

    async def write_features(
        self, request: pb.WriteFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteFeaturesResponse:
        t0 = time.perf_counter()
        try:
            self.auth.require(_metadata(context), Role.ADMIN)
            _check_parsed(request)
            rows: list[tuple[EntityId, Mapping[str, object]]] = [
                (_entity_id(r.id), {name: proto_value(v) for name, v in r.values.items()})
                for r in request.rows
            ]
            stats = await self.service.write(request.group, rows)
        except Exception as e:
            await self._abort(context, e, "write", t0)
            raise AssertionError("unreachable") from None
        self.observe(API, "write", "200").observe(time.perf_counter() - t0)
        return pb.WriteFeaturesResponse(
            entities=stats.entities,
            values_written=stats.values_written,
            values_removed=stats.values_removed,
        )

    async def get_registry(
        self, request: pb.GetRegistryRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRegistryResponse:
        t0 = time.perf_counter()
        try:
            self.auth.require(_metadata(context), Role.READ)
            _check_parsed(request)
        except (AuthError, MalformedRequestError) as e:
            await self._abort(context, e, "registry", t0)
        return self.registry_response

    def handler(self) -> grpc.GenericRpcHandler:
        def identity(data: bytes) -> bytes:
            return data

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetFeatures": grpc.unary_unary_rpc_method_handler(
                    self.get_features,
                    request_deserializer=_parser(pb.GetFeaturesRequest),
                    response_serializer=identity,
                ),
                "WriteFeatures": grpc.unary_unary_rpc_method_handler(
                    self.write_features,
                    request_deserializer=_parser(pb.WriteFeaturesRequest),
                    response_serializer=pb.WriteFeaturesResponse.SerializeToString,
                ),
                "GetRegistry": grpc.unary_unary_rpc_method_handler(
                    self.get_registry,
                    request_deserializer=_parser(pb.GetRegistryRequest),
                    response_serializer=pb.GetRegistryResponse.SerializeToString,
                ),
            },
        )


class GrpcServer:
    """A started grpc.aio server plus the task that keeps its health status current."""

    def __init__(self, server: grpc.aio.Server, port: int, health_task: asyncio.Task[None]) -> None:
        self.server = server
        self.port = port
        self._health_task = health_task

    async def stop(self, grace: float | None = 1.0) -> None:
        self._health_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._health_task
        await self.server.stop(grace)


async def start_grpc_server(runtime: ServingRuntime, host: str, port: int) -> GrpcServer:
    """Serve on host:port (0: a free port).

    SO_REUSEPORT only with several workers, so that they share the port; ``feature-store
    serve`` first checks that no other process holds it (``cli.check_port_free``). A single
    worker binds without it and fails on a port in use, as the REST port does.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1 if runtime.settings.workers > 1 else 0),
            # 1,000 entities x many features, embeddings included, can pass gRPC's 4 MiB
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", runtime.settings.max_body_bytes),
        ]
    )
    servicer = FeatureServicer(runtime)
    server.add_generic_rpc_handlers((servicer.handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        SERVICE,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises when the bind fails
        raise ConfigError(f"cannot serve gRPC on {address}: {e}") from None
    if bound == 0:
        raise ConfigError(f"cannot serve gRPC on {address}: the port is in use")
    await server.start()
    task = asyncio.get_running_loop().create_task(_track_health(runtime, health_servicer))
    log.info("gRPC on %s:%d", host, bound)
    return GrpcServer(server, bound, task)


async def _track_health(runtime: ServingRuntime, servicer: health.aio.HealthServicer) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    while True:
        status = serving if await runtime.ready() else not_serving
        for name in ("", SERVICE):
            await servicer.set(name, status)
        await asyncio.sleep(2.0)
