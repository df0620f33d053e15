"""The registry's model: entity types, features, window aggregations and feature groups,
as loading made them (``registry.parse``), and the checks a lookup's names go through."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

import orjson

from feature_store.errors import RequestError
from feature_store.layout import (
    IdType,
)
from feature_store.serialization import Codec, FeatureType

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
FEATURE_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$")

UNKNOWN_NAMED = 10  # unknown names an error message lists; the rest are counted
MAX_DURATION = 100 * 365 * 86400  # seconds: TTLs and max ages
MAX_TILES = 50_000  # tiles in one window: a window of 7d in tiles of 15s
MAX_LAST_N = 1000
DEFAULT_TILE = 60  # seconds, or the largest divisor of 60 that divides every window
DEFAULT_LATENESS = 300  # seconds


@dataclass(frozen=True, slots=True)
class EntityType:
    name: str
    prefix: str
    id_type: IdType
    ttl_seconds: int
    description: str = ""
    # the column that names this entity type's ids in Feast-shaped requests (Feast's join
    # key); the entity type's name unless the registry says otherwise, as in Feast
    join_key: str = ""


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    group: str
    entity: str
    codec: Codec
    field: bytes
    description: str = ""

    @property
    def type(self) -> FeatureType:
        return self.codec.type

    @property
    def dim(self) -> int | None:
        return self.codec.dim


class Function(StrEnum):
    """What a window aggregation computes over the events in its window."""

    COUNT = "count"
    SUM = "sum"
    MEAN = "mean"
    MIN = "min"
    MAX = "max"
    LAST_N = "last_n"  # the n most recent values by event time, newest first


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One aggregated feature: ``function`` of the records' field ``of`` over the events
    of the last ``window_seconds`` (``of`` None: count counts events)."""

    function: Function
    of: str | None
    window_seconds: int
    n: int = 0  # last_n only


@dataclass(frozen=True, slots=True)
class Aggregation:
    """A group computed from events: its features are window aggregates (``aggregates``,
    in the order of the group's features), kept per tile of ``tile_seconds``; an event
    older than its entity's newest by more than ``lateness_seconds`` is not counted."""

    tile_seconds: int
    lateness_seconds: int
    aggregates: tuple[Aggregate, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        """The record fields the aggregates read, sorted."""
        return tuple(sorted({a.of for a in self.aggregates if a.of is not None}))

    @property
    def longest_seconds(self) -> int:
        return max(a.window_seconds for a in self.aggregates)


@dataclass(frozen=True, slots=True)
class FeatureGroup:
    name: str
    entity: EntityType
    features: tuple[Feature, ...]
    max_age_seconds: int | None
    freshness_field: bytes
    description: str = ""
    push_source: str = ""  # the name Feast's /push uses for this group ("": the group's name)
    # a group of window aggregations (docs/aggregations.md): written from events by the
    # stream and the backfill, read by combining tiles at the time of the request
    aggregation: Aggregation | None = None
    windows_field: bytes = b""  # the field of its tiles (aggregated groups only)

    def feature(self, name: str) -> Feature:
        for f in self.features:
            if f.name == name:
                return f
        raise RequestError(f"feature group {self.name!r} has no feature {name!r}")


@dataclass(frozen=True, slots=True)
class Registry:
    source: str
    entities: Mapping[str, EntityType]
    groups: Mapping[str, FeatureGroup]
    _by_entity: Mapping[str, Mapping[str, Feature]] = field(repr=False)
    # named lists of "group:feature" (or "group") references, Feast's feature services
    services: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def entity(self, name: str) -> EntityType:
        try:
            return self.entities[name]
        except KeyError:
            raise RequestError(
                f"unknown entity type {name!r}; known: {', '.join(sorted(self.entities))}"
            ) from None

    def group(self, name: str) -> FeatureGroup:
        try:
            return self.groups[name]
        except KeyError:
            raise RequestError(
                f"unknown feature group {name!r}; known: {', '.join(sorted(self.groups))}"
            ) from None

    def features_of(self, entity: str) -> Mapping[str, Feature]:
        """Every feature of an entity type, by name (names are unique per entity type)."""
        self.entity(entity)
        return self._by_entity[entity]

    def by_join_key(self, join_key: str) -> EntityType | None:
        for e in self.entities.values():
            if e.join_key == join_key:
                return e
        return None

    def pushed_groups(self, source: str) -> tuple[FeatureGroup, ...]:
        """The groups a Feast push source feeds: those that declare it, else the group of
        that name."""
        declared = tuple(g for g in self.groups.values() if g.push_source == source)
        if declared:
            return declared
        group = self.groups.get(source)
        return (group,) if group is not None else ()

    def resolve(
        self, entity: str, features: Iterable[str] = (), groups: Iterable[str] = ()
    ) -> tuple[Feature, ...]:
        """The features a request names, in order, without repeats.

        ``features`` are feature names, or ``group:feature``; ``groups`` add all of a group's
        features. Raises RequestError naming every unknown or foreign entry.
        """
        known = self.features_of(entity)
        out: dict[str, Feature] = {}
        unknown: list[str] = []
        for g in groups:
            group = self.groups.get(g)
            if group is None or group.entity.name != entity:
                unknown.append(f"group {g!r}")
                continue
            for f in group.features:
                out.setdefault(f.name, f)
        for ref in features:
            group_name, _, name = ref.rpartition(":")
            feature = known.get(name)
            if feature is None or (group_name and feature.group != group_name):
                unknown.append(f"feature {ref!r}")
                continue
            out.setdefault(feature.name, feature)
        if unknown:
            named = ", ".join(unknown[:UNKNOWN_NAMED])
            if len(unknown) > UNKNOWN_NAMED:
                named += f" and {len(unknown) - UNKNOWN_NAMED} more"
            raise RequestError(f"entity type {entity!r} has no {named}")
        if not out:
            raise RequestError("the request names no features")
        return tuple(out.values())

    def fingerprint(self) -> str:
        """A hash of what the lock file records; equal fingerprints mean compatible data."""
        return entries_fingerprint(lock_entries(self))


def lock_entries(registry: Registry) -> dict[str, dict[str, object]]:
    """What a lock file records of ``registry`` (``registry.lock``): per entity type its
    prefix, id type and each feature's type."""
    return {
        e.name: {
            "prefix": e.prefix,
            "id_type": e.id_type.value,
            "features": {
                f.name: f.codec.signature
                for f in sorted(registry.features_of(e.name).values(), key=lambda f: f.name)
            },
        }
        for e in sorted(registry.entities.values(), key=lambda e: e.name)
    }


def entries_fingerprint(entries: Mapping[str, object]) -> str:
    """A hash of ``lock_entries``: equal fingerprints mean compatible data."""
    return hashlib.sha256(orjson.dumps(entries, option=orjson.OPT_SORT_KEYS)).hexdigest()
