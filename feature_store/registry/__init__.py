"""The registry: entity types and feature groups, loaded from one YAML file.

Loading validates everything and every error names the file and the offending entry
(``parse``); the model is what loading makes (``model``); a lock file beside the registry
records what has been deployed, and a feature's type is not changed in place (``lock``).
"""

from feature_store.layout import IdType
from feature_store.registry.lock import (
    check_against_lock,
    default_lock_path,
    lock_conflicts,
    write_lock,
)
from feature_store.registry.model import (
    DEFAULT_LATENESS,
    DEFAULT_TILE,
    FEATURE_NAME_PATTERN,
    MAX_DURATION,
    MAX_LAST_N,
    MAX_TILES,
    NAME_PATTERN,
    UNKNOWN_NAMED,
    Aggregate,
    Aggregation,
    EntityType,
    Feature,
    FeatureGroup,
    Function,
    Registry,
)
from feature_store.registry.parse import (
    load_registry,
    parse_duration,
    parse_registry,
    parse_type,
)

__all__ = [
    "DEFAULT_LATENESS",
    "DEFAULT_TILE",
    "FEATURE_NAME_PATTERN",
    "MAX_DURATION",
    "MAX_LAST_N",
    "MAX_TILES",
    "NAME_PATTERN",
    "UNKNOWN_NAMED",
    "Aggregate",
    "Aggregation",
    "EntityType",
    "Feature",
    "FeatureGroup",
    "Function",
    "IdType",
    "Registry",
    "check_against_lock",
    "default_lock_path",
    "load_registry",
    "lock_conflicts",
    "parse_duration",
    "parse_registry",
    "parse_type",
    "write_lock",
]
