"""The REST API's OpenAPI schemas: pydantic models of the answers, request bodies from the
served registry.

Requests are parsed with orjson and checked by hand (``feature_store.serving.api.app``): the
checks give the messages the API promises, and they cost a fraction of model validation
on the hot path. These models describe the same contract for /docs and client generators.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from feature_store.batch import MAX_FUTURE_SECONDS
from feature_store.layout import INT64_MAX, INT64_MIN, MAX_STRING_ID_BYTES, IdType
from feature_store.registry import EntityType, Feature, Registry
from feature_store.serialization import FeatureType

JsonSchema = dict[str, Any]

# A float (also in an embedding or float list) that is NaN or infinite is the string "NaN",
# "Infinity" or "-Infinity", as in protobuf's JSON mapping: JSON has no number for it.
JsonValue = float | int | bool | str | list[float | str] | list[int] | None


class FeatureRow(BaseModel):
    id: int | str
    values: list[JsonValue] = Field(description="aligned with 'features'; null when missing")
    statuses: list[Literal["present", "missing", "stale", "error"]] = Field(
        description="present, missing, stale or error (the entity's stored data of the "
        "feature's group cannot be read: see 'errors'), per value"
    )
    ages: dict[str, int | None] = Field(
        description="per group: seconds since its last write, null when unknown"
    )


class EntityError(BaseModel):
    id: int | str
    group: str
    reason: Literal["undecodable_value", "corrupt_write_time", "wrong_type"] = Field(
        description="undecodable_value: a stored value does not decode as its type; "
        "corrupt_write_time: the group's write time is not a unix time; wrong_type: the "
        "entity's key holds another Redis type than a hash"
    )
    message: str = Field(description="names the key, and the feature of an undecodable value")


class GetFeaturesResponse(BaseModel):
    entity_type: str
    features: list[str] = Field(description="the resolved feature names, in order")
    types: list[str] = Field(
        description="each feature's type (float, double, int, bool, string, embedding, "
        "float_list, int_list), aligned with 'features'"
    )
    results: list[FeatureRow]
    errors: list[EntityError] = Field(
        default_factory=list,
        description="present only when some entity's stored data could not be read: one "
        "item per entity and group answered with status 'error'; the rest of the batch is "
        "answered as usual",
    )


class WriteFeaturesResponse(BaseModel):
    entities: int = Field(description="entities written")
    values_written: int
    values_removed: int
    skipped: int = Field(
        description="rows not written: Redis holds a newer event time for their entity's group"
    )
    skipped_ids: list[int | str] = Field(description="the ids of those rows")


class AggregateInfo(BaseModel):
    function: str = Field(examples=["count", "sum", "mean", "min", "max", "last_n"])
    of: str | None = Field(description="the record field read; null: count counts events")
    window_seconds: int
    n: int | None = Field(default=None, description="last_n only: how many values")


class FeatureInfo(BaseModel):
    name: str
    type: str
    dim: int | None
    description: str
    aggregate: AggregateInfo | None = Field(
        default=None, description="a window aggregation's feature: what it computes"
    )


class EntityTypeInfo(BaseModel):
    name: str
    prefix: str
    id_type: str
    ttl_seconds: int
    description: str


class AggregationInfo(BaseModel):
    tile_seconds: int
    allowed_lateness_seconds: int


class FeatureGroupInfo(BaseModel):
    name: str
    entity_type: str
    max_age_seconds: int | None
    description: str
    features: list[FeatureInfo]
    aggregation: AggregationInfo | None = Field(
        default=None,
        description="present for a group of window aggregations (docs/aggregations.md)",
    )


class RegistryResponse(BaseModel):
    entities: list[EntityTypeInfo]
    groups: list[FeatureGroupInfo]


class FailedRow(BaseModel):
    id: int | str
    error: str


class ErrorDetail(BaseModel):
    code: str = Field(examples=["unknown_feature"])
    message: str
    rows_written: list[int | str] | None = Field(
        default=None, description="partial_write only: the ids whose rows were written"
    )
    rows_failed: list[FailedRow] | None = Field(
        default=None, description="partial_write only: the rows Redis refused, and why"
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail


class HealthResponse(BaseModel):
    status: str = Field(examples=["ok"])


class ReadyResponse(BaseModel):
    status: str = Field(
        description="ready; unavailable (Redis does not answer); starting (with --workers N, "
        "not every worker answers yet)"
    )
    redis: str = Field(description="ok or unreachable")
    circuit: str = Field(description="the circuit breaker: closed, open or half_open")
    workers: str | None = Field(
        default=None, description="with --workers N: the workers that answer, as 'n of N'"
    )


class ShadowSummary(BaseModel):
    fraction: float
    checks: int
    mismatches: int
    mismatch_rate: float | None


class CacheSummary(BaseModel):
    enabled: bool
    entries: int
    bytes: int
    front_entries: int = Field(
        description="of the entries, those the native fronts loaded and hold alone (no "
        "Python object): a miss or a refresh ahead they read themselves"
    )
    notices: int = Field(
        default=0,
        description="invalidation notices this worker has applied from the channel since it "
        "started (0 without a cache, which does not follow the channel)",
    )
    counters: dict[str, int] = Field(description="the cache counters of /metrics, this worker")
    shadow: ShadowSummary
    generations: dict[str, float] = Field(
        description="per group: the latest batch write announced (unix seconds)"
    )
    circuit: str


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    CacheSummary,
    GetFeaturesResponse,
    WriteFeaturesResponse,
    RegistryResponse,
    ErrorResponse,
    HealthResponse,
    ReadyResponse,
)

# --- request schemas of the served registry ---------------------------------------------
#
# The request bodies are described from the registry being served: which entity types,
# features and groups exist, each id type and each value type, and the request limits. A
# client generated from the document, or a fuzzer, then knows exactly what is accepted.

# a double below this (the midpoint of float32's largest and 2**128) rounds to a finite float32
_FLOAT32_BOUND = (2 - 2**-24) * 2.0**127
_NON_FINITE: JsonSchema = {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}
_INT64: JsonSchema = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}


def _id_schema(entity: EntityType) -> JsonSchema:
    if entity.id_type is IdType.INT:
        return dict(_INT64)
    # a character takes up to 4 bytes of UTF-8 in the key
    return {"type": "string", "minLength": 1, "maxLength": MAX_STRING_ID_BYTES // 4}


def _float(limit: float | None) -> JsonSchema:
    number: JsonSchema = {"type": "number"}
    if limit is not None:
        number |= {"exclusiveMinimum": -limit, "exclusiveMaximum": limit}
    return {"anyOf": [number, _NON_FINITE]}


def _value_schema(feature: Feature) -> JsonSchema:
    t = feature.type
    if t is FeatureType.FLOAT:
        value = _float(_FLOAT32_BOUND)
    elif t is FeatureType.DOUBLE:
        value = _float(None)
    elif t is FeatureType.INT:
        value = dict(_INT64)
    elif t is FeatureType.BOOL:
        value = {"type": "boolean"}
    elif t is FeatureType.STRING:
        value = {"type": "string"}
    elif t is FeatureType.INT_LIST:
        value = {"type": "array", "items": dict(_INT64)}
    else:  # embedding, float_list
        value = {"type": "array", "items": _float(_FLOAT32_BOUND)}
        if t is FeatureType.EMBEDDING:
            value |= {"minItems": feature.dim, "maxItems": feature.dim}
    return {"anyOf": [value, {"type": "null"}], "description": f"{t.value}; null removes it"}


def get_request_schema(registry: Registry, max_entities: int, max_features: int) -> JsonSchema:
    variants = []
    for entity in registry.entities.values():
        groups = [g for g in registry.groups.values() if g.entity.name == entity.name]
        names = [f.name for g in groups for f in g.features]
        names += [f"{g.name}:{f.name}" for g in groups for f in g.features]
        lists = {
            "features": {
                "type": "array",
                "maxItems": max_features,
                "items": {"type": "string", "enum": names},
                "description": "feature names, or 'group:feature'; with no groups either, "
                "every feature of the entity type",
            },
            "groups": {
                "type": "array",
                "maxItems": max_features,
                "items": {"type": "string", "enum": [g.name for g in groups]},
                "description": "feature groups: all of their features",
            },
        }
        variants.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["entity_type", "ids"],
                "properties": {
                    "entity_type": {"type": "string", "enum": [entity.name]},
                    "ids": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": max_entities,
                        "items": _id_schema(entity),
                    },
                    **lists,
                    "bypass_cache": {
                        "type": "boolean",
                        "description": "skip the L1 cache (admin keys only when auth is on)",
                    },
                },
            }
        )
    return {"oneOf": variants} if len(variants) > 1 else variants[0]


def event_time_schema() -> JsonSchema:
    """A row's event time as ``batch.event_time_seconds`` takes it: a number of seconds,
    milli-, micro- or nanoseconds since 1970 (told apart by size), an RFC 3339 string, or
    null. Its upper bound moves with the server's clock, so it is stated in words: a
    ``maximum`` fixed when the document is made would be wrong an instant later (values
    just past it accepted, or the bound too far)."""
    return {
        "anyOf": [
            {"type": "number", "minimum": 0},
            {"type": "string", "format": "date-time"},
            {"type": "null"},
        ],
        "description": "when the values were true: unix seconds (or ms, µs, ns since 1970, "
        "told apart by size) or RFC 3339 (null or left out: now). Refused with a 400: a time "
        f"before 1970, or more than {MAX_FUTURE_SECONDS} s after the server's clock (it would "
        "hide every later write of the entity until then). A row older than the entity's "
        "stored values of the group is not written and is named in skipped_ids",
    }


def write_request_schema(registry: Registry, max_entities: int) -> JsonSchema:
    variants = []
    for group in registry.groups.values():
        row = {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "values"],
            "properties": {
                "id": _id_schema(group.entity),
                "values": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {f.name: _value_schema(f) for f in group.features},
                    "description": "feature -> value; null removes it, a feature left out "
                    "is not touched",
                },
                "event_time": event_time_schema(),
            },
        }
        variants.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["group", "rows"],
                "properties": {
                    "group": {"type": "string", "enum": [group.name]},
                    "rows": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": max_entities,
                        "items": row,
                    },
                },
            }
        )
    return {"oneOf": variants} if len(variants) > 1 else variants[0]
