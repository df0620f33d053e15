"""Serving: REST and gRPC batch lookups behind an in-process L1 cache.

Entry points: ``feature-store serve`` (``feature_store.serving.cli``), the worker's app
factory ``feature_store.serving.worker.create_app``; the clients, re-exported here, are in
``feature_store.client``.
This module stays light (``feature-store --help`` imports the package): the web and gRPC
stacks load only in the modules that use them.
"""

from feature_store.client import (
    AsyncFeatureClient,
    AsyncGrpcFeatureClient,
    FeatureClient,
    FeatureResult,
    FeatureRow,
    GrpcFeatureClient,
    ServingAuthError,
    ServingRequestError,
    ServingUnavailableError,
)
from feature_store.serving.config import ServingSettings

__all__ = [
    "AsyncFeatureClient",
    "AsyncGrpcFeatureClient",
    "FeatureClient",
    "FeatureResult",
    "FeatureRow",
    "GrpcFeatureClient",
    "ServingAuthError",
    "ServingRequestError",
    "ServingSettings",
    "ServingUnavailableError",
]
