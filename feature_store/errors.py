"""The feature store's exceptions, one tree for every layer.

Third-party errors (redis-py, and later grpc and Spark) are translated where they enter
the project, so callers catch these and never a library's own types::

    FeatureStoreError
    ├── ConfigError                 a setting is unknown or invalid
    ├── RegistryError               features.yaml or its lock file is wrong (names the entry)
    │   └── RegistryLockError       a deployed feature changed type without a rename
    ├── EncodingError               a value cannot be encoded or decoded for its feature type
    │   └── EntityDataError         one entity's stored data cannot be read (``reason``)
    ├── RequestError                a read or write names unknown features, bad ids, ...
    └── StoreError                  Redis answered with an error
        ├── StorePermissionError    the Redis (ACL) user may not run a command
        ├── StoreUnavailableError   Redis cannot be reached (connection refused, reset, down)
        │   ├── StoreTimeoutError   Redis did not answer in time
        │   └── NotDurableError     a write was not confirmed by the replicas asked for
        └── EmbeddedRedisError      the embedded redis-server could not be started
"""

from __future__ import annotations


class FeatureStoreError(Exception):
    """Base of every error the feature store raises on purpose."""


class ConfigError(FeatureStoreError):
    """A setting is unknown or has an invalid value."""


class RegistryError(FeatureStoreError):
    """The registry file is malformed. The message names the file and the entry."""


class RegistryLockError(RegistryError):
    """The registry disagrees with what its lock file says has been deployed."""


class EncodingError(FeatureStoreError, ValueError):
    """A value does not fit its feature's type, or stored bytes do not decode."""


class EntityDataError(EncodingError):
    """One entity's stored data cannot be read. Reads answer that entity (and group) with
    status ``error`` and serve the rest of the batch; ``reason`` says how it is broken:

    - ``undecodable_value``: a stored value does not decode as its feature's type;
    - ``corrupt_write_time``: the group's freshness field is not a unix time;
    - ``wrong_type``: the entity's key holds another Redis type than a hash (WRONGTYPE).
    """

    def __init__(self, message: str, reason: str = "undecodable_value") -> None:
        super().__init__(message)
        self.reason = reason


class RequestError(FeatureStoreError, ValueError):
    """A read or write request is invalid (unknown feature, wrong id type, empty batch...)."""


class StoreError(FeatureStoreError):
    """Redis returned an error, or the store client was misused."""


class StorePermissionError(StoreError):
    """The Redis user may not run a command (ACL NOPERM). Retrying will not help."""


class StoreUnavailableError(StoreError):
    """Redis cannot be reached. Retrying later may succeed."""


class StoreTimeoutError(StoreUnavailableError):
    """Redis did not answer within the timeout."""


class NotDurableError(StoreUnavailableError):
    """A write was applied by a master, but fewer replicas than asked confirmed it in time
    (``feature_store.durability``): a failover may lose it. Sending it again is safe."""


class EmbeddedRedisError(StoreError):
    """The embedded redis-server could not be found, started or stopped."""
