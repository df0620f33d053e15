"""Answers read back into rows: one ``Part`` (or the extension's ``NativePart``) per form of
answer, column by column, and the parquet schema of an entity type's rows."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from feature_store.layout import IdType
from feature_store.native import FEAST, GRPC, REST, native_enabled
from feature_store.registry import EntityType, Registry
from feature_store.serialization.codecs import FeatureType
from feature_store.serialization.json_floats import from_json

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]


API_NAMES = ("rest", "grpc", "feast")
FROM_L1, FROM_REDIS = 0, 1
SOURCES = ("l1", "redis")
FEAST_STATUSES = {
    "PRESENT": "present",
    "NOT_FOUND": "missing",
    "NULL_VALUE": "missing",
    "OUTSIDE_MAX_AGE": "stale",
    "INVALID": "error",
}
GRPC_STATUSES = ("unspecified", "present", "missing", "stale", "error")


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
