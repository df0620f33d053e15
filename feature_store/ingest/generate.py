"""Deterministic sample input for the job, in the standard benchmark shape, made by Spark.

Each entity's values come from ``feature_store.sample.features(id, seed)``, so any slice
of ids is generated independently by any task and the output does not depend on the
number of partitions. Columns: ``consumer_id`` (bigint), 40 float, 5 bigint, 3
array<bigint> and 2 array<float> columns named like the features. CSV cannot hold arrays,
so there the list columns are JSON text, which the job parses.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_store import sample
from feature_store.errors import RequestError
from feature_store.serialization import FeatureType

ID_COLUMN = f"{sample.ENTITY}_id"
FORMATS = ("parquet", "csv", "json")

_SPARK: dict[FeatureType, T.DataType] = {
    FeatureType.FLOAT: T.FloatType(),
    FeatureType.INT: T.LongType(),
    FeatureType.INT_LIST: T.ArrayType(T.LongType(), containsNull=False),
    FeatureType.EMBEDDING: T.ArrayType(T.FloatType(), containsNull=False),
}
_ARROW: dict[FeatureType, pa.DataType] = {
    FeatureType.FLOAT: pa.float32(),
    FeatureType.INT: pa.int64(),
    FeatureType.INT_LIST: pa.list_(pa.int64()),
    FeatureType.EMBEDDING: pa.list_(pa.float32()),
}


def sample_schema() -> T.StructType:
    group = sample.registry().group(sample.GROUP)
    return T.StructType(
        [T.StructField(ID_COLUMN, T.LongType(), False)]
        + [T.StructField(f.name, _SPARK[f.type], False) for f in group.features]
    )


def sample_frame(
    spark: SparkSession, entities: int, *, seed: int = 0, start: int = 0, partitions: int = 4
) -> DataFrame:
    """``entities`` rows of sample data for ids ``start .. start+entities-1``."""
    if entities < 1:
        raise RequestError("--entities must be at least 1")
    if partitions < 1:
        raise RequestError("--partitions must be at least 1")
    schema = sample_schema()
    ids = spark.range(start, start + entities, numPartitions=partitions)
    return ids.mapInArrow(partial(_generate, seed, pa.schema(_arrow_fields())), schema)


def write_sample(
    spark: SparkSession,
    path: str,
    entities: int,
    *,
    seed: int = 0,
    start: int = 0,
    partitions: int = 4,
    format: str = "parquet",
    overwrite: bool = False,
) -> None:
    if format not in FORMATS:
        raise RequestError(f"unknown format {format!r}; use one of {', '.join(FORMATS)}")
    df = sample_frame(spark, entities, seed=seed, start=start, partitions=partitions)
    if format == "csv":
        df = df.select(
            *[
                F.to_json(F.col(f.name)).alias(f.name)
                if isinstance(f.dataType, T.ArrayType)
                else F.col(f.name)
                for f in df.schema.fields
            ]
        )
    writer = df.write.format(format).mode("overwrite" if overwrite else "errorifexists")
    if format == "csv":
        writer = writer.option("header", "true")
    try:
        writer.save(path)
    except Exception as e:  # AnalysisException: the path exists
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RequestError(f"cannot write {path!r}: {first} (use --overwrite)") from None


def _arrow_fields() -> list[pa.Field]:
    group = sample.registry().group(sample.GROUP)
    return [pa.field(ID_COLUMN, pa.int64(), nullable=False)] + [
        pa.field(f.name, _ARROW[f.type], nullable=False) for f in group.features
    ]


def _generate(
    seed: int, schema: pa.Schema, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    names = schema.names[1:]
    for batch in batches:
        ids = batch.column(0).to_pylist()
        rows = [sample.features(i, seed) for i in ids]
        arrays = [pa.array(ids, pa.int64())]
        for f in schema:
            if f.name in names:
                arrays.append(pa.array([r[f.name] for r in rows], f.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
