"""The typed remote store's path in earlier releases: ``type:
feature_store.feast_online.FeatureStoreOnlineStore`` still finds it here. New configurations
name ``feature_store.feast.remote.FeatureStoreOnlineStore``."""

from feature_store.feast.remote import FeatureStoreOnlineStore, FeatureStoreOnlineStoreConfig

__all__ = ["FeatureStoreOnlineStore", "FeatureStoreOnlineStoreConfig"]
