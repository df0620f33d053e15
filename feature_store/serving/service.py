"""What REST and gRPC share: request validation, cached lookups, push writes, the registry.

The transports only parse their wire format into these calls and format the answer; the
semantics (limits, statuses, ages, invalidation) live here once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from feature_store.batch import (
    EntityError,
    EntityId,
    WritePlan,
    WriteRow,
    WriteStats,
    plan_write,
)
from feature_store.errors import (
    EncodingError,
    NotDurableError,
    RequestError,
    StoreError,
    StorePermissionError,
    StoreUnavailableError,
)
from feature_store.layout import SKIPPED, entity_key
from feature_store.registry import EntityType, Feature, FeatureGroup, Registry
from feature_store.serving.auth import AuthError
from feature_store.serving.config import ServingSettings
from feature_store.serving.l1.invalidation import Publisher
from feature_store.serving.l1.loader import CachedReader, Resolved
from feature_store.serving.writer import Writer

log = logging.getLogger(__name__)

PRESENT, MISSING, STALE = "present", "missing", "stale"
# Resolved feature lists are cached by the request's names. Bounded in count and in bytes:
# the names come from clients, so a bound in entries alone lets large lists fill memory.
_PROJECTIONS_MAX = 4096
_PROJECTIONS_MAX_BYTES = 4 * 1024 * 1024
_NAME_COST = 64  # a str object and its tuple slot, besides its characters


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


class PartialWriteError(RequestError):
    """Some rows of a push write were refused by Redis (WRONGTYPE); the others were written."""

    def __init__(self, written: Sequence[EntityId], failed: Sequence[tuple[EntityId, str]]) -> None:
        shown = "; ".join(f"{i!r}: {e}" for i, e in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        super().__init__(
            f"{len(failed)} of {len(written) + len(failed)} rows were not written "
            f"({shown}{more}); the other rows were"
        )
        self.written = list(written)
        self.failed = list(failed)


@dataclass(frozen=True, slots=True)
class Problem:
    """How an error is answered: HTTP status, a short code, the message, and details."""

    status: int
    code: str
    message: str
    details: Mapping[str, object] | None = None


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
    """The answer to an error. EncodingError is the caller's on a write, the store's on a
    read (where one entity's unreadable data is answered per entity, status "error", and
    reaches here only from a path that cannot isolate it)."""
    if isinstance(error, AuthError):
        return Problem(
            error.status, "unauthorized" if error.status == 401 else "forbidden", str(error)
        )
    if isinstance(error, EncodingError):
        if writing:
            return Problem(400, "invalid_value", str(error))
        return Problem(500, "undecodable_value", f"a stored value does not decode: {error}")
    if isinstance(error, PartialWriteError):
        return Problem(
            409,
            "partial_write",
            str(error),
            {
                "rows_written": error.written,
                "rows_failed": [{"id": i, "error": e} for i, e in error.failed],
            },
        )
    if isinstance(error, StorePermissionError):  # configuration, not an outage: no retry
        return Problem(500, "redis_permission_denied", str(error))
    if isinstance(error, NotDurableError):
        return Problem(503, "not_durable", str(error))
    if isinstance(error, StoreError) and writing:
        return Problem(
            503,
            "redis_unavailable" if isinstance(error, StoreUnavailableError) else "redis_error",
            f"{error}; the write may have been applied in part or in whole: "
            "retry it (writes are idempotent)",
        )
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
    # entities whose stored data of a group cannot be read: answered with status "error"
    errors: list[EntityError]
    # the reader's clock when the lookup began: an entry loaded at or after it was read
    # from Redis for this lookup (-inf without the L1: every entry was)
    started: float = -math.inf


def lookup_errors(
    ids: Sequence[EntityId], groups: Sequence[FeatureGroup], entries: list[list[Resolved]]
) -> list[EntityError]:
    """The entity errors of a lookup's entries (fault entries), in id then group order."""
    errors = []
    for entity_id, row in zip(ids, entries, strict=True):
        for group, (entry, _) in zip(groups, row, strict=True):
            fault = entry.fault
            if fault is not None:
                errors.append(EntityError(entity_id, group.name, fault.reason, fault.message))
    return errors


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
        self._projection_bytes = 0
        self._rewrites: set[asyncio.Task[None]] = set()

    # --- reads ---------------------------------------------------------------------------

    def projection(self, entity: str, features: Sequence[str], groups: Sequence[str]) -> Projection:
        limit = self.settings.max_features
        if len(features) > limit or len(groups) > limit:
            raise BatchTooLargeError(
                f"{max(len(features), len(groups))} names is more than the limit of {limit}"
            )
        # repeats resolve to one feature: collapse them before the names become a cache key
        cache_key = (entity, tuple(dict.fromkeys(features)), tuple(dict.fromkeys(groups)))
        found = self._projections.get(cache_key)
        if found is not None:
            return found
        if entity not in self.registry.entities:
            known = ", ".join(sorted(self.registry.entities))
            raise UnknownEntityTypeError(f"unknown entity type {entity!r}; known: {known}")
        if not features and not groups:  # everything the entity type has
            groups = [g.name for g in self.registry.groups.values() if g.entity.name == entity]
        try:
            resolved = self.registry.resolve(entity, features, groups)
        except RequestError as e:
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
        self._remember(cache_key, proj)
        return proj

    def _remember(
        self, key: tuple[str, tuple[str, ...], tuple[str, ...]], proj: Projection
    ) -> None:
        size = sum(len(n) + _NAME_COST for n in (*key[1], *key[2])) + _NAME_COST * (
            len(proj.features) + 4
        )
        if size > _PROJECTIONS_MAX_BYTES // 64:
            return  # a rare, large list: resolving it again costs less than keeping it
        if (
            len(self._projections) >= _PROJECTIONS_MAX
            or self._projection_bytes + size > _PROJECTIONS_MAX_BYTES
        ):
            self._projections.clear()  # unbounded variety of requests: start over
            self._projection_bytes = 0
        self._projections[key] = proj
        self._projection_bytes += size

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
        proto: bool = False,
        answers: bool = True,
    ) -> Lookup:
        """The entries of ``ids``'s groups that hold ``features`` (or ``groups``). ``proto``:
        the answer is gRPC's, so the entries it loads carry gRPC records, not JSON. Those
        loaded for an answer made from the packed values (``answers`` False: Feast's API;
        or some of a group's features picked) carry neither (``CachedReader.get``)."""
        proj = self.projection(entity, features, groups)
        started = self.reader.clock() if self.reader.cache is not None else -math.inf
        bare = not answers or not proj.whole_group
        keys = self.check_ids(proj.entity, ids)
        names = [g.name for g in proj.groups]
        if len(names) == 1:
            name = names[0]
            flat = await self.reader.get(
                [(name, k) for k in keys], bypass=bypass, proto=proto, bare=bare
            )
            entries = [[r] for r in flat]
        else:
            flat = await self.reader.get(
                [(g, k) for k in keys for g in names], bypass=bypass, proto=proto, bare=bare
            )
            n = len(names)
            entries = [flat[i : i + n] for i in range(0, len(flat), n)]
        # a fault entry is rare: one pass finds there is none
        if any(r.entry.fault is not None for r in flat):
            errors = lookup_errors(ids, proj.groups, entries)
        else:
            errors = []
        return Lookup(proj, ids, entries, int(time.time()), errors, started)

    # --- writes --------------------------------------------------------------------------

    async def write(self, group: str, rows: Sequence[WriteRow]) -> Written:
        """Push-write rows of one group (see ``batch.plan_write``): each entity's values
        are written unless Redis holds a newer event time for that group; those rows are
        named in the answer. Caches here and elsewhere drop the keys."""
        return await self.send(self.prepare(group, rows))

    def prepare(self, group: str, rows: Sequence[WriteRow]) -> PreparedWrite:
        """Validate and encode a push write of one group, before any I/O: a write that
        feeds several groups prepares each first, so that a bad row writes nothing."""
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
        ids = [r[0] for r in rows]
        keys = self.check_ids(g.entity, ids)
        return PreparedWrite(group, ids, keys, plan_write(g, rows))

    async def send(self, prepared: PreparedWrite) -> Written:
        """Write what ``prepare`` made; caches here and elsewhere drop its keys."""
        group, ids, keys, plan = prepared.group, prepared.ids, prepared.keys, prepared.plan
        try:
            replies = await self.writer.run(plan.commands)
        except BaseException:
            # Redis may apply what it received after answering too late (a hang): drop the
            # entries now, and again, everywhere, once Redis answers, so that no instance
            # serves the old values as present until its TTL
            self.reader.invalidate((group, k) for k in keys)
            self._spawn(self._invalidate_when_back(group, keys))
            raise
        self.reader.invalidate((group, k) for k in keys)
        await self._publish(group, keys)
        failed = _failed_rows(keys, replies, ids)
        if failed:
            written = [i for k, i in zip(keys, ids, strict=True) if k not in failed]
            raise PartialWriteError(written, list(failed.values()))
        skipped = [i for i, reply in zip(ids, replies, strict=True) if reply == SKIPPED]
        return Written(plan.outcome(replies), skipped)

    async def _publish(self, group: str, keys: Sequence[bytes]) -> None:
        try:
            await self.publisher.publish(group, keys)
        except Exception:
            # the write itself is done; other instances catch up within their cache TTL
            log.warning("could not publish the invalidation of %d keys", len(keys), exc_info=True)

    async def _invalidate_when_back(self, group: str, keys: Sequence[bytes]) -> None:
        """After a failed write: invalidate everywhere once Redis answers a publish again."""
        deadline = time.monotonic() + max(self.settings.cache_ttl, 1.0)
        delay = 0.05
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                await self.publisher.publish(group, keys)
            except Exception:
                continue
            self.reader.invalidate((group, k) for k in keys)
            return
        log.warning("gave up re-invalidating %d keys after a failed write", len(keys))

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._rewrites.add(task)
        task.add_done_callback(self._rewrites.discard)

    async def close(self) -> None:
        for task in list(self._rewrites):
            task.cancel()
        await asyncio.gather(*self._rewrites, return_exceptions=True)

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
            "groups": [_describe_group(g) for g in reg.groups.values()],
        }


def _describe_group(g: FeatureGroup) -> dict[str, object]:
    """A group as ``GET /v1/registry`` describes it; a group of window aggregations with
    its tiles and lateness, and each feature with what it computes."""
    features: list[dict[str, object]] = [
        {"name": f.name, "type": f.type.value, "dim": f.dim, "description": f.description}
        for f in g.features
    ]
    out: dict[str, object] = {
        "name": g.name,
        "entity_type": g.entity.name,
        "max_age_seconds": g.max_age_seconds,
        "description": g.description,
        "features": features,
    }
    if g.aggregation is not None:
        out["aggregation"] = {
            "tile_seconds": g.aggregation.tile_seconds,
            "allowed_lateness_seconds": g.aggregation.lateness_seconds,
        }
        for info, a in zip(features, g.aggregation.aggregates, strict=True):
            info["aggregate"] = {
                "function": a.function.value,
                "of": a.of,
                "window_seconds": a.window_seconds,
                "n": a.n or None,
            }
    return out


def _failed_rows(
    keys: Sequence[bytes], replies: Sequence[object], ids: Sequence[EntityId]
) -> dict[bytes, tuple[EntityId, str]]:
    """The rows whose write Redis refused (their key holds another type), by key."""
    failed: dict[bytes, tuple[EntityId, str]] = {}
    for key, reply, entity_id in zip(keys, replies, ids, strict=True):
        if isinstance(reply, Exception):
            failed.setdefault(key, (entity_id, f"{key.decode(errors='replace')}: {reply}"))
    return failed


@dataclass(frozen=True, slots=True)
class PreparedWrite:
    """A push write of one group, validated and encoded (``FeatureService.prepare``)."""

    group: str
    ids: list[EntityId]
    keys: list[bytes]
    plan: WritePlan


@dataclass(frozen=True, slots=True)
class Written:
    """A push write's outcome: the totals, and the ids of the rows Redis holds newer data
    for (not written, counted in ``stats.skipped``)."""

    stats: WriteStats
    skipped: list[EntityId]

    def as_json(self) -> dict[str, object]:
        return {
            "entities": self.stats.entities,
            "values_written": self.stats.values_written,
            "values_removed": self.stats.values_removed,
            "skipped": self.stats.skipped,
            "skipped_ids": self.skipped,
        }


def group_states(
    proj: Projection, resolved: Sequence[Resolved], now: int
) -> tuple[list[bool], dict[str, int | None]]:
    """Per group of a row: whether its values are stale, and its age (None: unknown).

    Stale: served from an expired entry because Redis failed, or written longer ago than
    the group's ``max_age``."""
    stale: list[bool] = []
    ages: dict[str, int | None] = {}
    for group, (entry, served_stale) in zip(proj.groups, resolved, strict=True):
        written = entry.written_at
        ages[group.name] = None if written is None else max(0, now - written)
        stale.append(is_stale(written, served_stale, group.max_age_seconds, now))
    return stale, ages


def is_stale(written_at: int | None, served_stale: bool, max_age: int | None, now: int) -> bool:
    """Stale: served from an expired entry because Redis failed, or written more than the
    group's ``max_age`` seconds before ``now``."""
    return served_stale or (
        written_at is not None and max_age is not None and now - written_at > max_age
    )


# Feast's answer over several groups (``feast_api.AnswerPlan``): per group, its index in
# the projection and the indices of the features it answers, in the answer's order; then
# per column of the answer, its place among the groups' columns in turn
Layout: TypeAlias = tuple[Sequence[tuple[int, Sequence[int]]], Sequence[int]]


class Learn(Protocol):
    """What a handler calls with a form it answered from its lookup's entries: the entity
    type, the features, the groups, the projection, and the answer's head (and, Feast's
    over several groups, their ``layout``). Feast's: the join key, the feature references
    (or the feature service) and its flags (``feast_api.feast_form``)."""

    def __call__(
        self,
        entity: str,
        features: list[str],
        groups: list[str],
        proj: Projection,
        head: bytes,
        layout: Layout | None = None,
    ) -> None: ...
