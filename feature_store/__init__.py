"""Online ML feature store on Redis.

One hash per entity, xxHash32 field names, compact value codecs, pipelined batch reads.
The public names are re-exported here; everything else is internal.
"""

from feature_store.batch import (
    BatchResult,
    EntityError,
    EntityId,
    FaultReason,
    FeatureVector,
    ReadPlan,
    Status,
    WriteStats,
)
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.errors import (
    ConfigError,
    EmbeddedRedisError,
    EncodingError,
    EntityDataError,
    FeatureStoreError,
    RegistryError,
    RegistryLockError,
    RequestError,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
)
from feature_store.layout import IdType
from feature_store.registry import (
    EntityType,
    Feature,
    FeatureGroup,
    Registry,
    load_registry,
    parse_registry,
    write_lock,
)
from feature_store.serialization import FeatureType, Value
from feature_store.settings import Settings, default_data_dir
from feature_store.store import AsyncFeatureStore, FeatureStore

__all__ = [
    "AsyncFeatureStore",
    "BatchResult",
    "ConfigError",
    "EmbeddedCluster",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "EncodingError",
    "EntityDataError",
    "EntityError",
    "EntityId",
    "EntityType",
    "FaultReason",
    "Feature",
    "FeatureGroup",
    "FeatureStore",
    "FeatureStoreError",
    "FeatureType",
    "FeatureVector",
    "IdType",
    "ReadPlan",
    "RedisTarget",
    "Registry",
    "RegistryError",
    "RegistryLockError",
    "RequestError",
    "Settings",
    "Status",
    "StoreError",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "Value",
    "WriteStats",
    "default_data_dir",
    "load_registry",
    "parse_registry",
    "write_lock",
]
