"""Serving: REST and gRPC batch lookups behind an in-process L1 cache.

Entry points: ``feature-store serve`` (``feature_store.serving.cli``), the app factory
``feature_store.serving.app.create_app`` and the clients in ``feature_store.serving.client``.
This module stays light (``feature-store --help`` imports the package): the web and gRPC
stacks load only in the modules that use them.
"""

from feature_store.serving.client import (
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
