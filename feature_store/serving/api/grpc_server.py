"""The gRPC API (serving.proto): the same service as REST, answered in the same loop.

By default the port belongs to the extension's HTTP/2 front (``fronts.grpc``, which also
starts the server): it serves GetFeatures itself, handing each call to this loop, and
passes every other method through to grpc.aio on a loopback port. With
``grpc_front="grpcio"`` (or the extension off) grpc.aio serves the port and every method.
GetFeatures answers with wire bytes assembled from the cache (``feature_store.serving.api.wire``,
the rows by the native core) through an identity serializer on grpc.aio, the same bytes
on the front; the other methods use the generated message classes.
Standard health checking (grpc.health.v1, status follows Redis readiness) and server
reflection are served too. Errors map to status codes: INVALID_ARGUMENT for bad requests
(with the same messages as REST), UNAUTHENTICATED / PERMISSION_DENIED, UNAVAILABLE when
Redis is down. An entity whose stored data cannot be read fails only itself: its values
get status ERROR and the answer's ``errors`` names it, with the rest of the batch served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection, reflection_pb2

from feature_store.batch import EntityId, WriteRow
from feature_store.client import proto_value
from feature_store.errors import FeatureStoreError
from feature_store.native import GRPC as GRPC_CODE
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.api import wire
from feature_store.serving.auth import Authenticator, AuthError, Role
from feature_store.serving.config import ServingSettings, tls_pem
from feature_store.serving.feature_log import REQUEST_ID
from feature_store.serving.l1.cache import Entry, keeper
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import (
    Learn,
    Lookup,
    MalformedRequestError,
    group_states,
    problem,
)

if TYPE_CHECKING:
    pass

_grpc_rows = None
if native_enabled():
    from feature_store._native import grpc_rows as _grpc_rows  # type: ignore[assignment]

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


def parser(message: type[Any]) -> Callable[[bytes], object]:
    """The method's deserializer; bad bytes give INVALID_ARGUMENT from the handler, where
    grpc would answer UNKNOWN for a deserializer that raises."""

    def parse(data: bytes) -> object:
        try:
            return message.FromString(data)
        except DecodeError as e:
            return _Unparseable(f"the request is not a {message.DESCRIPTOR.full_name}: {e}")

    return parse


def _metadata(context: grpc.aio.ServicerContext, name: str = "authorization") -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
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


def answer_rows(lookup: Lookup, charge: Callable[[Entry], None] | None) -> bytes:
    """GetFeaturesResponse's rows, joined: by the native core for a whole group (the common
    request; ``grpc_rows``), else by ``_answer_rows``, its reference. ``charge`` counts
    the gRPC records an entry gets on first use against the cache's bound (None: they are
    not kept, and ``grpc_rows`` writes them)."""
    proj = lookup.projection
    if not proj.whole_group or _grpc_rows is None or lookup.errors:
        return b"".join(_answer_rows(lookup, charge))
    if charge is not None:
        for ((entry, _),) in lookup.entries:
            if entry.wire is None:
                wire.entry_values(entry, charge)
    group = proj.groups[0]
    return _grpc_rows(
        lookup.ids, lookup.entries, lookup.now, group.max_age_seconds, group.name.encode()
    )


def _answer_rows(lookup: Lookup, charge: Callable[[Entry], None] | None) -> list[bytes]:
    proj, rows = lookup.projection, []
    for entity_id, resolved in zip(lookup.ids, lookup.entries, strict=True):
        stale, ages = group_states(proj, resolved, lookup.now)
        if proj.whole_group:
            entry = resolved[0].entry
            values = wire.entry_values(entry, charge)
            if entry.fault is None:
                statuses = wire.statuses(entry.present, stale[0])
            else:
                statuses = wire.error_statuses(len(entry.present))
        else:
            values, statuses = wire.picked_values(proj.picks, resolved, stale)
        rows.append(wire.row(wire.entity_id(entity_id) + values + statuses + wire.ages(ages)))
    return rows


class FeatureServicer:
    def __init__(self, runtime: ServingRuntime) -> None:
        self.runtime = runtime
        self.service = runtime.service
        self.cache = runtime.reader.cache
        settings = runtime.settings
        self.auth = Authenticator(settings.read_keys, settings.admin_keys)
        self.observe = runtime.metrics.requests.labels
        self.entities_served = runtime.metrics.entities.labels(API)
        # told of each form answered with one group's values (hits.NativeHits)
        self.learn: Learn | None = None
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

    def failure(self, error: BaseException, method: str, t0: float) -> tuple[grpc.StatusCode, str]:
        """The status and details of a failed call (logged when unexpected, and counted)."""
        if not isinstance(error, FeatureStoreError):
            log.exception("unexpected error in gRPC %s", method)
        p = problem(error, writing=method == "write")
        self.observe(API, method, str(p.status)).observe(time.perf_counter() - t0)
        code = _STATUS.get(p.status, grpc.StatusCode.INTERNAL)
        details = f"{p.code}: {p.message}"
        if len(details) > MAX_DETAILS:
            details = details[: MAX_DETAILS - 20] + " ... (truncated)"
        return code, details

    async def _abort(
        self, context: grpc.aio.ServicerContext, error: BaseException, method: str, t0: float
    ) -> None:
        await context.abort(*self.failure(error, method, t0))

    async def get_features(
        self, request: pb.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        t0 = time.perf_counter()
        request_id = self.runtime.served.request_id(_metadata(context, REQUEST_ID))
        await context.send_initial_metadata(((REQUEST_ID, request_id),))
        try:
            return await self.answer(request, _metadata(context), t0, request_id)
        except Exception as e:
            await self._abort(context, e, "get", t0)
            raise AssertionError("unreachable") from None  # abort raises

    async def answer(
        self, request: object, authorization: str | None, t0: float, request_id: str = ""
    ) -> bytes:
        """GetFeaturesResponse's bytes, on either front; raises what ``failure`` maps. The
        answer is offered to the serving log under ``request_id``."""
        role = self.auth.require(authorization, Role.READ)
        _check_parsed(request)
        assert isinstance(request, pb.GetFeaturesRequest)
        if request.bypass_cache and role < Role.ADMIN:
            raise AuthError("bypass_cache needs an admin API key", 403)
        if request.int_ids and request.string_ids:
            raise MalformedRequestError("set int_ids or string_ids, not both")
        ids: Sequence[EntityId] = list(request.int_ids or request.string_ids)
        features, groups = list(request.features), list(request.groups)
        lookup = await self.service.lookup(
            request.entity_type,
            ids,
            features,
            groups,
            bypass=request.bypass_cache,
            proto=True,
        )
        proj = lookup.projection
        header = proj.memo.get(API)
        if header is None:
            header = proj.memo[API] = wire.header(proj.entity.name, proj.names)
        body = cast(bytes, header) + answer_rows(lookup, keeper(self.cache))
        learn = self.learn if not lookup.errors else None
        if learn is not None and not request.bypass_cache:
            learn(request.entity_type, features, groups, proj, cast(bytes, header))
        if lookup.errors:
            body += wire.errors(lookup.errors)
            self.runtime.metrics.count_errors(API, lookup.errors)
        self.entities_served.inc(len(lookup.ids))
        served = self.runtime.served
        if served.logging:
            served.offer(GRPC_CODE, request_id, body, (lookup,))
        self.observe(API, "get", "200").observe(time.perf_counter() - t0)
        return body

    async def write_features(
        self, request: pb.WriteFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteFeaturesResponse:
        t0 = time.perf_counter()
        try:
            self.auth.require(_metadata(context), Role.ADMIN)
            _check_parsed(request)
            rows: list[WriteRow] = []
            for r in request.rows:
                values = {name: proto_value(v) for name, v in r.values.items()}
                if r.HasField("event_time"):
                    rows.append((_entity_id(r.id), values, r.event_time.ToMicroseconds() / 1e6))
                else:
                    rows.append((_entity_id(r.id), values))
            written = await self.service.write(request.group, rows)
        except Exception as e:
            await self._abort(context, e, "write", t0)
            raise AssertionError("unreachable") from None
        self.observe(API, "write", "200").observe(time.perf_counter() - t0)
        stats = written.stats
        return pb.WriteFeaturesResponse(
            entities=stats.entities,
            values_written=stats.values_written,
            values_removed=stats.values_removed,
            skipped=stats.skipped,
            skipped_ids=[
                pb.EntityId(string_id=i) if isinstance(i, str) else pb.EntityId(int_id=i)
                for i in written.skipped
            ],
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
                    request_deserializer=parser(pb.GetFeaturesRequest),
                    response_serializer=identity,
                ),
                "WriteFeatures": grpc.unary_unary_rpc_method_handler(
                    self.write_features,
                    request_deserializer=parser(pb.WriteFeaturesRequest),
                    response_serializer=pb.WriteFeaturesResponse.SerializeToString,
                ),
                "GetRegistry": grpc.unary_unary_rpc_method_handler(
                    self.get_registry,
                    request_deserializer=parser(pb.GetRegistryRequest),
                    response_serializer=pb.GetRegistryResponse.SerializeToString,
                ),
            },
        )


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def reflection_v1(names: Sequence[str]) -> grpc.GenericRpcHandler:
    """Server reflection ``grpc.reflection.v1`` beside ``v1alpha`` (which grpcio-reflection
    serves alone): v1 renamed the package and kept every message field, so v1alpha's
    messages and servicer answer it, byte for byte what a v1 server sends."""
    servicer = reflection.aio.ReflectionServicer(names)
    return grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )


def server_credentials(settings: ServingSettings) -> grpc.ServerCredentials:
    """TLS of the gRPC port from the PEM files (mutual TLS with a client CA)."""
    pem = tls_pem(settings)
    assert pem is not None
    cert, key, ca = pem
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
