"""The REST API's JSON handlers: batch get and push write, and the answers' bytes.

Bodies are parsed with orjson and checked by hand so that every bad request gets a 4xx whose
message names the problem, and answers are spliced together from the cached values' JSON:
no per-value model objects. The same two handlers serve every way a request arrives: the
native REST front, ``app.FastPath`` (uvicorn's ASGI path) and the documented FastAPI routes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import cast

import orjson

from feature_store.batch import EntityId, WriteRow
from feature_store.errors import FeatureStoreError
from feature_store.native import REST as REST_CODE
from feature_store.native import native_enabled
from feature_store.serialization.json_floats import from_json_value, json_int
from feature_store.serving.api.json_answer import Answer, error_answer, parse_object
from feature_store.serving.auth import Authenticator, AuthError, Role
from feature_store.serving.feature_log import REQUEST_ID
from feature_store.serving.l1.cache import Entry, entry_json, keeper
from feature_store.serving.runtime import ServingRuntime
from feature_store.serving.service import (
    Learn,
    Lookup,
    MalformedRequestError,
    group_states,
    problem,
)

_rest_rows = None
if native_enabled():
    from feature_store._native import rest_rows as _rest_rows  # type: ignore[assignment]

log = logging.getLogger(__name__)
API = "rest"
PICKS = "rest.picks"  # Projection.memo: the picked features' indices in their one group


def _field(body: Mapping[str, object], name: str, kind: type, default: object = None) -> object:
    """``body[name]`` of type ``kind``; ``default`` when absent (null is not absent)."""
    if name not in body and default is not None:
        return default
    value = body.get(name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise MalformedRequestError(
            f"'{name}' must be {'an array' if kind is list else 'a ' + kind.__name__}"
        )
    return value


def _strings(body: Mapping[str, object], name: str) -> list[str]:
    items = cast(list[object], _field(body, name, list, []))
    for item in items:
        if not isinstance(item, str):
            raise MalformedRequestError(f"'{name}' must be an array of strings, got {item!r}")
    return cast(list[str], items)


def _ids(body: Mapping[str, object]) -> list[EntityId]:
    if "ids" not in body:
        raise MalformedRequestError("'ids' is required: an array of entity ids")
    return [cast(EntityId, json_int(i)) for i in cast(list[object], _field(body, "ids", list))]


GET_FIELDS = frozenset({"entity_type", "ids", "features", "groups", "bypass_cache"})
WRITE_FIELDS = frozenset({"group", "rows"})
ROW_FIELDS = frozenset({"id", "values", "event_time"})


def _known(body: Mapping[str, object], known: frozenset[str], where: str) -> None:
    """A misspelt field ('feature') would otherwise be ignored silently."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise MalformedRequestError(
            f"unknown field(s) in {where}: {', '.join(map(repr, unknown[:5]))}; "
            f"known: {', '.join(sorted(known))}"
        )


class RestHandlers:
    """``POST /v1/features/get`` and ``POST /v1/features/write`` of one worker: auth, the
    body's checks, the lookup or write, the answer, metrics; errors as their 4xx/5xx."""

    def __init__(self, runtime: ServingRuntime, auth: Authenticator) -> None:
        self.runtime = runtime
        self.service = runtime.service
        self.registry = runtime.registry
        self.auth = auth
        self.body_limit = runtime.settings.max_body_bytes
        self.observe = runtime.metrics.requests.labels
        self.entities_served = runtime.metrics.entities.labels(API)
        # told of each form answered from its lookup's entries (hits.FrontLookups.learner)
        self.learn: Learn | None = None

    def fail(
        self, error: BaseException, method: str, t0: float, *, writing: bool = False
    ) -> Answer:
        if not isinstance(error, FeatureStoreError):
            log.exception("unexpected error in %s", method)
        p = problem(error, writing=writing)
        self.observe(API, method, str(p.status)).observe(time.perf_counter() - t0)
        retry = self.runtime.reader.breaker.retry_after if p.status == 503 else None
        return error_answer(p, retry)

    async def get(
        self, authorization: str | None, raw: bytes, request_id: str | None = None
    ) -> Answer:
        """``POST /v1/features/get``; ``request_id``: the client's ``x-request-id``, sent
        back (or one made here), under which the answer is logged (``served.FeatureLog``)."""
        service, auth, observe = self.service, self.auth, self.observe
        t0 = time.perf_counter()
        served = self.runtime.served
        request_id = served.request_id(request_id)
        try:
            role = auth.require(authorization, Role.READ)
            body = parse_object(raw, self.body_limit)
            _known(body, GET_FIELDS, "the request")
            entity = cast(str, _field(body, "entity_type", str))
            bypass = _field(body, "bypass_cache", bool, False)
            if bypass and role < Role.ADMIN:
                raise AuthError("bypass_cache needs an admin API key", 403)
            features, groups = _strings(body, "features"), _strings(body, "groups")
            lookup = await service.lookup(entity, _ids(body), features, groups, bypass=bool(bypass))
        except Exception as e:
            return with_request_id(self.fail(e, "get", t0), request_id)
        proj = lookup.projection
        head = proj.memo.get(API)
        if head is None:
            head = proj.memo[API] = b'{"entity_type":%b,"features":%b,"types":%b,"results":[' % (
                orjson.dumps(proj.entity.name),
                orjson.dumps(proj.names),
                orjson.dumps([f.type.value for f in proj.features]),
            )
        if proj.whole_group:
            # an entry loaded for gRPC gets its JSON here, kept and counted
            rows = whole_group_rows(lookup, keeper(self.runtime.reader.cache))
        else:
            rows = picked_rows(lookup)
        if self.learn is not None and not lookup.errors and not bypass:
            self.learn(entity, features, groups, proj, cast(bytes, head))
        if lookup.errors:
            content = b'%b%b],"errors":%b}' % (cast(bytes, head), rows, errors_json(lookup))
            self.runtime.metrics.count_errors(API, lookup.errors)
        else:
            content = b"%b%b]}" % (cast(bytes, head), rows)
        self.entities_served.inc(len(lookup.ids))
        if served.logging:
            served.offer(REST_CODE, request_id, content, (lookup,))
        observe(API, "get", "200").observe(time.perf_counter() - t0)
        return Answer(200, content, ((REQUEST_ID, request_id),))

    async def write(
        self, authorization: str | None, raw: bytes, request_id: str | None = None
    ) -> Answer:
        """``POST /v1/features/write``."""
        service, auth, observe, registry = self.service, self.auth, self.observe, self.registry
        t0 = time.perf_counter()
        try:
            auth.require(authorization, Role.ADMIN)
            body = parse_object(raw, self.body_limit)
            _known(body, WRITE_FIELDS, "the request")
            group = cast(str, _field(body, "group", str))
            raw_rows = cast(list[object], _field(body, "rows", list))
            known = registry.groups.get(group)
            by_name = {f.name: f for f in known.features} if known is not None else {}
            rows: list[WriteRow] = []
            for i, row in enumerate(raw_rows):
                if not isinstance(row, dict) or "id" not in row:
                    raise MalformedRequestError(f"rows[{i}] must be an object with 'id'")
                _known(row, ROW_FIELDS, f"rows[{i}]")
                values = row.get("values")
                if not isinstance(values, dict):
                    raise MalformedRequestError(f"rows[{i}].values must be an object")
                entity_id = cast(EntityId, json_int(row["id"]))
                converted = {
                    k: v if k not in by_name else from_json_value(by_name[k].type, v)
                    for k, v in values.items()
                }
                event_time = row.get("event_time")
                if event_time is None:
                    rows.append((entity_id, converted))
                else:
                    rows.append((entity_id, converted, event_time))
            written = await service.write(group, rows)
        except Exception as e:
            return self.fail(e, "write", t0, writing=True)
        observe(API, "write", "200").observe(time.perf_counter() - t0)
        return Answer(200, orjson.dumps(written.as_json()))


def with_request_id(answer: Answer, request_id: str) -> Answer:
    """An answer with the lookup's request id among its headers."""
    return Answer(answer.status, answer.body, (*answer.headers, (REQUEST_ID, request_id)))


def _id_json(entity_id: EntityId) -> bytes:
    return b"%d" % entity_id if type(entity_id) is int else orjson.dumps(entity_id)


def whole_group_rows(lookup: Lookup, charge: Callable[[Entry], None] | None = None) -> bytes:
    """The rows of a request for all of one group's features (the common request), joined:
    each entry's values JSON, made when it was loaded (or, loaded for gRPC, now: kept when
    ``charge`` counts it, ``cache.entry_json``), spliced in as it is. Written by the
    native core (``rest_rows``), or by ``_whole_group_rows``, its reference."""
    group = lookup.projection.groups[0]
    if charge is not None:
        for ((entry, _),) in lookup.entries:
            if entry.json is None:
                entry_json(entry, charge)
    if _rest_rows is None or lookup.errors:  # fault entries: the reference writes them
        return b",".join(_whole_group_rows(lookup))
    return _rest_rows(
        lookup.ids, lookup.entries, lookup.now, group.max_age_seconds, orjson.dumps(group.name)
    )


def _whole_group_rows(lookup: Lookup) -> list[bytes]:
    group = lookup.projection.groups[0]
    name, max_age, now = orjson.dumps(group.name), group.max_age_seconds, lookup.now
    rows = []
    for entity_id, ((entry, served_stale),) in zip(lookup.ids, lookup.entries, strict=True):
        if entry.fault is not None:
            rows.append(
                b'{"id":%b,"values":%b,"statuses":%b,"ages":{%b:null}}'
                % (
                    _id_json(entity_id),
                    entry.fmt.absent_json,
                    _error_statuses(len(entry.present)),
                    name,
                )
            )
            continue
        written_at, stale = entry.written_at, served_stale
        if written_at is None:
            age = b"null"
        else:
            seconds = max(0, now - written_at)
            stale = stale or (max_age is not None and seconds > max_age)
            age = b"%d" % seconds
        rows.append(
            b'{"id":%b,"values":%b,"statuses":%b,"ages":{%b:%b}}'
            % (
                _id_json(entity_id),
                entry.json if entry.json is not None else entry.fmt.json(cast(bytes, entry.raw)),
                entry.fmt.statuses_json(entry.present, stale),
                name,
                age,
            )
        )
    return rows


@functools.cache
def _error_statuses(count: int) -> bytes:
    return b"[" + b",".join([b'"error"'] * count) + b"]"


def errors_json(lookup: Lookup) -> bytes:
    """The answer's ``errors``: each entity and group answered with status "error", why."""
    return orjson.dumps(
        [
            {"id": e.entity_id, "group": e.group, "reason": e.reason, "message": e.message}
            for e in lookup.errors
        ]
    )


def picked_rows(lookup: Lookup) -> bytes:
    """The rows of a request for some features, joined. Of one group, written by the native
    core (``GroupCodec.picked_rows``) from the entries' packed values; else, or for a value
    only the reference decodes, by ``_picked_rows``, its reference."""
    proj = lookup.projection
    native = lookup.entries[0][0].entry.fmt.native if lookup.entries else None
    if native is not None and len(proj.groups) == 1 and not lookup.errors:
        group = proj.groups[0]
        picks = proj.memo.get(PICKS)
        if picks is None:
            picks = proj.memo[PICKS] = [fi for _, fi in proj.picks]
        try:
            return native.picked_rows(
                lookup.ids,
                lookup.entries,
                lookup.now,
                group.max_age_seconds,
                orjson.dumps(group.name),
                cast(list[int], picks),
            )
        except ValueError:
            pass
    return b",".join(_picked_rows(lookup))


def _picked_rows(lookup: Lookup) -> list[bytes]:
    """Rows of a request for some features, of one group or several."""
    proj = lookup.projection
    rows = []
    for entity_id, resolved in zip(lookup.ids, lookup.entries, strict=True):
        stale, ages = group_states(proj, resolved, lookup.now)
        parts = [e.fmt.json_parts(e.raw) if e.raw is not None else None for e, _ in resolved]
        values, statuses = [], []
        for gi, fi in proj.picks:
            part = parts[gi]
            if part is None or not resolved[gi].entry.present[fi]:
                values.append(b"null")
                statuses.append(b'"missing"' if resolved[gi].entry.fault is None else b'"error"')
            else:
                values.append(part[fi])
                statuses.append(b'"stale"' if stale[gi] else b'"present"')
        rows.append(
            b'{"id":%b,"values":[%b],"statuses":[%b],"ages":%b}'
            % (_id_json(entity_id), b",".join(values), b",".join(statuses), orjson.dumps(ages))
        )
    return rows
