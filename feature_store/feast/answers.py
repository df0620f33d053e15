"""Values between Feast's protobufs and this project's: answers (``Response``, Feast's
``OnlineResponse`` of decoded columns) and writes (``encode_rows``)."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from feast.online_response import TIMESTAMP_POSTFIX, OnlineResponse
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus, GetOnlineFeaturesResponse
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import (
    BoolList,
    DoubleList,
    FloatList,
    Int32List,
    Int64List,
    StringList,
    Value,
)
from feast.value_type import ValueType
from google.protobuf.timestamp_pb2 import Timestamp

from feature_store.batch import (
    PRESENT,
    STALE,
    EntityId,
)
from feature_store.feast.plans import entity_ids
from feature_store.ingest.encode import BatchEncoder, EncodedBatch
from feature_store.ingest.spec import ColumnSpec
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup

# this project's statuses in Feast's terms (MISSING: NULL_VALUE or NOT_FOUND, by the group)
FEAST_PRESENT, FEAST_NOT_FOUND = int(FieldStatus.PRESENT), int(FieldStatus.NOT_FOUND)
FEAST_NULL, FEAST_INVALID = int(FieldStatus.NULL_VALUE), int(FieldStatus.INVALID)
STATUS = {PRESENT: FEAST_PRESENT, STALE: int(FieldStatus.OUTSIDE_MAX_AGE)}


# --- answers ---------------------------------------------------------------------------------


def float32_column(column: list[Any]) -> list[Any]:
    """Doubles as Feast reads a Float32 (the float32 value, widened)."""
    if None not in column:
        return array("f", column).tolist()
    return [None if v is None else array("f", (v,))[0] for v in column]


# a Python value of a declared type as Feast's Value
MAKERS: dict[ValueType, Callable[[Any], Value]] = {
    ValueType.FLOAT: lambda v: Value(float_val=v),
    ValueType.DOUBLE: lambda v: Value(double_val=v),
    ValueType.INT64: lambda v: Value(int64_val=v),
    ValueType.INT32: lambda v: Value(int32_val=v),
    ValueType.BOOL: lambda v: Value(bool_val=v),
    ValueType.STRING: lambda v: Value(string_val=v),
    ValueType.FLOAT_LIST: lambda v: Value(float_list_val=FloatList(val=v)),
    ValueType.DOUBLE_LIST: lambda v: Value(double_list_val=DoubleList(val=v)),
    ValueType.INT64_LIST: lambda v: Value(int64_list_val=Int64List(val=v)),
    ValueType.INT32_LIST: lambda v: Value(int32_list_val=Int32List(val=v)),
    ValueType.BOOL_LIST: lambda v: Value(bool_list_val=BoolList(val=v)),
    ValueType.STRING_LIST: lambda v: Value(string_list_val=StringList(val=v)),
}


class Response(OnlineResponse):
    """Feast's ``OnlineResponse`` of columns already decoded: ``to_dict`` (and so
    ``to_df``, ``to_arrow``) reads them as they are; ``proto`` is built on first use."""

    def __init__(
        self,
        names: list[str],
        values: list[list[Any]],
        statuses: list[list[int]],
        stamps: list[list[int]],
        types: dict[str, ValueType],
    ) -> None:
        # OnlineResponse.__init__ only stores a proto, which this one makes when asked
        self._feature_types = types
        self._names, self._values, self._statuses, self._stamps = names, values, statuses, stamps
        self._proto: GetOnlineFeaturesResponse | None = None

    @property
    def proto(self) -> GetOnlineFeaturesResponse:
        if self._proto is None:
            self._proto = self._build()
        return self._proto

    @proto.setter
    def proto(self, value: GetOnlineFeaturesResponse) -> None:
        self._proto = value

    def _build(self) -> GetOnlineFeaturesResponse:
        proto = GetOnlineFeaturesResponse()
        proto.metadata.feature_names.val.extend(self._names)
        stamp_of: dict[int, Timestamp] = {}
        for name, values, statuses, stamps in zip(
            self._names, self._values, self._statuses, self._stamps, strict=True
        ):
            make = MAKERS[self._feature_types[name]]
            vector = proto.results.add()
            vector.values.extend([Value() if v is None else make(v) for v in values])
            vector.statuses.extend(statuses)
            vector.event_timestamps.extend(
                [stamp_of.get(s) or stamp_of.setdefault(s, Timestamp(seconds=s)) for s in stamps]
            )
        proto.status = True
        return proto

    def to_dict(self, include_event_timestamps: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values, stamps in zip(self._names, self._values, self._stamps, strict=True):
            out[name] = list(values)
            if include_event_timestamps:
                out[name + TIMESTAMP_POSTFIX] = list(stamps)
        return out


# --- writes ----------------------------------------------------------------------------------


def entity_id(key: EntityKeyProto, join_key: str, id_type: IdType) -> EntityId:
    if list(key.join_keys) != [join_key]:
        raise ValueError(f"entity key {list(key.join_keys)}: this view's join key is {join_key!r}")
    return entity_ids([key.entity_values[0]], id_type, join_key)[0]


def text_of(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data


def _python(value: Value) -> object:
    """A Feast Value as the Python value the codecs take (None: Feast's null)."""
    kind = value.WhichOneof("val")
    if kind is None:
        return None
    got = getattr(value, kind)
    return list(got.val) if kind.endswith("_list_val") else got


# the Value field of each declared type, and the Arrow type its column is built as
COLUMNS: dict[ValueType, tuple[str, pa.DataType]] = {
    ValueType.FLOAT: ("float_val", pa.float32()),
    ValueType.DOUBLE: ("double_val", pa.float64()),
    ValueType.INT32: ("int32_val", pa.int64()),
    ValueType.INT64: ("int64_val", pa.int64()),
    ValueType.BOOL: ("bool_val", pa.bool_()),
    ValueType.STRING: ("string_val", pa.string()),
    ValueType.FLOAT_LIST: ("float_list_val", pa.list_(pa.float32())),
    ValueType.INT32_LIST: ("int32_list_val", pa.list_(pa.int64())),
    ValueType.INT64_LIST: ("int64_list_val", pa.list_(pa.int64())),
}
ID_COLUMN, TIME_COLUMN = "__id", "__event_time"
NULL = Value()


def _column(values: Sequence[Value], kind: ValueType) -> pa.Array:
    """One feature's Values as an Arrow column (a null Value: null, which removes it)."""
    attr, arrow = COLUMNS[kind]
    has: Callable[[Value, str], bool] = Value.HasField  # type: ignore[assignment]  # a null Value sets no field
    if kind in (ValueType.FLOAT_LIST, ValueType.INT32_LIST, ValueType.INT64_LIST):
        cells: list[Any] = [list(getattr(v, attr).val) if has(v, attr) else None for v in values]
    else:
        cells = [getattr(v, attr) if has(v, attr) else None for v in values]
    return pa.array(cells, type=arrow)


def encode_rows(
    group: FeatureGroup,
    types: Mapping[str, ValueType],
    data: Sequence[tuple[EntityKeyProto, Mapping[str, Value], datetime, datetime | None]],
) -> EncodedBatch:
    """Feast's rows of one view as the guarded writes of this project's layout: columns
    by declared type, encoded by the nightly job's encoder. A feature a row leaves out is
    removed, as Feast's rows carry every feature of the view."""
    entity = group.entity
    names = [f.name for f in group.features if f.name in types]
    rows = [row[1] for row in data]
    columns = {}
    for name in names:
        try:
            values = [r[name] for r in rows]
        except KeyError:  # a row without the feature: removed (Feast's rows have them all)
            values = [r.get(name, NULL) for r in rows]
        columns[name] = _column(values, types[name])
    ids = [entity_id(row[0], entity.join_key, entity.id_type) for row in data]
    columns[ID_COLUMN] = pa.array(
        ids, type=pa.int64() if entity.id_type is IdType.INT else pa.string()
    )
    columns[TIME_COLUMN] = pa.array(
        [(t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() for _, _, t, _ in data],
        type=pa.float64(),
    )
    encoder = BatchEncoder(
        group,
        ID_COLUMN,
        [ColumnSpec(name, name) for name in names],
        time.time(),
        event_time_column=TIME_COLUMN,
    )
    return encoder.encode(pa.RecordBatch.from_pydict(columns))


def entity_text(key: EntityKeyProto) -> str:
    return ", ".join(
        f"{k}={_python(v)!r}" for k, v in zip(key.join_keys, key.entity_values, strict=False)
    )
