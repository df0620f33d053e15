"""The serving API's clients, importable here as before: they live in ``feature_store.client``
(beside the server package, not inside it: a model server needs none of the server)."""

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
    TlsConfig,
)

__all__ = [
    "AsyncFeatureClient",
    "AsyncGrpcFeatureClient",
    "FeatureClient",
    "FeatureResult",
    "FeatureRow",
    "GrpcFeatureClient",
    "ServingAuthError",
    "ServingRequestError",
    "ServingUnavailableError",
    "TlsConfig",
]
