"""What REST and gRPC share: request validation, cached lookups, push writes, the registry.

The transports only parse their wire format into these calls and format the answer; the
semantics (limits, statuses, ages, invalidation) live here once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from feature_store.batch import EntityId, WriteStats, plan_write
from feature_store.connection import translated_errors
from feature_store.errors import (
    EncodingError,
    RequestError,
    StoreError,
    StoreUnavailableError,
)
from feature_store.layout import entity_key
from feature_store.registry import EntityType, Feature, FeatureGroup, Registry
from feature_store.serialization import Value
from feature_store.serving.auth import AuthError
from feature_store.serving.config import ServingSettings
from feature_store.serving.loader import CachedReader, Resolved

log = logging.getLogger(__name__)

PRESENT, MISSING, STALE = "present", "missing", "stale"
_PROJECTIONS_MAX = 4096


class BatchTooLargeError(RequestError):
    """More entities or features than the configured limit (HTTP 413)."""


class EmptyBatchError(RequestError):
    """A request with no entity ids."""


class InvalidIdError(RequestError):
    """An entity id of the wrong type for its entity type."""


class UnknownFeatureError(RequestError):
    """An unknown group or feature."""


class UnknownEntityTypeError(UnknownFeatureError):
    """An unknown entity type."""


class MalformedRequestError(RequestError):
    """A body that is not the JSON (or protobuf) the API expects."""


@dataclass(frozen=True, slots=True)
class Problem:
    """How an error is answered: HTTP status, a short code, and the message."""

    status: int
    code: str
    message: str


_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (AuthError, 401, "unauthorized"),
    (BatchTooLargeError, 413, "batch_too_large"),
    (EmptyBatchError, 400, "empty_batch"),
    (InvalidIdError, 400, "invalid_id"),
    (UnknownEntityTypeError, 400, "unknown_entity_type"),
    (UnknownFeatureError, 400, "unknown_feature"),
    (MalformedRequestError, 400, "malformed_body"),
    (RequestError, 400, "bad_request"),
    (StoreUnavailableError, 503, "redis_unavailable"),
    (StoreError, 503, "redis_error"),
)


def problem(error: BaseException, *, writing: bool = False) -> Problem:
    """The answer to an error. EncodingError is the caller's on a write, the store's on a read."""
    if isinstance(error, AuthError):
        return Problem(
            error.status, "unauthorized" if error.status == 401 else "forbidden", str(error)
        )
    if isinstance(error, EncodingError):
        if writing:
            return Problem(400, "invalid_value", str(error))
        return Problem(500, "undecodable_value", f"a stored value does not decode: {error}")
    for cls, status, code in _CODES:
        if isinstance(error, cls):
            return Problem(status, code, str(error))
    return Problem(500, "internal", "internal error")


@dataclass(frozen=True, slots=True)
class Projection:
    """A resolved feature list: which groups to load and where each feature sits in them."""

    entity: EntityType
    features: tuple[Feature, ...]
    names: tuple[str, ...]
    groups: tuple[FeatureGroup, ...]
    picks: tuple[tuple[int, int], ...]  # per feature: (index in groups, index in group)
    whole_group: bool  # one group, all of its features in its order: values used as they are
    # what a transport derives from the projection once (e.g. gRPC's encoded header)
    memo: dict[str, object] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class Lookup:
    projection: Projection
    ids: Sequence[EntityId]
    entries: list[list[Resolved]]  # per id, per projection group
    now: int  # unix seconds the ages are computed at


class Publisher:
    """Tells other serving instances which entries a push write changed (a Protocol seam)."""

    async def publish(self, group: str, keys: Sequence[bytes]) -> None:
        return None


class FeatureService:
    def __init__(
        self,
        registry: Registry,
        reader: CachedReader,
        writer: Writer,
        settings: ServingSettings,
        publisher: Publisher | None = None,
    ) -> None:
        self.registry = registry
        self.reader = reader
        self.writer = writer
        self.settings = settings
        self.publisher = publisher or Publisher()
        self._projections: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Projection] = {}

    # --- reads ---------------------------------------------------------------------------

    def projection(self, entity: str, features: Sequence[str], groups: Sequence[str]) -> Projection:
        cache_key = (entity, tuple(features), tuple(groups))
        found = self._projections.get(cache_key)
        if found is not None:
            return found
        if entity not in self.registry.entities:
            known = ", ".join(sorted(self.registry.entities))
            raise UnknownEntityTypeError(f"unknown entity type {entity!r}; known: {known}")
        try:
            resolved = self.registry.resolve(entity, features, groups)
        except RequestError as e:
            if not features and not groups:
                raise RequestError("the request names no features and no groups") from None
            raise UnknownFeatureError(str(e)) from None
        if len(resolved) > self.settings.max_features:
            raise BatchTooLargeError(
                f"{len(resolved)} features is more than the limit of {self.settings.max_features}"
            )
        group_index: dict[str, int] = {}
        groups_out: list[FeatureGroup] = []
        picks = []
        for f in resolved:
            gi = group_index.get(f.group)
            if gi is None:
                gi = group_index[f.group] = len(groups_out)
                groups_out.append(self.registry.groups[f.group])
            picks.append((gi, groups_out[gi].features.index(f)))
        whole = len(groups_out) == 1 and resolved == groups_out[0].features
        proj = Projection(
            self.registry.entities[entity],
            resolved,
            tuple(f.name for f in resolved),
            tuple(groups_out),
            tuple(picks),
            whole,
        )
        if len(self._projections) >= _PROJECTIONS_MAX:
            self._projections.clear()  # unbounded variety of requests: start over
        self._projections[cache_key] = proj
        return proj

    def check_ids(self, entity: EntityType, ids: Sequence[object]) -> list[bytes]:
        if not ids:
            raise EmptyBatchError("the request names no entity ids")
        if len(ids) > self.settings.max_entities:
            raise BatchTooLargeError(
                f"{len(ids)} entity ids is more than the limit of {self.settings.max_entities}"
            )
        prefix, id_type = entity.prefix, entity.id_type
        try:
            return [entity_key(prefix, id_type, i) for i in ids]
        except RequestError as e:
            raise InvalidIdError(
                f"entity type {entity.name!r} has {id_type.value} ids: {e}"
            ) from None

    async def lookup(
        self,
        entity: str,
        ids: Sequence[EntityId],
        features: Sequence[str] = (),
        groups: Sequence[str] = (),
        *,
        bypass: bool = False,
    ) -> Lookup:
        proj = self.projection(entity, features, groups)
        keys = self.check_ids(proj.entity, ids)
        names = [g.name for g in proj.groups]
        if len(names) == 1:
            name = names[0]
            resolved = await self.reader.get([(name, k) for k in keys], bypass=bypass)
            entries = [[r] for r in resolved]
        else:
            flat = await self.reader.get([(g, k) for k in keys for g in names], bypass=bypass)
            n = len(names)
            entries = [flat[i : i + n] for i in range(0, len(flat), n)]
        return Lookup(proj, ids, entries, int(time.time()))

    # --- writes --------------------------------------------------------------------------

    async def write(
        self, group: str, rows: Sequence[tuple[EntityId, Mapping[str, object]]]
    ) -> WriteStats:
        if group not in self.registry.groups:
            known = ", ".join(sorted(self.registry.groups))
            raise UnknownFeatureError(f"unknown feature group {group!r}; known: {known}")
        g = self.registry.groups[group]
        if not rows:
            raise EmptyBatchError("the write has no rows")
        if len(rows) > self.settings.max_entities:
            raise BatchTooLargeError(
                f"{len(rows)} rows is more than the limit of {self.settings.max_entities}"
            )
        keys = self.check_ids(g.entity, [r[0] for r in rows])
        plan = plan_write(g, rows)  # validates and encodes everything before any I/O
        await self.writer.run(plan.commands)
        self.reader.invalidate((group, k) for k in keys)
        try:
            await self.publisher.publish(group, keys)
        except Exception:
            # the write itself succeeded; other instances catch up within their cache TTL
            log.warning("could not publish the invalidation of %d keys", len(keys), exc_info=True)
        return plan.stats

    # --- registry ------------------------------------------------------------------------

    def describe_registry(self) -> dict[str, list[dict[str, object]]]:
        reg = self.registry
        return {
            "entities": [
                {
                    "name": e.name,
                    "prefix": e.prefix,
                    "id_type": e.id_type.value,
                    "ttl_seconds": e.ttl_seconds,
                    "description": e.description,
                }
                for e in reg.entities.values()
            ],
            "groups": [
                {
                    "name": g.name,
                    "entity_type": g.entity.name,
                    "max_age_seconds": g.max_age_seconds,
                    "description": g.description,
                    "features": [
                        {
                            "name": f.name,
                            "type": f.type.value,
                            "dim": f.dim,
                            "description": f.description,
                        }
                        for f in g.features
                    ],
                }
                for g in reg.groups.values()
            ],
        }


class Writer:
    """Runs write commands through the store client's connection pool, errors translated."""

    def __init__(self, client: object) -> None:
        self.client = client

    async def run(self, commands: list[tuple[bytes | str | int, ...]]) -> list[object]:
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)  # type: ignore[attr-defined]
            for cmd in commands:
                pipe.execute_command(*cmd)
            result: list[object] = await pipe.execute()
            return result


def row_statuses(
    proj: Projection, resolved: Sequence[Resolved], now: int
) -> tuple[list[Value | None], list[str], dict[str, int | None]]:
    """Values, statuses and group ages of one entity, honest about missing and stale."""
    group_values: list[tuple[Value | None, ...] | None] = []
    group_stale: list[bool] = []
    ages: dict[str, int | None] = {}
    for group, (entry, served_stale) in zip(proj.groups, resolved, strict=True):
        age = None if entry.written_at is None else max(0, now - entry.written_at)
        ages[group.name] = age
        max_age = group.max_age_seconds
        group_stale.append(
            served_stale or (age is not None and max_age is not None and age > max_age)
        )
        group_values.append(entry.values)
    if proj.whole_group:
        vals = group_values[0]
        values: list[Value | None] = [None] * len(proj.features) if vals is None else list(vals)
        mark = STALE if group_stale[0] else PRESENT
        statuses = [MISSING if v is None else mark for v in values]
        return values, statuses, ages
    values = []
    statuses = []
    for gi, fi in proj.picks:
        vals = group_values[gi]
        v = None if vals is None else vals[fi]
        values.append(v)
        statuses.append(MISSING if v is None else STALE if group_stale[gi] else PRESENT)
    return values, statuses, ages
