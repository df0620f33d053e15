"""Feast's feature-server HTTP API, answered from this store's registry, L1 and Redis.

Teams on Feast point its SDK (``online_store: type: remote``) or their HTTP clients at
this server and keep their requests. The lookups go through the same validation, L1 and
pipelined reads as ``/v1/features/get``; only the wire shapes are Feast's: entities as
``{join_key: [values]}``, features as ``"view:feature"`` references, and a column-shaped
answer (one ``values / statuses / event_timestamps`` per column, join keys first).

    Feast                   here
    feature view            feature group
    entity (join key)       entity type (its ``join_key`` in the registry)
    feature service         ``feature_services`` in the registry
    push source             a group's ``push_source`` (else the group's own name)

    PRESENT                 present
    OUTSIDE_MAX_AGE         stale (older than the group's max_age: the value is given)
    NOT_FOUND               missing: the entity holds nothing of the feature's group
    NULL_VALUE              missing: the entity holds the group, not this feature
    INVALID                 error: the entity's stored data of the group cannot be read

Errors are answered as Feast's server answers them: a JSON string holding
``{"module", "class", "message"}``, which Feast's SDK raises as that Feast exception.
docs/feast.md has the contract and where it differs from Feast's own server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import orjson

from feature_store.batch import EntityId, WriteRow, WriteStats
from feature_store.errors import FeatureStoreError, RequestError
from feature_store.native import FEAST as FEAST_CODE
from feature_store.registry import EntityType, FeatureGroup, Registry
from feature_store.serialization.json_floats import from_json_value, json_int
from feature_store.serving.api.json_answer import (
    Answer,
    Handler,
    Route,
    error_headers,
    parse_object,
)
from feature_store.serving.auth import Authenticator, Role
from feature_store.serving.feature_log import REQUEST_ID
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import (
    BatchTooLargeError,
    Learn,
    Lookup,
    MalformedRequestError,
    Problem,
    is_stale,
    problem,
)

log = logging.getLogger(__name__)
API = "feast"
EPOCH = b'"1970-01-01T00:00:00Z"'  # Feast's event timestamp of a value it does not have
# Feast's statuses of a row (NULL_VALUE, of one value a row lacks: GroupFormat.feast_columns)
PRESENT = b'"PRESENT"'
NOT_FOUND = b'"NOT_FOUND"'
INVALID = b'"INVALID"'
OUTSIDE_MAX_AGE = b'"OUTSIDE_MAX_AGE"'
# columns of a pushed frame that are not features: Feast's event and creation times
TIME_COLUMNS = frozenset({"event_timestamp", "created", "created_timestamp"})


class FeastNotFoundError(RequestError):
    """A feature view, feature service, push source or join key that the registry lacks;
    answered 404 (422 for a push source) with the Feast exception named ``feast_class``."""

    def __init__(self, message: str, feast_class: str, status: int = 404) -> None:
        super().__init__(message)
        self.feast_class = feast_class
        self.status = status


def feast_error(p: Problem, retry_after: float | None = None) -> Answer:
    """An error as Feast's server gives it: the status, and a JSON string that Feast's SDK
    turns back into the exception (``FeastError.from_error_detail``)."""
    return _feast_error(p.status, _FEAST_CLASSES.get(p.code, "FeastError"), p.message, retry_after)


_FEAST_CLASSES = {"unauthorized": "FeastPermissionError", "forbidden": "FeastPermissionError"}


def _feast_error(
    status: int, feast_class: str, message: str, retry_after: float | None = None
) -> Answer:
    detail = orjson.dumps({"module": "feast.errors", "class": feast_class, "message": message})
    return Answer(status, orjson.dumps(detail.decode()), error_headers(status, retry_after))


# --- requests ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """The lookups of one entity type: its join key and feature refs."""

    entity: EntityType
    refs: tuple[str, ...]  # "group:feature", each once, in the order the request names them


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # as answered: "feature", or "view__feature" with full_feature_names
    read: int  # index into FeastShape.reads
    index: int  # the feature's index in that read's refs (its projection)


@dataclass(frozen=True, slots=True)
class FeastShape:
    """What a request's names resolve to; the same for every request that names the same
    features, so it is resolved once (``Shapes``)."""

    reads: tuple[Read, ...]
    columns: tuple[Column, ...]
    with_views: bool  # include_feature_view_version_metadata
    # the answer's plan, made by the first answer of this shape (``answer_plan``)
    plan: list[AnswerPlan] = field(default_factory=list, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class FeastRead:
    shape: FeastShape
    ids: list[list[EntityId]]  # per read: the join key's column


def parse_read(body: Mapping[str, object], shapes: Shapes) -> FeastRead:
    """A ``/get-online-features`` body (Feast's ``GetOnlineFeaturesRequest``). Fields Feast's
    server does not know are ignored, as its server ignores them."""
    entities = body.get("entities")
    if not isinstance(entities, dict) or not entities:
        raise MalformedRequestError(
            "'entities' is required: an object of join key -> array of entity ids"
        )
    _check_columns(
        entities, "entities", "entity", "an array of entity ids",
        "; each row needs a value in every column",
    )  # fmt: skip
    shape = shapes.get(body)
    ids = []
    for read in shape.reads:
        column = entities.get(read.entity.join_key)
        if column is None:
            raise FeastNotFoundError(
                f"the request has no entity column {read.entity.join_key!r}, the join key of "
                f"feature view {read.refs[0].partition(':')[0]} (entity {read.entity.name})",
                "RequestDataNotFoundInEntityRowsException",
                400,
            )
        ids.append([cast(EntityId, json_int(i)) for i in column])
    return FeastRead(shape, ids)


def _check_columns(
    columns: Mapping[str, object], where: str, kind: str, array: str, hint: str = ""
) -> None:
    """Column-shaped data (Feast's entities and frames): arrays, all of one length."""
    length = None
    for name, values in columns.items():
        if not isinstance(values, list):
            raise MalformedRequestError(f"{where}.{name} must be {array}")
        if length is not None and len(values) != length:
            raise MalformedRequestError(
                f"the {kind} columns differ in length ({length} and {len(values)} in "
                f"{where}.{name}){hint}"
            )
        length = len(values)


class Shapes:
    """Resolved request shapes by the names that give them. Bounded: the names come from
    clients, so an unbounded variety starts the memo over (as service projections do)."""

    MAX = 1024
    MAX_REFS = 1_000_000  # strings held, summed over the shapes

    def __init__(self, registry: Registry, max_features: int) -> None:
        self.registry = registry
        self.max_features = max_features
        self._shapes: dict[tuple[object, ...], FeastShape] = {}
        self._refs = 0

    def get(self, body: Mapping[str, object]) -> FeastShape:
        full = _flag(body, "full_feature_names")
        with_views = _flag(body, "include_feature_view_version_metadata")
        features = body.get("features", [])
        key = (
            tuple(features) if isinstance(features, list) else features,
            body.get("feature_service"),
            full,
            with_views,
        )
        try:
            found = self._shapes.get(key)
        except TypeError:  # a list or object among the names: resolving refuses it
            return self.resolve(body, full, with_views)
        if found is not None:
            return found
        shape = self.resolve(body, full, with_views)
        size = len(shape.columns)
        if len(self._shapes) >= self.MAX or self._refs + size > self.MAX_REFS:
            self._shapes.clear()
            self._refs = 0
        self._shapes[key] = shape
        self._refs += size
        return shape

    def resolve(self, body: Mapping[str, object], full: bool, with_views: bool) -> FeastShape:
        registry = self.registry
        refs = _feature_refs(body, registry)
        if len(refs) > self.max_features:
            raise BatchTooLargeError(
                f"{len(refs)} features is more than the limit of {self.max_features}"
            )
        reads: dict[str, tuple[EntityType, list[str]]] = {}
        columns: list[Column] = []
        names: dict[str, str] = {}  # answered name -> the ref it came from
        for ref in refs:
            view, _, feature = ref.partition(":")
            group = registry.groups.get(view)
            if group is None:
                raise FeastNotFoundError(
                    f"Feature view {view} does not exist", "FeatureViewNotFoundException"
                )
            if all(f.name != feature for f in group.features):
                raise FeastNotFoundError(
                    f"Feature view {view} has no feature {feature}; it has "
                    f"{', '.join(f.name for f in group.features[:10])}"
                    + (" ..." if len(group.features) > 10 else ""),
                    "FeatureViewNotFoundException",
                )
            name = f"{view}__{feature}" if full else feature
            if name in names:
                if names[name] == ref:
                    continue  # a repeated reference: answered once
                raise MalformedRequestError(
                    f"feature name {name!r} is in {names[name]!r} and {ref!r}; "
                    "set full_feature_names to tell them apart"
                )
            names[name] = ref
            entity = group.entity
            if entity.name not in reads:
                reads[entity.name] = (entity, [])
            read_refs = reads[entity.name][1]
            columns.append(Column(name, list(reads).index(entity.name), len(read_refs)))
            read_refs.append(ref)
        return FeastShape(
            tuple(Read(entity, tuple(r)) for entity, r in reads.values()),
            tuple(columns),
            with_views,
        )


def _flag(body: Mapping[str, object], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise MalformedRequestError(f"'{name}' must be true or false")
    return value


def _feature_refs(body: Mapping[str, object], registry: Registry) -> list[str]:
    service = body.get("feature_service")
    if service is not None:
        if not isinstance(service, str):
            raise MalformedRequestError("'feature_service' must be a string")
        found = registry.services.get(service)
        if found is None:
            raise FeastNotFoundError(
                f"Feature service {service} does not exist", "FeatureServiceNotFoundException"
            )
        refs = []
        for ref in found:
            if ":" in ref:
                refs.append(ref)
            else:  # a whole group
                refs += [f"{ref}:{f.name}" for f in registry.groups[ref].features]
        return refs
    features = body.get("features", [])
    if not isinstance(features, list) or not features:
        raise MalformedRequestError(
            "name the features: 'features' as an array of \"view:feature\", or 'feature_service'"
        )
    for ref in features:
        if not isinstance(ref, str) or ref.count(":") != 1:
            raise MalformedRequestError(
                f'feature reference {ref!r} is not of the form "view:feature"'
            )
    return cast(list[str], features)


# --- answers -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _timestamp(seconds: int) -> bytes:
    return b'"%b"' % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)).encode()


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """How the answers of one shape are put together: the same for each of its requests."""

    head: bytes  # '{"metadata":{..},"results":[': the names do not change
    groups: tuple[tuple[int, int, list[int]], ...]  # (read, group, its features' indices)
    order: tuple[int, ...]  # per column: its place among the groups' columns, in turn


def answer_plan(shape: FeastShape, lookups: Sequence[Lookup]) -> AnswerPlan:
    """The plan of ``shape``'s answers, made by its first: the names' metadata, and which
    group writes each column. The lookups' projections come from the shape's names and
    the registry, which a process keeps, so every request of a shape has the same plan."""
    if shape.plan:
        return shape.plan[0]
    # per (read, group): the features it answers, in the order of the request's columns
    picks: dict[tuple[int, int], list[int]] = {}
    for column in shape.columns:
        gi, fi = lookups[column.read].projection.picks[column.index]
        picks.setdefault((column.read, gi), []).append(fi)
    start, taken = {}, 0
    for key, fis in picks.items():
        start[key], taken = taken, taken + len(fis)
    order = []
    for column in shape.columns:
        gi, _ = lookups[column.read].projection.picks[column.index]
        order.append(start[column.read, gi])
        start[column.read, gi] += 1
    names = [read.entity.join_key for read in shape.reads] + [c.name for c in shape.columns]
    metadata: dict[str, object] = {"feature_names": names}
    if shape.with_views:
        views = dict.fromkeys(g.name for lookup in lookups for g in lookup.projection.groups)
        metadata["feature_view_metadata"] = [{"name": v} for v in views]
    plan = AnswerPlan(
        b'{"metadata":%b,"results":[' % orjson.dumps(metadata),
        tuple((ri, gi, fis) for (ri, gi), fis in picks.items()),
        tuple(order),
    )
    shape.plan[:] = [plan]
    return plan


def answer_json(request: FeastRead, lookups: Sequence[Lookup]) -> bytes:
    """Feast's column-shaped answer: the join key columns, then each feature's column.

    A column holds its values, their statuses and their event times. The statuses and
    times are those of its group's rows, the same for every feature of the group unless a
    row lacks that one value (NULL_VALUE). Each group's columns are written in one call
    (``GroupFormat.feast_columns``), and put in the order the request names them."""
    plan = answer_plan(request.shape, lookups)
    results: list[bytes] = []
    for ids in request.ids:
        n = len(ids)
        results.append(
            b'{"values":%b,"statuses":[%b],"event_timestamps":[%b]}'
            % (orjson.dumps(ids), b",".join([PRESENT] * n), b",".join([EPOCH] * n))
        )
    made: list[bytes] = []
    for ri, gi, fis in plan.groups:
        made += _group_columns(lookups[ri], gi, fis)
    results += [made[i] for i in plan.order]
    return b"%b%b]}" % (plan.head, b",".join(results))


def _group_columns(lookup: Lookup, gi: int, picks: list[int]) -> list[bytes]:
    """The columns of features ``picks`` of the lookup's group ``gi``: each row's status and
    event time from its entry, its values from the entry's packed values."""
    group = lookup.projection.groups[gi]
    max_age, now = group.max_age_seconds, lookup.now
    raws: list[bytes | None] = []
    statuses: list[bytes] = []
    stamps: list[bytes] = []
    for row in lookup.entries:
        entry, served_stale = row[gi]
        raws.append(entry.raw)
        if entry.raw is None:
            statuses.append(NOT_FOUND if entry.fault is None else INVALID)
            stamps.append(EPOCH)
            continue
        written = entry.written_at
        stale = is_stale(written, served_stale, max_age, now)
        statuses.append(OUTSIDE_MAX_AGE if stale else PRESENT)
        stamps.append(EPOCH if written is None else _timestamp(written))
    return lookup.entries[0][gi].entry.fmt.feast_columns(raws, statuses, stamps, picks)


# --- writes ------------------------------------------------------------------------------


def frame_rows(
    groups: Sequence[FeatureGroup], frame: object
) -> tuple[list[tuple[FeatureGroup, list[WriteRow]]], list[str]]:
    """Feast's ``df`` (column -> values) as push-write rows per group, and the columns no
    group takes (besides the join key and Feast's time columns), which are answered.
    ``event_timestamp`` is each row's event time; a time without a zone is UTC, as in
    Feast."""
    if not isinstance(frame, dict) or not frame:
        raise MalformedRequestError("'df' is required: an object of column -> array of values")
    _check_columns(frame, "df", "df", "an array")
    join_key = groups[0].entity.join_key
    ids = frame.get(join_key)
    if ids is None:
        raise MalformedRequestError(
            f"df has no column {join_key!r}, the join key of {groups[0].name!r}"
        )
    taken = {join_key, *TIME_COLUMNS}
    times = frame.get("event_timestamp")
    out: list[tuple[FeatureGroup, list[WriteRow]]] = []
    for group in groups:
        features = [f for f in group.features if f.name in frame]
        taken.update(f.name for f in features)
        rows: list[WriteRow] = []
        for i, entity_id in enumerate(ids):
            row = (
                cast(EntityId, json_int(entity_id)),
                {f.name: from_json_value(f.type, frame[f.name][i]) for f in features},
            )
            event_time = None if times is None else _utc(times[i])
            rows.append(row if event_time is None else (*row, event_time))
        out.append((group, rows))
    return out, sorted(set(frame) - taken)


def _utc(value: object) -> object:
    """A Feast event timestamp: text without a zone is UTC (pandas writes them so)."""
    if isinstance(value, str) and value and not _ZONE.search(value):
        return value + "+00:00"
    return value


_ZONE = re.compile(r"(Z|[+-]\d\d:?\d\d)$")


# --- the routes --------------------------------------------------------------------------

LOOKUP = "/get-online-features"


@dataclass
class FeastFront:
    """What the native REST front needs of Feast's lookups (rest_front.py): ``learn``, told
    of each form the handler answered from one group (``hits.FrontLookups.learner``; set
    where the front answers them), and ``fail``, the handler's error answer, for a lookup
    whose planned read failed (set by ``feast_routes``)."""

    learn: Learn | None = None
    fail: Callable[[BaseException, str, float], Answer] | None = None


def feast_form(body: Mapping[str, object]) -> tuple[list[str], list[str]]:
    """A lookup's form as the native front keys it (``Asked::feast`` in native/src/hits/asked.rs):
    its feature references as sent, or its feature service; and its flags, as ``groups``."""
    service = body.get("feature_service")
    flags = ["feature_service"] if service is not None else []
    features = [cast(str, service)] if service is not None else cast(list[str], body["features"])
    for flag in ("full_feature_names", "include_feature_view_version_metadata"):
        if body.get(flag, False):
            flags.append(flag)
    return list(features), flags


def feast_routes(
    runtime: ServingRuntime, auth: Authenticator, front: FeastFront | None = None
) -> dict[str, Route]:
    """The POST routes of Feast's API, by path, for the app's fast path (Feast's errors);
    ``front`` is told what the native REST front needs of them."""
    front = FeastFront() if front is None else front
    service = runtime.service
    registry = runtime.registry
    metrics = runtime.metrics
    observe = metrics.requests.labels
    entities_served = metrics.entities.labels(API)
    limit = runtime.settings.max_body_bytes
    shapes = Shapes(registry, runtime.settings.max_features)

    def fail(error: BaseException, method: str, t0: float, *, writing: bool = False) -> Answer:
        if isinstance(error, FeastNotFoundError):
            answer = _feast_error(error.status, error.feast_class, str(error))
        else:
            if not isinstance(error, FeatureStoreError):
                log.exception("unexpected error in feast %s", method)
            p = problem(error, writing=writing)
            retry = runtime.reader.breaker.retry_after if p.status == 503 else None
            answer = feast_error(p, retry)
        observe(API, method, str(answer.status)).observe(time.perf_counter() - t0)
        return answer

    front.fail = fail

    served = runtime.served

    async def get_online_features(
        authorization: str | None, raw: bytes, request_id: str | None = None
    ) -> Answer:
        t0 = time.perf_counter()
        request_id = served.request_id(request_id)
        try:
            auth.require(authorization, Role.READ)
            body = parse_object(raw, limit)
            request = parse_read(body, shapes)
            reads = zip(request.shape.reads, request.ids, strict=True)
            # answered from the packed values: the entries keep no answer bytes
            asked = [service.lookup(r.entity.name, ids, r.refs, answers=False) for r, ids in reads]
            # one entity type (the usual request) needs no task of its own
            lookups = [await asked[0]] if len(asked) == 1 else await asyncio.gather(*asked)
        except Exception as e:
            answer = fail(e, "get", t0)
            return Answer(answer.status, answer.body, (*answer.headers, (REQUEST_ID, request_id)))
        for lookup in lookups:
            if lookup.errors:
                metrics.count_errors(API, lookup.errors)
            entities_served.inc(len(lookup.ids))
        content = answer_json(request, lookups)
        if front.learn is not None and len(lookups) == 1:
            _teach(front.learn, body, request, lookups[0])
        if served.logging:
            served.offer(FEAST_CODE, request_id, content, lookups)
        observe(API, "get", "200").observe(time.perf_counter() - t0)
        return Answer(200, content, ((REQUEST_ID, request_id),))

    async def write(groups: Sequence[FeatureGroup], frame: object) -> bytes:
        batches, ignored = frame_rows(groups, frame)
        total = WriteStats()
        skipped: list[EntityId] = []
        # every group's rows validated and encoded before the first is written
        prepared = [service.prepare(group.name, rows) for group, rows in batches]
        for write in prepared:
            written = await service.send(write)
            total += written.stats
            skipped += written.skipped
        return orjson.dumps(
            {
                "entities": total.entities,
                "values_written": total.values_written,
                "values_removed": total.values_removed,
                "skipped": total.skipped,
                "skipped_ids": skipped,
                "ignored_columns": ignored,
            }
        )

    def writing(
        method: str, targets: Callable[[Mapping[str, object]], Sequence[FeatureGroup]]
    ) -> Handler:
        """A write route: an admin key, the body, the groups it names, then push writes."""

        async def handle(
            authorization: str | None, raw: bytes, request_id: str | None = None
        ) -> Answer:
            t0 = time.perf_counter()
            try:
                auth.require(authorization, Role.ADMIN)
                body = parse_object(raw, limit)
                content = await write(targets(body), body.get("df"))
            except Exception as e:
                return fail(e, method, t0, writing=True)
            observe(API, method, "200").observe(time.perf_counter() - t0)
            return Answer(200, content)

        return handle

    return {
        "/get-online-features": Route(get_online_features, Role.READ, feast_error),
        "/push": Route(
            writing("push", lambda body: pushed_groups(body, registry)), Role.ADMIN, feast_error
        ),
        "/write-to-online-store": Route(
            writing("write", lambda body: written_group(body, registry)), Role.ADMIN, feast_error
        ),
    }


def _teach(learn: Learn, body: Mapping[str, object], request: FeastRead, lookup: Lookup) -> None:
    """Teach the native front a form answered from one entity type's groups' values, one
    entity column asked (the join key's), no entity's data broken: its answers are then
    written there, each group's columns from its entries, in the plan's order."""
    entities = cast(dict[str, object], body["entities"])
    if lookup.errors or len(entities) != 1:
        return
    features, flags = feast_form(body)
    join_key = request.shape.reads[0].entity.join_key
    plan = request.shape.plan[0]
    layout = ([(gi, fis) for _, gi, fis in plan.groups], plan.order)
    learn(join_key, features, flags, lookup.projection, plan.head, layout)


def pushed_groups(body: Mapping[str, object], registry: Registry) -> Sequence[FeatureGroup]:
    """The groups a ``/push`` body's push source feeds (online writes only)."""
    name = body.get("push_source_name")
    if not isinstance(name, str):
        raise MalformedRequestError("'push_source_name' is required: a string")
    to = body.get("to", "online")
    if to != "online":
        raise MalformedRequestError(
            f"'to' is {to!r}: this server is an online store and takes only "
            "to='online'; write the offline store with Feast itself"
        )
    groups = registry.pushed_groups(name)
    if not groups:
        raise FeastNotFoundError(
            f"Push source {name} does not exist", "PushSourceNotFoundException", 422
        )
    return groups


def written_group(body: Mapping[str, object], registry: Registry) -> Sequence[FeatureGroup]:
    """The group a ``/write-to-online-store`` body names."""
    view = body.get("feature_view_name")
    if not isinstance(view, str):
        raise MalformedRequestError("'feature_view_name' is required: a string")
    group = registry.groups.get(view)
    if group is None:
        raise FeastNotFoundError(
            f"Feature view {view} does not exist", "FeatureViewNotFoundException"
        )
    return [group]
