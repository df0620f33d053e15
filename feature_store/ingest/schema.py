"""The input's Spark schema checked against the registry, before anything touches Redis.

Columns are matched to the group's features by name; ``mapping`` (column -> feature)
renames. Every problem is collected and reported at once, naming the columns, so one
failed run is enough to fix an input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql import types as T

from feature_store.errors import RequestError
from feature_store.ingest.spec import ColumnSpec, Source
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup
from feature_store.serialization import FeatureType

RESERVED_PREFIX = "_ingest_"  # the job's own output columns (see task.py)

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)
_EVENT_TIME_TYPES = (*_NUMERIC, T.TimestampType, T.TimestampNTZType, T.StringType)

# Spark types accepted natively per feature type, and how they are described in errors
_ACCEPTS: dict[FeatureType, tuple[tuple[type[T.DataType], ...], str]] = {
    FeatureType.FLOAT: (_NUMERIC, "float, double, integral or decimal"),
    FeatureType.DOUBLE: (_NUMERIC, "float, double, integral or decimal"),
    FeatureType.INT: (_INTEGRAL, "tinyint, smallint, int or bigint"),
    FeatureType.BOOL: ((T.BooleanType,), "boolean"),
    FeatureType.STRING: ((T.StringType,), "string"),
}
_ARRAY_ELEMENTS: dict[FeatureType, tuple[tuple[type[T.DataType], ...], str]] = {
    FeatureType.EMBEDDING: ((*_INTEGRAL, T.FloatType, T.DoubleType), "array<float|double>"),
    FeatureType.FLOAT_LIST: ((*_INTEGRAL, T.FloatType, T.DoubleType), "array<float|double>"),
    FeatureType.INT_LIST: (_INTEGRAL, "array<bigint|int>"),
}


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    id_column: str
    id_source: Source
    columns: tuple[ColumnSpec, ...]
    ignored: tuple[str, ...]  # extra input columns left out (only with ignore_extra)
    event_time_column: str | None = None

    @property
    def input_columns(self) -> list[str]:
        event_time = [] if self.event_time_column is None else [self.event_time_column]
        return [self.id_column, *(c.column for c in self.columns), *event_time]


def plan_columns(
    schema: T.StructType,
    group: FeatureGroup,
    id_column: str,
    mapping: Mapping[str, str] | None = None,
    *,
    allow_missing: bool = False,
    ignore_extra: bool = False,
    event_time_column: str | None = None,
) -> ColumnPlan:
    """Which input column feeds which feature, or a RequestError naming every bad column.
    ``event_time_column`` holds each row's event time: a timestamp, a number of unix
    seconds, or RFC 3339 text."""
    mapping = dict(mapping or {})
    types = {f.name: f.dataType for f in schema.fields}
    problems: list[str] = []
    features = {f.name: f for f in group.features}

    reserved = [c for c in types if c.startswith(RESERVED_PREFIX)]
    if reserved and not ignore_extra:  # e.g. a quarantine's reason columns
        problems.append(
            f"column(s) {_names(reserved)} use the job's reserved prefix {RESERVED_PREFIX!r} "
            "(pass --ignore-extra-columns to skip them)"
        )
    if id_column not in types:
        raise RequestError(
            f"the input has no id column {id_column!r}; its columns are {_names(types)}"
        )
    id_source = _id_source(types[id_column], group, id_column, problems)
    if event_time_column is not None:
        dtype = types.get(event_time_column)
        if dtype is None:
            problems.append(f"--event-time-column: the input has no column {event_time_column!r}")
        elif not isinstance(dtype, _EVENT_TIME_TYPES):
            problems.append(
                f"event time column {event_time_column!r} has type {dtype.simpleString()} "
                "(accepted: timestamp, a number of unix seconds, or RFC 3339 string)"
            )
        elif event_time_column == id_column or event_time_column in mapping:
            problems.append(f"column {event_time_column!r} cannot be the event time and more")

    target: dict[str, str] = {}  # feature -> column
    for column, name in mapping.items():
        if column not in types:
            problems.append(f"--map {column}={name}: the input has no column {column!r}")
        elif name not in features:
            problems.append(f"--map {column}={name}: group {group.name!r} has no feature {name!r}")
        elif name in target:
            problems.append(f"columns {target[name]!r} and {column!r} both map to feature {name!r}")
        else:
            target[name] = column
    ignored = [c for c in reserved if ignore_extra]
    for column in types:
        if (
            column in (id_column, event_time_column)
            or column in mapping
            or column.startswith(RESERVED_PREFIX)
        ):
            continue
        if column in features and column not in target:
            target[column] = column
        elif column in features:
            problems.append(
                f"column {column!r} and mapped column {target[column]!r} both feed feature "
                f"{column!r}"
            )
        elif ignore_extra:
            ignored.append(column)
        else:
            problems.append(
                f"column {column!r} is not a feature of group {group.name!r} "
                "(rename it with --map COLUMN=FEATURE, or pass --ignore-extra-columns)"
            )
    missing = [f for f in features if f not in target]
    if missing and not allow_missing:
        problems.append(
            f"no column for feature(s) {_names(missing)} of group {group.name!r}: a partial "
            "refresh would mark their old values as fresh (pass --allow-missing-features "
            "to write only the features present)"
        )
    if not target:
        problems.append(f"no input column matches a feature of group {group.name!r}")

    columns = []
    for feature in group.features:  # group order: the order plan_write writes
        if feature.name not in target:
            continue
        column = target[feature.name]
        source = _source(types[column], feature.type)
        if source is None:
            problems.append(
                f"column {column!r} has type {types[column].simpleString()} but feature "
                f"{feature.name!r} is {feature.codec.signature} (accepted: "
                f"{_accepted(feature.type)}, or string text)"
            )
            continue
        columns.append(ColumnSpec(column, feature.name, source))
    if problems:
        raise RequestError(
            "the input does not match the registry, nothing was written:\n  - "
            + "\n  - ".join(problems)
        )
    return ColumnPlan(id_column, id_source, tuple(columns), tuple(ignored), event_time_column)


def _id_source(
    dtype: T.DataType, group: FeatureGroup, id_column: str, problems: list[str]
) -> Source:
    if isinstance(dtype, T.StringType):
        return Source.TEXT if group.entity.id_type is IdType.INT else Source.NATIVE
    if group.entity.id_type is IdType.INT and isinstance(dtype, _INTEGRAL):
        return Source.NATIVE
    want = "an integral or string" if group.entity.id_type is IdType.INT else "a string"
    problems.append(
        f"id column {id_column!r} has type {dtype.simpleString()}, but entity type "
        f"{group.entity.name!r} has {group.entity.id_type.value} ids (needs {want} column)"
    )
    return Source.NATIVE


def _source(dtype: T.DataType, type_: FeatureType) -> Source | None:
    if type_ in _ARRAY_ELEMENTS:
        if isinstance(dtype, T.ArrayType):
            allowed, _ = _ARRAY_ELEMENTS[type_]
            return Source.NATIVE if isinstance(dtype.elementType, allowed) else None
    else:
        allowed, _ = _ACCEPTS[type_]
        if isinstance(dtype, allowed):
            return Source.NATIVE
    return Source.TEXT if isinstance(dtype, T.StringType) else None


def _accepted(type_: FeatureType) -> str:
    return (_ARRAY_ELEMENTS.get(type_) or _ACCEPTS[type_])[1]


def _names(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)
