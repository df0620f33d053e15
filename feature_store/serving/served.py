"""The serving log: a row per served entity, so that training sets are made from what the
models were served (``feature-store training-set``) and online values can be checked
against offline ones.

Every lookup has a request id: the client's (``x-request-id`` header or gRPC metadata, 1 to
128 visible ASCII characters) or one the worker makes (a prefix of its own and a counter),
sent back in the same header or metadata. With ``--feature-log``, a lookup whose id is
sampled (xxh32 of the id below the fraction: the same requests on every worker and on the
native fronts) is offered to the log with its answer's bytes. Serving never waits for the
log:

- The offer appends to a bounded queue per worker (``FEATURE_SERVING_FEATURE_LOG_QUEUE_BYTES``
  of answers; the
  native fronts keep one of their own, ``_native.ServedLog``). A full queue drops the
  answer and counts it.
- The worker's log thread takes both queues, reads each answer (REST's JSON, gRPC's
  protobuf, Feast's JSON) into rows, one per entity, and hands them to the sink.

The rows' values are the answer's values, read back from the bytes the client got. A row:
``request_id``, ``served_at`` (ms), ``api`` (rest, grpc, feast), ``entity_id``, ``source``
(l1: every group from the L1; redis: some read from Redis for this lookup), and per feature
of the entity type ``<group>__<feature>`` (null when not asked or not present) and
``<group>__<feature>__status`` (present, missing, stale, error; null when not asked), and
per group ``<group>__event_time`` (the served second minus the answer's age: whole seconds).

Sinks (``--feature-log URL``):

- ``file:///DIR``: parquet under ``DIR/entity_type=<name>/date=YYYY-MM-DD/hour=HH/``, one
  schema per entity type (every feature of it), written to a hidden ``.part-*.tmp`` name
  and renamed to ``part-*.parquet`` when rolled (``--feature-log-roll-seconds``, or
  ``--feature-log-roll-bytes``): readers (pyarrow, pandas, Spark) skip hidden files, so
  they never see a partial one. A worker killed loses its open files' rows: at most a roll
  interval, plus its queue.
- ``kafka://HOST:PORT/TOPIC``: a JSON record per row, produced asynchronously (librdkafka's
  own bounded buffer; full, the row is dropped and counted). ``feature-store log-sink``
  writes the topic into the file sink's layout.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import xxhash
from prometheus_client import CollectorRegistry, Counter

from feature_store.errors import ConfigError
from feature_store.layout import IdType
from feature_store.native import FEAST, GRPC, REST, native_enabled
from feature_store.registry import EntityType, Registry
from feature_store.serialization.codecs import FeatureType
from feature_store.serialization.json_floats import from_json
from feature_store.serving.config import parse_target

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from feature_store.serving.service import Lookup

log = logging.getLogger(__name__)

API_NAMES = ("rest", "grpc", "feast")
FROM_L1, FROM_REDIS = 0, 1
SOURCES = ("l1", "redis")
REQUEST_ID = "x-request-id"
MAX_REQUEST_ID = 128
EVERY = 1 << 32  # the sampling threshold of a fraction of 1.0
ROW_GROUP = 16_384  # rows buffered per file before they are written as a row group
TICK = 0.1  # seconds the log thread sleeps when both queues are empty
FEAST_STATUSES = {
    "PRESENT": "present",
    "NOT_FOUND": "missing",
    "NULL_VALUE": "missing",
    "OUTSIDE_MAX_AGE": "stale",
    "INVALID": "error",
}
GRPC_STATUSES = ("unspecified", "present", "missing", "stale", "error")
DROP_REASONS = ("queue_full", "front_queue_full", "sink_full", "sink_error", "unreadable")


# --- request ids and sampling ------------------------------------------------------------


def given_id(value: str | None) -> str | None:
    """A client's request id if it is one we keep: 1 to 128 visible ASCII characters."""
    if not value or len(value) > MAX_REQUEST_ID or " " in value:
        return None
    return value if value.isascii() and value.isprintable() else None


def threshold(fraction: float) -> int:
    """The sampling threshold of a fraction: sampled when xxh32(id) < threshold."""
    return EVERY if fraction >= 1.0 else int(fraction * EVERY)


def sampled(request_id: str, limit: int) -> bool:
    """Whether a request id is sampled (deterministic: the same on every worker and front)."""
    return limit >= EVERY or xxhash.xxh32_intdigest(request_id.encode()) < limit


# --- rows --------------------------------------------------------------------------------


def arrow_schema(registry: Registry, entity: EntityType) -> pa.Schema:
    """The parquet schema of an entity type's rows (files, and the Kafka sink's tables)."""
    import pyarrow as pa

    kinds = {
        FeatureType.FLOAT: pa.float64(),
        FeatureType.DOUBLE: pa.float64(),
        FeatureType.INT: pa.int64(),
        FeatureType.BOOL: pa.bool_(),
        FeatureType.STRING: pa.string(),
        FeatureType.EMBEDDING: pa.list_(pa.float32()),
        FeatureType.FLOAT_LIST: pa.list_(pa.float32()),
        FeatureType.INT_LIST: pa.list_(pa.int64()),
    }
    # the few texts of a column (api, source, statuses) stored once per file, as Parquet
    # stores them anyway: readers get strings (pandas: a categorical)
    CODES = pa.dictionary(pa.int8(), pa.string())
    fields: list[tuple[str, pa.DataType]] = [
        ("request_id", pa.string()),
        ("served_at", pa.timestamp("ms", tz="UTC")),
        ("api", CODES),
        ("entity_id", pa.int64() if entity.id_type is IdType.INT else pa.string()),
        ("source", CODES),
    ]
    for g in registry.groups.values():
        if g.entity.name != entity.name:
            continue
        for f in g.features:
            fields.append((f"{g.name}__{f.name}", kinds[f.type]))
            fields.append((f"{g.name}__{f.name}__status", CODES))
        fields.append((f"{g.name}__event_time", pa.timestamp("s", tz="UTC")))
    return pa.schema(fields)


@dataclass(slots=True)
class Served:
    """One answer offered to the log: its API, request id, when it was served (unix ms),
    the second its ages count from, per lookup and entity where its values came from
    (``FROM_L1``/``FROM_REDIS``; one byte string per entity type), and its bytes."""

    api: int
    request_id: str
    served_at_ms: int
    now: int
    sources: Sequence[bytes] | int
    answer: bytes


class Part:
    """The rows of one form (an entity type and the features answered) taken in one pass of
    the log thread, column by column: an answer's values are transposed into the columns
    at C speed (``zip``), and each column becomes one Arrow array."""

    __slots__ = ("columns", "heads", "stamps", "statuses", "values")

    def __init__(self, values: list[str], statuses: list[str], stamps: list[str]) -> None:
        self.heads: dict[str, list[object]] = {name: [] for name in HEADS}
        self.values = [(name, []) for name in values]  # type: list[tuple[str, list[object]]]
        self.statuses = [(name, []) for name in statuses]  # type: list[tuple[str, list[object]]]
        self.stamps = {name: [] for name in stamps}  # type: dict[str, list[object]]
        self.columns: dict[str, list[object]] = {
            **self.heads,
            **dict(self.values),
            **dict(self.statuses),
            **self.stamps,
        }

    def add(
        self,
        served: Served,
        ids: list[object],
        values: Sequence[Sequence[object]],
        statuses: Sequence[Sequence[object]],
        stamps: Sequence[Sequence[object]],
        read: int = 0,
    ) -> None:
        """An answer's rows of this form, read whole first (``columns``): appending cannot
        fail halfway, so the columns stay aligned."""
        n = len(ids)
        heads = self.heads
        heads["request_id"] += [served.request_id] * n
        heads["served_at"] += [served.served_at_ms] * n
        heads["api"] += [API_NAMES[served.api]] * n
        heads["entity_id"] += ids
        sources = served.sources
        if isinstance(sources, int):
            heads["source"] += [SOURCES[sources]] * n
        else:
            heads["source"] += [SOURCES[b] for b in sources[read]]
        for (_, column), got in zip(self.values, values, strict=True):
            column += got
        for (_, column), got in zip(self.statuses, statuses, strict=True):
            column += got
        for column, got in zip(self.stamps.values(), stamps, strict=True):
            column += got

    @property
    def rows(self) -> int:
        return len(self.heads["entity_id"])

    def table(self, schema: pa.Schema) -> pa.Table:
        import pyarrow as pa

        n = len(self.heads["entity_id"])
        arrays = []
        for f in schema:
            found = self.columns.get(f.name)
            if found is None:
                arrays.append(pa.nulls(n, f.type))
                continue
            try:
                arrays.append(pa.array(found, f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                # a float the answer wrote as text ("NaN", "Infinity"): its number
                arrays.append(pa.array([_number(v) for v in found], f.type))
        return pa.Table.from_arrays(arrays, schema=schema)


HEADS = ("request_id", "served_at", "api", "entity_id", "source")
NATIVE = "native"  # in a part's key: its rows read by the extension
# the extension's column kinds (native/src/logrows.rs)
NATIVE_KINDS = {
    FeatureType.FLOAT: 0,
    FeatureType.DOUBLE: 0,
    FeatureType.INT: 1,
    FeatureType.BOOL: 2,
    FeatureType.STRING: 3,
    FeatureType.EMBEDDING: 4,
    FeatureType.FLOAT_LIST: 4,
    FeatureType.INT_LIST: 5,
}
STATUSES = ("unspecified", "present", "missing", "stale", "error")  # gRPC's numbers


class NativePart:
    """The rows of one form read by the extension (``_native.LogColumns``): Arrow arrays
    made from its buffers, no Python object per value."""

    __slots__ = ("columns", "int_ids", "stamps", "statuses", "values")

    def __init__(
        self,
        columns: Any,
        values: list[str],
        statuses: list[str],
        stamps: list[str],
        int_ids: bool,
    ) -> None:
        self.columns = columns
        self.values, self.statuses, self.stamps = values, statuses, stamps
        self.int_ids = int_ids

    @property
    def rows(self) -> int:
        return int(self.columns.rows)

    def table(self, schema: pa.Schema) -> pa.Table:
        import pyarrow as pa

        n = self.columns.rows
        rids, served, apis, sources, ids, features, stamps = self.columns.finish()
        codes = _codes()
        made: dict[str, pa.Array] = {
            "request_id": _arrow(pa.string(), n, rids),
            "served_at": pa.Array.from_buffers(
                pa.timestamp("ms", tz="UTC"), n, [None, pa.py_buffer(served)]
            ),
            "api": _coded(n, apis, codes[0]),
            "source": _coded(n, sources, codes[1]),
            "entity_id": _arrow(pa.int64() if self.int_ids else pa.string(), n, ids),
        }
        for value, status, (buffers, coded) in zip(
            self.values, self.statuses, features, strict=True
        ):
            made[value] = _arrow(schema.field(value).type, n, buffers)
            made[status] = _coded(n, coded, codes[2])
        for stamp, buffers in zip(self.stamps, stamps, strict=True):
            made[stamp] = _arrow(pa.timestamp("s", tz="UTC"), n, buffers)
        arrays = [made.get(f.name) or pa.nulls(n, f.type) for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)


@functools.cache
def _codes() -> tuple[pa.Array, pa.Array, pa.Array]:
    """The texts of the coded columns, by the extension's numbers."""
    import pyarrow as pa

    return pa.array(API_NAMES), pa.array(SOURCES), pa.array(STATUSES)


def _coded(n: int, codes: bytes, texts: pa.Array) -> pa.Array:
    import pyarrow as pa

    indices = pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer(codes)])
    return pa.DictionaryArray.from_arrays(indices, texts)


def _arrow(kind: pa.DataType, n: int, buffers: tuple[int, bytes, bytes, bytes]) -> pa.Array:
    """An array of ``kind`` from the extension's buffers (validity, offsets, values)."""
    import pyarrow as pa

    _, valid, offsets, values = buffers
    validity = pa.py_buffer(valid)
    if pa.types.is_list(kind):
        child_type = kind.value_type
        width = 4 if child_type == pa.float32() else 8
        child = pa.Array.from_buffers(
            child_type, len(values) // width, [None, pa.py_buffer(values)]
        )
        return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(offsets)], children=[child])
    if pa.types.is_string(kind):
        return pa.Array.from_buffers(
            kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(values)]
        )
    return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(values)])


class AnswerRows:
    """Reads answers back into rows, by API, into one ``Part`` per form."""

    def __init__(self, registry: Registry, native: bool | None = None) -> None:
        self.registry = registry
        self.native = native_enabled() if native is None else native
        self._heads: dict[tuple[int, bytes], tuple[str, tuple[str, ...]] | None] = {}
        self._named: dict[tuple[str, tuple[str, ...]], tuple[list[str], list[str], list[str]]] = {}
        self._feast: dict[tuple[str, ...], tuple[list[EntityType], list[tuple[int, str]]]] = {}

    def add(self, served: Served, parts: dict[tuple[str, object], Any]) -> None:
        """The answer's rows, into ``parts`` (by entity type and form): REST's and gRPC's
        read by the extension (``NativePart``) where it is on, else (or for an answer it
        does not read) by the reference below."""
        if self.native and served.api != FEAST and self._native(served, parts):
            return
        if served.api == REST:
            self._rest(served, parts)
        elif served.api == GRPC:
            self._grpc(served, parts)
        else:
            self._feast_rows(served, parts)

    def _native(self, served: Served, parts: dict[tuple[str, object], Any]) -> bool:
        """Whether the extension read the answer's rows (into a ``NativePart``)."""
        from feature_store import _native

        answer = served.answer
        if served.api == REST:
            cut = answer.find(b'"results":[')
        else:
            try:
                cut = _native.grpc_head(answer)
            except ValueError:
                return False
        if cut < 0:
            return False
        head = answer[:cut]
        key = (served.api, head)
        if key in self._heads:
            form = self._heads[key]
        else:
            if len(self._heads) >= 4096:  # forms come from clients: bounded
                self._heads.clear()
            form = self._heads[key] = self._head(served.api, head)
        if form is None:
            return False
        entity, names = form
        part = parts.get((entity, (NATIVE, names)))
        if part is None:
            part = parts[(entity, (NATIVE, names))] = self._native_part(entity, names)
        sources = served.sources
        codes = bytes((sources,)) if isinstance(sources, int) else sources[0]
        add = part.columns.add_rest if served.api == REST else part.columns.add_grpc
        try:
            add(answer, served.request_id, served.served_at_ms, served.now, served.api, codes)
        except ValueError:
            return False
        return True

    def _head(self, api: int, head: bytes) -> tuple[str, tuple[str, ...]] | None:
        """An answer's entity type and features, from the bytes before its rows."""
        try:
            if api == REST:
                parsed = orjson.loads(head + b'"results":[]}')
                entity, names = parsed["entity_type"], tuple(parsed["features"])
            else:
                from feature_store.proto.v1 import serving_pb2 as pb

                message = pb.GetFeaturesResponse.FromString(head)
                entity, names = message.entity_type, tuple(message.features)
            features = self.registry.features_of(entity)
            if not all(n in features for n in names):
                return None
        except Exception:
            return None
        return entity, names

    def _native_part(self, entity: str, names: tuple[str, ...]) -> NativePart:
        from feature_store import _native

        features = self.registry.features_of(entity)
        values, statuses, stamps = self._form_columns(entity, names)
        groups = [s[: -len("__event_time")] for s in stamps]
        kinds = [NATIVE_KINDS[features[n].type] for n in names]
        int_ids = self.registry.entities[entity].id_type is IdType.INT
        return NativePart(
            _native.LogColumns(kinds, groups, int_ids), values, statuses, stamps, int_ids
        )

    def _form_columns(
        self, entity: str, names: tuple[str, ...]
    ) -> tuple[list[str], list[str], list[str]]:
        key = (entity, names)
        found = self._named.get(key)
        if found is None:
            features = self.registry.features_of(entity)
            groups = [features[n].group for n in names]
            found = self._named[key] = (
                [f"{g}__{n}" for g, n in zip(groups, names, strict=True)],
                [f"{g}__{n}__status" for g, n in zip(groups, names, strict=True)],
                [f"{g}__event_time" for g in dict.fromkeys(groups)],
            )
        return found

    def _form(
        self, parts: dict[tuple[str, object], Part], entity: str, names: tuple[str, ...]
    ) -> Part:
        part = parts.get((entity, names))
        if part is None:
            part = parts[(entity, names)] = Part(*self._form_columns(entity, names))
        return part

    def _rest(self, served: Served, parts: dict[tuple[str, object], Part]) -> None:
        answer = orjson.loads(served.answer)
        entity, names = answer["entity_type"], tuple(answer["features"])
        results = answer["results"]
        ids = [r["id"] for r in results]
        values = columns([r["values"] for r in results], len(names))
        statuses = columns([r["statuses"] for r in results], len(names))
        part = self._form(parts, entity, names)
        stamps = _stamps(part, served.now, [r["ages"] for r in results])
        part.add(served, ids, values, statuses, stamps)

    def _grpc(self, served: Served, parts: dict[tuple[str, object], Part]) -> None:
        from feature_store.proto.v1 import serving_pb2 as pb

        answer = pb.GetFeaturesResponse.FromString(served.answer)
        names = tuple(answer.features)
        rows = answer.rows
        ids = [getattr(r.id, r.id.WhichOneof("id") or "int_id") for r in rows]
        values = columns([[_proto_value(v) for v in r.values] for r in rows], len(names))
        statuses = columns([[GRPC_STATUSES[s] for s in r.statuses] for r in rows], len(names))
        part = self._form(parts, answer.entity_type, names)
        stamps = _stamps(part, served.now, [r.ages for r in rows])
        part.add(served, ids, values, statuses, stamps)

    def _feast_rows(self, served: Served, parts: dict[tuple[str, object], Part]) -> None:
        answer = orjson.loads(served.answer)
        names = tuple(answer["metadata"]["feature_names"])
        results = answer["results"]
        entities, features = self._feast_columns(names)
        keys = len(entities)
        adds = []
        for read, entity in enumerate(entities):
            mine = [(keys + i, name) for i, (r, name) in enumerate(features) if r == read]
            part = self._form(parts, entity.name, tuple(name for _, name in mine))
            ids = results[read]["values"]
            n = len(ids)
            values = [results[ci]["values"] for ci, _ in mine]
            statuses = [
                [FEAST_STATUSES.get(s, "error") for s in results[ci]["statuses"]] for ci, _ in mine
            ]
            if any(len(c) != n for c in (*values, *statuses)):
                raise ValueError("a Feast answer's columns differ in length")
            stamps = []
            for stamp in part.stamps:  # a group's time: its first feature's column
                group = stamp[: -len("__event_time")] + "__"
                ci = next(
                    ci
                    for (ci, _), (name, _) in zip(mine, part.values, strict=True)
                    if name.startswith(group)
                )
                stamps.append([_feast_time(t) for t in results[ci]["event_timestamps"]])
            adds.append((part, ids, values, statuses, stamps, read))
        for part, ids, values, statuses, stamps, read in adds:
            part.add(served, ids, values, statuses, stamps, read)

    def _feast_columns(
        self, names: tuple[str, ...]
    ) -> tuple[list[EntityType], list[tuple[int, str]]]:
        """The entity types of a Feast answer's key columns, and per feature column: the
        read (key column) it belongs to and the feature's name."""
        found = self._feast.get(names)
        if found is not None:
            return found
        registry = self.registry
        entities: list[EntityType] = []
        for name in names:
            entity = registry.by_join_key(name)
            if entity is None:
                break
            entities.append(entity)
        columns = []
        for name in names[len(entities) :]:
            group, _, feature = name.partition("__")
            g = registry.groups.get(group)
            if g is None or all(f.name != feature for f in g.features):
                # a bare name: the feature of that name among the request's entity types
                g = next(
                    registry.groups[registry.features_of(e.name)[name].group]
                    for e in entities
                    if name in registry.features_of(e.name)
                )
                feature = name
            read = next(i for i, e in enumerate(entities) if e.name == g.entity.name)
            columns.append((read, feature))
        self._feast[names] = (entities, columns)
        return entities, columns


def columns(rows: list[list[object]], width: int) -> list[tuple[object, ...]]:
    """Rows of ``width`` values each, as ``width`` columns (``zip``: C speed)."""
    if not rows:
        return [()] * width
    out = list(zip(*rows, strict=True))
    if len(out) != width:
        raise ValueError(f"an answer's rows have {len(out)} values, not {width}")
    return out


def _stamps(part: Part, now: int, ages: list[Any]) -> list[list[int | None]]:
    """Each group's event time, per row: the served second minus the answer's age."""
    out = []
    for stamp in part.stamps:
        group = stamp[: -len("__event_time")]
        got = [a.get(group) for a in ages]
        out.append([None if age is None else now - int(age) for age in got])
    return out


def _number(value: object) -> object:
    """A value of a number column as a number: JSON's texts of non-finite floats read."""
    if isinstance(value, str):
        return from_json(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def _proto_value(v: Any) -> object:
    kind = v.WhichOneof("kind")
    if kind is None:
        return None
    if kind in ("float_list", "int_list"):
        return list(getattr(v, kind).values)
    return getattr(v, kind)


def _feast_time(stamp: str) -> int | None:
    """Feast's event timestamp (ISO 8601, UTC) in unix seconds; None for the epoch (Feast's
    time of a value it does not have)."""
    if stamp.startswith("1970-01-01T00:00:00"):
        return None
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


# --- the sinks ---------------------------------------------------------------------------


class LogMetrics:
    """The log's counters (Prometheus; deployment totals in multiprocess mode)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        prefix = "feature_serving_log"
        self.rows = Counter(f"{prefix}_rows", "rows written to the serving log", registry=registry)
        self.dropped = Counter(
            f"{prefix}_dropped",
            "rows (or, queue_full and front_queue_full, answers) the serving log dropped, by "
            "reason: its queue full (a worker's, a native front's), the sink's buffer full, "
            "the sink failing, an answer that could not be read",
            ["reason"],
            registry=registry,
        )
        self.bytes = Counter(
            f"{prefix}_bytes", "bytes the serving log wrote (files closed, records produced)",
            registry=registry,
        )  # fmt: skip
        self.files = Counter(
            f"{prefix}_files", "log files rolled (closed and renamed)", registry=registry
        )
        self.sink_errors = Counter(
            f"{prefix}_sink_errors", "failures of the serving log's sink (a write, a delivery)",
            registry=registry,
        )  # fmt: skip
        for reason in DROP_REASONS:
            self.dropped.labels(reason)


class Sink(Protocol):
    def write(self, entity: str, rows: pa.Table, at: float) -> None: ...
    def tick(self, at: float) -> None: ...
    def close(self) -> None: ...


def _by_hour(entity: str, rows: pa.Table) -> list[tuple[tuple[str, str, str], pa.Table]]:
    """The rows by the date and hour (UTC) they were served: one part, but at an hour's
    turn."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    served = rows.column("served_at").cast("int64")
    hours = pc.divide(served, 3_600_000)
    first, last = pc.min(hours).as_py(), pc.max(hours).as_py()

    def key(hour: int) -> tuple[str, str, str]:
        stamp = time.gmtime(hour * 3600)
        return entity, time.strftime("%Y-%m-%d", stamp), time.strftime("%H", stamp)

    if first == last:
        return [(key(first), rows)]
    return [(key(h), rows.filter(pc.equal(hours, h))) for h in range(first, last + 1)]


@dataclass(slots=True)
class _Open:
    """A file being written: its hidden name, its final name, its writer."""

    tmp: Path
    final: Path
    handle: Any
    writer: Any
    opened: float
    rows: int = 0


class FileSink:
    """Parquet files per entity type, date and hour, rolled by time and size, renamed into
    place when complete."""

    def __init__(
        self,
        root: Path,
        registry: Registry,
        metrics: LogMetrics,
        worker: str,
        roll_seconds: float,
        roll_bytes: int,
    ) -> None:
        try:
            import pyarrow  # noqa: F401  (fails here, at startup, where it is missing)
        except ImportError:
            raise ConfigError(
                "--feature-log file:// needs pyarrow: pip install 'feature-store[log]'"
            ) from None

        self.root = root
        self.registry = registry
        self.metrics = metrics
        self.worker = worker
        self.roll_seconds = roll_seconds
        self.roll_bytes = roll_bytes
        self._open: dict[tuple[str, str, str], _Open] = {}
        self._buffers: dict[tuple[str, str, str], list[pa.Table]] = {}
        self._seq = itertools.count()
        root.mkdir(parents=True, exist_ok=True)

    def write(self, entity: str, rows: pa.Table, at: float) -> None:
        """Rows of one entity type (``schema``), by the date and hour they were served."""
        for key, part in _by_hour(entity, rows):
            buffer = self._buffers.get(key)
            if buffer is None:
                buffer = self._buffers[key] = []
            buffer.append(part)
            if sum(t.num_rows for t in buffer) >= ROW_GROUP:
                self._flush(key, at)

    def _flush(self, key: tuple[str, str, str], at: float) -> None:
        import pyarrow as pa

        tables = self._buffers.pop(key, None)
        if not tables:
            return
        rows = sum(t.num_rows for t in tables)
        f = self._open.get(key)
        try:
            if f is None:
                f = self._open[key] = self._create(key, at, tables[0].schema)
            f.writer.write_table(pa.concat_tables(tables))
            f.rows += rows
        except Exception:
            log.warning("the serving log could not write %d rows", rows, exc_info=True)
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc(rows)
            self._discard(key)
            return
        if f.handle.tell() >= self.roll_bytes:
            self._roll(key)

    def _create(self, key: tuple[str, str, str], at: float, schema: pa.Schema) -> _Open:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        entity, date, hour = key
        folder = self.root / f"entity_type={entity}" / f"date={date}" / f"hour={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{self.worker}-{next(self._seq):06d}.parquet"
        tmp = folder / f".{name}.tmp"
        handle = open(tmp, "wb")  # noqa: SIM115  (closed when rolled or discarded)
        # statistics of the columns a reader filters on (time, entity, request) alone: those
        # of every feature column cost a quarter of the write
        writer = pq.ParquetWriter(
            handle,
            schema,
            compression="zstd",
            write_statistics=["served_at", "entity_id", "request_id"],
        )
        return _Open(tmp, folder / name, handle, writer, at)

    def _roll(self, key: tuple[str, str, str]) -> None:
        f = self._open.pop(key)
        try:
            f.writer.close()
            size = f.handle.tell()
            f.handle.close()
            os.replace(f.tmp, f.final)  # readers skip the hidden name: never a partial file
        except Exception:
            log.warning("the serving log could not close %s", f.tmp, exc_info=True)
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc(f.rows)
            with contextlib.suppress(OSError):
                f.handle.close()
                f.tmp.unlink()
            return
        self.metrics.rows.inc(f.rows)
        self.metrics.bytes.inc(size)
        self.metrics.files.inc()

    def _discard(self, key: tuple[str, str, str]) -> None:
        f = self._open.pop(key, None)
        if f is not None:
            self.metrics.dropped.labels("sink_error").inc(f.rows)
            with contextlib.suppress(Exception):
                f.handle.close()
                f.tmp.unlink()

    def tick(self, at: float) -> None:
        """Roll the files that are due: their first row is a roll interval old (rows still
        buffered are written first)."""
        for key in set(self._open) | set(self._buffers):
            f = self._open.get(key)
            tables = self._buffers.get(key)
            since = f.opened if f is not None else self._first(tables) if tables else at
            if at - since >= self.roll_seconds:
                self._flush(key, since)
                if key in self._open:
                    self._roll(key)

    @staticmethod
    def _first(tables: list[pa.Table]) -> float:
        return float(tables[0].column("served_at")[0].value) / 1000

    def close(self) -> None:
        at = time.time()
        for key in list(self._buffers):
            self._flush(key, at)
        for key in list(self._open):
            self._roll(key)


class KafkaSink:
    """A JSON record per row on a topic, produced asynchronously (keyed by entity id)."""

    def __init__(
        self, bootstrap: str, topic: str, metrics: LogMetrics, buffered: int = 100_000
    ) -> None:
        try:
            from confluent_kafka import Producer
        except ImportError:
            raise ConfigError(
                "--feature-log kafka:// needs confluent-kafka: pip install 'feature-store[log]'"
            ) from None
        self.topic = topic
        self.metrics = metrics
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "queue.buffering.max.messages": buffered,
                "message.timeout.ms": 30_000,
                "compression.type": "zstd",
            }
        )

    def _delivered(self, error: object, message: Any) -> None:
        if error is not None:
            self.metrics.sink_errors.inc()
            self.metrics.dropped.labels("sink_error").inc()
        else:
            self.metrics.rows.inc()
            self.metrics.bytes.inc(len(message.value()))

    def write(self, entity: str, rows: pa.Table, at: float) -> None:
        import pyarrow as pa

        # times as numbers (served_at in ms, event times in seconds), as the sink job reads
        for i, f in enumerate(rows.schema):
            if pa.types.is_timestamp(f.type):
                rows = rows.set_column(i, f.name, rows.column(i).cast(pa.int64()))
        produce = self.producer.produce
        for row in rows.to_pylist():
            row["entity_type"] = entity
            try:
                produce(
                    self.topic,
                    orjson.dumps(row),
                    str(row["entity_id"]).encode(),
                    on_delivery=self._delivered,
                )
            except BufferError:
                self.metrics.dropped.labels("sink_full").inc()
        self.producer.poll(0)

    def tick(self, at: float) -> None:
        self.producer.poll(0)

    def close(self) -> None:
        left = self.producer.flush(5.0)
        if left:
            self.metrics.dropped.labels("sink_error").inc(left)


# --- the log -----------------------------------------------------------------------------


class FeatureLog:
    """One worker's request ids and serving log (``logging`` False: request ids only)."""

    def __init__(
        self,
        registry: Registry,
        url: str | None = None,
        *,
        sample: float = 1.0,
        roll_seconds: float = 60.0,
        roll_bytes: int = 128 * 1024 * 1024,
        queue_bytes: int = 32 * 1024 * 1024,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry
        self.prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count()
        self.target = parse_target(url) if url else None
        self.logging = self.target is not None
        self.threshold = threshold(sample)
        self.capacity = queue_bytes
        self._queued = 0  # bytes of answers queued (under _counting, with the log thread)
        self.roll_seconds = roll_seconds
        self.roll_bytes = roll_bytes
        self._queue: deque[Served] = deque()
        self._front_dropped = 0  # the native fronts' drops counted so far
        self._counting = threading.Lock()
        self.metrics = LogMetrics(metrics) if self.logging else None
        self._queue_full = self.metrics.dropped.labels("queue_full") if self.metrics else None
        self.native: Any = None
        if native_enabled():
            from feature_store._native import ServedLog

            self.native = ServedLog(self.prefix, self.threshold, queue_bytes, self.logging)
        self.rows = AnswerRows(registry)
        self._schemas: dict[str, pa.Schema] = {}
        self._sink: Sink | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()

    # --- on the serving thread

    def request_id(self, given: str | None) -> str:
        """The client's request id, or a new one (this worker's prefix and a counter)."""
        return given_id(given) or f"{self.prefix}{next(self._ids):016x}"

    def offer(self, api: int, request_id: str, answer: bytes, lookups: Sequence[Lookup]) -> None:
        """Offer an answer to the log (kept if its request id is sampled and the queue has
        room; else dropped and counted). Never waits."""
        if not self.logging or not sampled(request_id, self.threshold):
            return
        with self._counting:
            full = self._queued + len(answer) > self.capacity
            if not full:
                self._queued += len(answer)
        if full:
            assert self._queue_full is not None
            self._queue_full.inc()
            return
        sources = [_sources(lookup) for lookup in lookups]
        now = lookups[0].now if lookups else int(time.time())
        self._queue.append(
            Served(api, request_id, time.time_ns() // 1_000_000, now, sources, answer)
        )

    # --- the log thread

    def start(self) -> None:
        """Open the sink (failing here, at startup, when it cannot be) and start the thread."""
        if self.target is None or self._thread is not None:
            return
        assert self.metrics is not None
        if self.target.kind == "file":
            assert self.target.path is not None
            self._sink = FileSink(
                self.target.path,
                self.registry,
                self.metrics,
                f"{self.prefix[:8]}{os.getpid()}",
                self.roll_seconds,
                self.roll_bytes,
            )
        else:
            assert self.target.bootstrap is not None
            assert self.target.topic is not None
            self._sink = KafkaSink(self.target.bootstrap, self.target.topic, self.metrics)
        self._thread = threading.Thread(target=self._run, name="feature-log", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the sink's files (or flush its records)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        assert self._sink is not None
        sink = self._sink
        while True:
            stopping = self._stop.is_set()
            taken = self._take()
            if taken:
                self._write(sink, taken)
            self.count_drops()
            try:
                sink.tick(time.time())
            except Exception:
                log.warning("the serving log's sink failed", exc_info=True)
            if stopping:
                break
            if not taken:
                self._stop.wait(TICK)
        try:
            sink.close()
        except Exception:
            log.warning("the serving log's sink failed to close", exc_info=True)
        self.count_drops()

    def _take(self) -> list[Served]:
        queue = self._queue
        taken = [queue.popleft() for _ in range(len(queue))]
        with self._counting:
            self._queued -= sum(len(s.answer) for s in taken)
        if self.native is not None:
            for api, request_id, served_at, source, answer in self.native.take():
                taken.append(Served(api, request_id, served_at, served_at // 1000, source, answer))
        return taken

    def _write(self, sink: Sink, taken: list[Served]) -> None:
        import pyarrow as pa

        assert self.metrics is not None
        parts: dict[tuple[str, object], Part | NativePart] = {}
        for served in taken:
            try:
                self.rows.add(served, parts)
            except Exception:
                log.warning("the serving log could not read an answer", exc_info=True)
                self.metrics.dropped.labels("unreadable").inc()
        by_entity: dict[str, list[Part | NativePart]] = {}
        for (entity, _), part in parts.items():
            by_entity.setdefault(entity, []).append(part)
        at = time.time()
        for entity, entity_parts in by_entity.items():
            rows = sum(p.rows for p in entity_parts)
            try:
                schema = self.schema(entity)
                table = pa.concat_tables([p.table(schema) for p in entity_parts])
                sink.write(entity, table, at)
            except Exception:
                log.warning("the serving log's sink failed", exc_info=True)
                self.metrics.sink_errors.inc()
                self.metrics.dropped.labels("sink_error").inc(rows)

    def schema(self, entity: str) -> pa.Schema:
        found = self._schemas.get(entity)
        if found is None:
            found = self._schemas[entity] = arrow_schema(
                self.registry, self.registry.entities[entity]
            )
        return found

    def count_drops(self) -> None:
        """Count the native fronts' drops (the log thread, and each scrape: a stalled sink
        stalls the thread, and the drops must show then most of all)."""
        if self.native is None or self.metrics is None:
            return
        with self._counting:
            front = self.native.dropped
            if front > self._front_dropped:
                self.metrics.dropped.labels("front_queue_full").inc(front - self._front_dropped)
                self._front_dropped = front


def _sources(lookup: Lookup) -> bytes:
    """Per entity of a lookup: FROM_REDIS where a group's entry was loaded for it."""
    started = lookup.started
    return bytes(
        FROM_REDIS if any(r.entry.loaded_at >= started for r in row) else FROM_L1
        for row in lookup.entries
    )
