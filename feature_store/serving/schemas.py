"""Pydantic models of the REST API, for its OpenAPI document only.

Requests are parsed with orjson and checked by hand (``feature_store.serving.app``): the
checks give the messages the API promises, and they cost a fraction of model validation
on the hot path. These models describe the same contract for /docs and client generators.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

# A float (also in an embedding or float list) that is NaN or infinite is the string "NaN",
# "Infinity" or "-Infinity", as in protobuf's JSON mapping: JSON has no number for it.
JsonValue = float | int | bool | str | list[float | str] | list[int] | None


class GetFeaturesRequest(BaseModel):
    entity_type: str = Field(examples=["consumer"])
    ids: list[int | str] = Field(
        description="entity ids, int or string as the entity type declares", examples=[[1, 2]]
    )
    features: list[str] = Field(
        default=[],
        description="feature names, or 'group:feature'",
        examples=[["float_00", "consumer_features:int_0"]],
    )
    groups: list[str] = Field(default=[], description="feature groups: all of their features")
    bypass_cache: bool = Field(default=False, description="skip the L1 cache (admin keys only)")


class FeatureRow(BaseModel):
    id: int | str
    values: list[JsonValue] = Field(description="aligned with 'features'; null when missing")
    statuses: list[str] = Field(description="present, missing or stale, per value")
    ages: dict[str, int | None] = Field(
        description="per group: seconds since its last write, null when unknown"
    )


class GetFeaturesResponse(BaseModel):
    entity_type: str
    features: list[str] = Field(description="the resolved feature names, in order")
    types: list[str] = Field(
        description="each feature's type (float, double, int, bool, string, embedding, "
        "float_list, int_list), aligned with 'features'"
    )
    results: list[FeatureRow]


class WriteRow(BaseModel):
    id: int | str
    values: dict[str, JsonValue] = Field(description="feature -> value; null removes it")


class WriteFeaturesRequest(BaseModel):
    group: str = Field(examples=["consumer_features"])
    rows: list[WriteRow]


class WriteFeaturesResponse(BaseModel):
    entities: int
    values_written: int
    values_removed: int


class FeatureInfo(BaseModel):
    name: str
    type: str
    dim: int | None
    description: str


class EntityTypeInfo(BaseModel):
    name: str
    prefix: str
    id_type: str
    ttl_seconds: int
    description: str


class FeatureGroupInfo(BaseModel):
    name: str
    entity_type: str
    max_age_seconds: int | None
    description: str
    features: list[FeatureInfo]


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


MODELS: tuple[type[BaseModel], ...] = (
    GetFeaturesRequest,
    GetFeaturesResponse,
    WriteFeaturesRequest,
    WriteFeaturesResponse,
    RegistryResponse,
    ErrorResponse,
)
