"""Clients for model servers: sync and asyncio, over REST or gRPC, with typed results.

    with FeatureClient("http://127.0.0.1:8000", api_key="...", timeout=0.05) as client:
        result = client.get("consumer", [1, 2, 3], groups=["consumer_features"])
        result.rows[0].values, result.rows[0].statuses, result.rows[0].ages

    async with AsyncGrpcFeatureClient("127.0.0.1:50051") as client:
        result = await client.get("consumer", [1, 2, 3], features=["float_00"])

All four answer the same ``FeatureResult`` and raise the project's errors:
``ServingRequestError`` (a ``RequestError``) for a 4xx / INVALID_ARGUMENT whose message
names the problem, ``ServingAuthError`` for 401/403, ``ServingUnavailableError`` (a
``StoreUnavailableError``) when the server or its Redis is unavailable, and
``StoreTimeoutError`` when the timeout passes. httpx and grpc are imported only by the
client that needs them.
"""

from __future__ import annotations

import ssl
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import orjson

from feature_store.batch import (
    EntityError,
    EntityId,
    FaultReason,
    Status,
    WriteRow,
    WriteStats,
    event_time_seconds,
)
from feature_store.errors import RequestError, StoreTimeoutError, StoreUnavailableError
from feature_store.serialization import Value
from feature_store.serialization.json_floats import FLOAT_TYPE_NAMES, from_json, to_json

if TYPE_CHECKING:
    import grpc
    import grpc.aio
    import httpx

    from feature_store.proto.v1 import serving_pb2 as pb

DEFAULT_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class FeatureRow:
    id: EntityId
    values: list[Value | None]  # aligned with FeatureResult.features; None when missing
    statuses: list[Status]
    ages: dict[str, int | None]  # group -> seconds since its last write; None: unknown


@dataclass(frozen=True, slots=True)
class FeatureResult:
    entity_type: str
    features: tuple[str, ...]
    rows: list[FeatureRow]
    # entities whose stored data of a group could not be read: their values of that
    # group are None with status ERROR; the rest of the batch is answered as usual
    errors: list[EntityError] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Value | None]]:
        """Each entity as ``{feature: value}``; missing values are None."""
        return [dict(zip(self.features, r.values, strict=True)) for r in self.rows]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS to a server started with ``--tls-cert``: ``ca`` is a PEM file of the CA that
    signed the server's certificate (None: the system's CAs); ``cert`` and ``key`` are the
    client's certificate and key, for a server that asks for them (``--tls-client-ca``).
    REST clients then take an ``https://`` URL; gRPC clients connect with TLS."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        if self.cert is not None:
            context.load_cert_chain(self.cert, self.key)
        return context

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        import grpc

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca),
            private_key=read(self.key),
            certificate_chain=read(self.cert),
        )


class ServingRequestError(RequestError):
    """The server refused the request (4xx); ``code`` is the API's short error code."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServingAuthError(ServingRequestError):
    """Missing or unknown API key (401), or a key without the needed role (403)."""


class ServingUnavailableError(StoreUnavailableError):
    """The serving API, or the Redis behind it, is unavailable (503, UNAVAILABLE)."""


# --- REST ------------------------------------------------------------------------------

_STATUS = {s.value: s for s in Status}


def _get_body(
    entity_type: str,
    ids: Sequence[EntityId],
    features: Iterable[str],
    groups: Iterable[str],
    bypass_cache: bool,
) -> bytes:
    return orjson.dumps(
        {
            "entity_type": entity_type,
            "ids": list(ids),
            "features": list(features),
            "groups": list(groups),
            "bypass_cache": bypass_cache,
        }
    )


def _write_body(group: str, rows: Iterable[WriteRow]) -> bytes:
    out = []
    for row in rows:
        # orjson writes NaN and infinities as null, which would remove the value: send strings
        doc: dict[str, object] = {
            "id": row[0],
            "values": {k: to_json(x) for k, x in row[1].items()},
        }
        if len(row) > 2:
            doc["event_time"] = _event_time_json(row[2])
        out.append(doc)
    return orjson.dumps({"group": group, "rows": out})


def _event_time_json(value: object) -> object:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise RequestError(f"event time {value!r} has no time zone")
        return value.isoformat()
    return value  # unix seconds or RFC 3339 text: the server checks them


FLOAT32_LISTS = frozenset({"embedding", "float_list"})


def _rest_result(content: bytes) -> FeatureResult:
    doc = orjson.loads(content)
    types = doc.get("types", ())
    floats = [i for i, t in enumerate(types) if t in FLOAT_TYPE_NAMES]
    lists = [i for i, t in enumerate(types) if t in FLOAT32_LISTS]
    rows = []
    for r in doc["results"]:
        values = r["values"]
        for i in floats:  # "NaN", "Infinity", "-Infinity" back to floats
            values[i] = from_json(values[i])
        for i in lists:  # shortest float32 decimals: the float32 values, as gRPC gives them
            if values[i]:
                values[i] = array("f", values[i]).tolist()
        rows.append(FeatureRow(r["id"], values, [_STATUS[s] for s in r["statuses"]], r["ages"]))
    errors = [
        EntityError(e["id"], e["group"], FaultReason(e["reason"]), e["message"])
        for e in doc.get("errors", ())
    ]
    return FeatureResult(doc["entity_type"], tuple(doc["features"]), rows, errors)


def _rest_check(status: int, content: bytes) -> None:
    if status < 400:
        return
    try:
        error = orjson.loads(content)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code, message = "http_error", content[:200].decode(errors="replace")
    if status in (401, 403):
        raise ServingAuthError(message, status, code)
    if status in (502, 503, 504):
        raise ServingUnavailableError(f"{code}: {message}")
    if 400 <= status < 500:
        raise ServingRequestError(message, status, code)
    raise ServingUnavailableError(f"server error {status} {code}: {message}")


def _write_stats(doc: Mapping[str, int]) -> WriteStats:
    return WriteStats(
        doc["entities"], doc["values_written"], doc["values_removed"], doc.get("skipped", 0)
    )


class _RestBase:
    def __init__(self, base_url: str, api_key: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"content-type": "application/json"}
        if api_key is not None:
            self.headers["authorization"] = f"Bearer {api_key}"


class FeatureClient(_RestBase):
    """Blocking REST client (httpx, keep-alive connection pool)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tls: TlsConfig | None = None,
    ) -> None:
        import httpx

        super().__init__(base_url, api_key)
        self._httpx = httpx
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=self.headers,
            timeout=timeout,
            verify=tls.ssl_context() if tls is not None else True,
        )

    def _post(self, path: str, body: bytes) -> bytes:
        try:
            response = self.http.post(path, content=body)
        except self._httpx.TimeoutException as e:
            raise StoreTimeoutError(f"the serving API did not answer in time: {e}") from None
        except self._httpx.TransportError as e:
            raise ServingUnavailableError(f"the serving API is unreachable: {e}") from None
        _rest_check(response.status_code, response.content)
        return response.content

    def get(
        self,
        entity_type: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
        *,
        bypass_cache: bool = False,
    ) -> FeatureResult:
        body = _get_body(entity_type, ids, features, groups, bypass_cache)
        return _rest_result(self._post("/v1/features/get", body))

    def write(self, group: str, rows: Iterable[WriteRow]) -> WriteStats:
        content = self._post("/v1/features/write", _write_body(group, rows))
        return _write_stats(orjson.loads(content))

    def registry(self) -> dict[str, object]:
        try:
            response = self.http.get("/v1/registry")
        except self._httpx.TransportError as e:
            raise ServingUnavailableError(f"the serving API is unreachable: {e}") from None
        _rest_check(response.status_code, response.content)
        doc: dict[str, object] = orjson.loads(response.content)
        return doc

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> FeatureClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFeatureClient(_RestBase):
    """asyncio REST client (httpx.AsyncClient); at most ``max_connections`` at once."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_connections: int = 32,
        tls: TlsConfig | None = None,
    ) -> None:
        import httpx

        super().__init__(base_url, api_key)
        self._httpx = httpx
        self.http: httpx.AsyncClient = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self.headers,
            timeout=timeout,
            verify=tls.ssl_context() if tls is not None else True,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def _post(self, path: str, body: bytes) -> bytes:
        try:
            response = await self.http.post(path, content=body)
        except self._httpx.TimeoutException as e:
            raise StoreTimeoutError(f"the serving API did not answer in time: {e}") from None
        except self._httpx.TransportError as e:
            raise ServingUnavailableError(f"the serving API is unreachable: {e}") from None
        _rest_check(response.status_code, response.content)
        return response.content

    async def get(
        self,
        entity_type: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
        *,
        bypass_cache: bool = False,
    ) -> FeatureResult:
        body = _get_body(entity_type, ids, features, groups, bypass_cache)
        return _rest_result(await self._post("/v1/features/get", body))

    async def write(self, group: str, rows: Iterable[WriteRow]) -> WriteStats:
        content = await self._post("/v1/features/write", _write_body(group, rows))
        return _write_stats(orjson.loads(content))

    async def registry(self) -> dict[str, object]:
        try:
            response = await self.http.get("/v1/registry")
        except self._httpx.TransportError as e:
            raise ServingUnavailableError(f"the serving API is unreachable: {e}") from None
        _rest_check(response.status_code, response.content)
        doc: dict[str, object] = orjson.loads(response.content)
        return doc

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncFeatureClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# --- gRPC ------------------------------------------------------------------------------

_GRPC_STATUS = {1: Status.PRESENT, 2: Status.MISSING, 3: Status.STALE, 4: Status.ERROR}
# answers for 1,000 entities with embeddings can pass gRPC's default 4 MiB limit
_CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 256 * 1024 * 1024),)


def _grpc_request(
    entity_type: str,
    ids: Sequence[EntityId],
    features: Iterable[str],
    groups: Iterable[str],
    bypass_cache: bool,
) -> pb.GetFeaturesRequest:
    from feature_store.proto.v1 import serving_pb2 as pb

    request = pb.GetFeaturesRequest(
        entity_type=entity_type,
        features=list(features),
        groups=list(groups),
        bypass_cache=bypass_cache,
    )
    if ids and all(isinstance(i, str) for i in ids):
        request.string_ids.extend(ids)
    elif all(type(i) is int for i in ids):
        request.int_ids.extend(ids)
    else:
        raise RequestError("ids must be all int or all str")
    return request


def proto_value(v: pb.Value) -> Value | None:
    """A serving.proto ``Value`` as a Python value; None when no kind is set (missing).

    The gRPC server reads push writes with it too, so both ends agree on every kind."""
    kind = v.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "float_list":
        return list(v.float_list.values)
    if kind == "int_list":
        return list(v.int_list.values)
    result: Value = getattr(v, kind)
    return result


def _grpc_result(response: pb.GetFeaturesResponse) -> FeatureResult:
    features = tuple(response.features)
    rows = []
    for r in response.rows:
        ages: dict[str, int | None] = dict(r.ages)
        rows.append(
            FeatureRow(
                getattr(r.id, r.id.WhichOneof("id") or "int_id"),
                [proto_value(v) for v in r.values],
                [_GRPC_STATUS[s] for s in r.statuses],
                ages,
            )
        )
    errors = [
        EntityError(
            getattr(e.id, e.id.WhichOneof("id") or "int_id"),
            e.group,
            FaultReason(e.reason),
            e.message,
        )
        for e in response.errors
    ]
    return FeatureResult(response.entity_type, features, rows, errors)


def _grpc_write_request(group: str, rows: Iterable[WriteRow]) -> pb.WriteFeaturesRequest:
    from feature_store.proto.v1 import serving_pb2 as pb
    from feature_store.proto.v1.values_pb2 import FloatList, IntList

    def value(v: object) -> pb.Value:
        if v is None:
            return pb.Value()
        if isinstance(v, bool):
            return pb.Value(bool_value=v)
        if isinstance(v, int):
            return pb.Value(int_value=v)
        if isinstance(v, float):
            return pb.Value(float_value=v)
        if isinstance(v, str):
            return pb.Value(string_value=v)
        if isinstance(v, list | tuple) and all(type(x) is int for x in v):
            return pb.Value(int_list=IntList(values=v))
        if isinstance(v, list | tuple):
            return pb.Value(float_list=FloatList(values=v))
        raise RequestError(f"cannot send a {type(v).__name__} over gRPC")

    out = pb.WriteFeaturesRequest(group=group)
    now = time.time()
    for entry in rows:
        entity_id, values = entry[0], entry[1]
        row = out.rows.add()
        if isinstance(entity_id, str):
            row.id.string_id = entity_id
        else:
            row.id.int_id = entity_id
        for name, v in values.items():
            row.values[name].CopyFrom(value(v))
        if len(entry) > 2:
            micros = round(event_time_seconds(entry[2], now) * 1e6)
            row.event_time.FromMicroseconds(micros)
    return out


def _grpc_error(error: grpc.RpcError) -> Exception:
    import grpc

    code = error.code()
    details = error.details() or ""
    short, _, message = details.partition(": ")
    if not message:
        short, message = code.name.lower(), details
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return StoreTimeoutError(f"the serving API did not answer in time: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ServingAuthError(message, 401, short)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ServingAuthError(message, 403, short)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ServingRequestError(message, 413 if short == "batch_too_large" else 400, short)
    return ServingUnavailableError(f"{code.name}: {details}")


class _GrpcBase:
    def __init__(self, api_key: str | None, timeout: float) -> None:
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.timeout = timeout


class GrpcFeatureClient(_GrpcBase):
    """Blocking gRPC client."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tls: TlsConfig | None = None,
    ) -> None:
        import grpc

        from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub

        super().__init__(api_key, timeout)
        self._grpc = grpc
        self.channel = (
            grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
            if tls is None
            else grpc.secure_channel(target, tls.grpc_credentials(), options=_CHANNEL_OPTIONS)
        )
        self.stub = FeatureServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def get(
        self,
        entity_type: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
        *,
        bypass_cache: bool = False,
    ) -> FeatureResult:
        request = _grpc_request(entity_type, ids, features, groups, bypass_cache)
        try:
            response = self.stub.GetFeatures(request, timeout=self.timeout, metadata=self.metadata)
        except self._grpc.RpcError as e:
            raise _grpc_error(e) from None
        return _grpc_result(response)

    def write(self, group: str, rows: Iterable[WriteRow]) -> WriteStats:
        request = _grpc_write_request(group, rows)
        try:
            r = self.stub.WriteFeatures(request, timeout=self.timeout, metadata=self.metadata)
        except self._grpc.RpcError as e:
            raise _grpc_error(e) from None
        return WriteStats(r.entities, r.values_written, r.values_removed, r.skipped)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> GrpcFeatureClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGrpcFeatureClient(_GrpcBase):
    """asyncio gRPC client (grpc.aio)."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        tls: TlsConfig | None = None,
    ) -> None:
        import grpc.aio

        from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub

        super().__init__(api_key, timeout)
        self._grpc = grpc
        self.channel = (
            grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
            if tls is None
            else grpc.aio.secure_channel(target, tls.grpc_credentials(), options=_CHANNEL_OPTIONS)
        )
        self.stub = FeatureServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def get(
        self,
        entity_type: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
        *,
        bypass_cache: bool = False,
    ) -> FeatureResult:
        request = _grpc_request(entity_type, ids, features, groups, bypass_cache)
        try:
            response = await self.stub.GetFeatures(
                request, timeout=self.timeout, metadata=self.metadata
            )
        except self._grpc.RpcError as e:
            raise _grpc_error(e) from None
        return _grpc_result(response)

    async def write(self, group: str, rows: Iterable[WriteRow]) -> WriteStats:
        request = _grpc_write_request(group, rows)
        try:
            r = await self.stub.WriteFeatures(request, timeout=self.timeout, metadata=self.metadata)
        except self._grpc.RpcError as e:
            raise _grpc_error(e) from None
        return WriteStats(r.entities, r.values_written, r.values_removed, r.skipped)

    async def aclose(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncGrpcFeatureClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = [
    "AsyncFeatureClient",
    "AsyncGrpcFeatureClient",
    "FeatureClient",
    "FeatureResult",
    "FeatureRow",
    "GrpcFeatureClient",
    "ServingAuthError",
    "ServingRequestError",
    "ServingUnavailableError",
    "TlsConfig",
]
