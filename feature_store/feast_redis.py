"""The plugin's path in earlier releases: a ``feature_store.yaml`` whose online store is
``type: feature_store.feast_redis.FeatureStoreRedisOnlineStore`` still finds it here (Feast
imports the store and its ``...Config`` by that path). New configurations name
``feature_store.feast.online_store.FeatureStoreRedisOnlineStore``."""

from feature_store.feast.online_store import (
    FeatureStoreRedisOnlineStore,
    FeatureStoreRedisOnlineStoreConfig,
)

__all__ = ["FeatureStoreRedisOnlineStore", "FeatureStoreRedisOnlineStoreConfig"]
