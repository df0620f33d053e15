"""Feast's online store on this project's Redis layout, in Feast's own process.

A team on Feast keeps its SDK, its repository and ``feast materialize``, and swaps the
online store in ``feature_store.yaml``:

    online_store:
      type: feature_store.feast_redis.FeatureStoreRedisOnlineStore
      connection_string: redis://127.0.0.1:6379   # or redis://host:port?cluster=true
      # registry: features.yaml   # optional: this project's registry; else derived

The hashes it writes are the ones ``feature-store serve`` reads: one hash per entity,
xxHash32 field names, this project's codecs, each view's freshness field, the entity's key
TTL. The mapping from Feast's definitions is ``feature-store import-feast``'s
(``feast_mapping.to_registry``), derived from Feast's registry at run time. Key prefixes
are pinned in Redis (``PINS_KEY``) the first time an entity is seen, so an entity added
later never moves another's keys; a tag ``feature_store_prefix`` on an entity sets one.

- ``get_online_features`` (Feast's SDK calls the store's) plans the request once per
  shape, reads every entity of every view in one pipelined round trip, decodes with the
  native core, and answers a response whose ``to_dict`` comes from the decoded values;
  its ``proto`` (Feast's ``GetOnlineFeaturesResponse``) is built on first use. Statuses
  are this project's: ``OUTSIDE_MAX_AGE`` past a view's ``ttl``, ``NULL_VALUE`` for a
  value an entity lacks, ``NOT_FOUND`` for an entity without the view. Requests this path
  does not plan (on-demand views, versioned refs, join key maps) go through Feast's
  generic path over ``online_read``.
- ``online_write_batch`` (``feast materialize``, ``push``, ``write_to_online_store``)
  writes through the event-time guard and announces the write to serving instances;
  rows older than what Redis holds are skipped and logged.
- ``update`` / ``teardown``: a removed view's fields are deleted from its entities'
  hashes (a scan of the entity's keys); ``teardown`` deletes the entities' keys.

It needs Feast (``pip install 'feature-store[feast]'``); Feast imports it by that name.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import pyarrow as pa  # type: ignore[import-untyped]
from feast import Entity, FeatureService, FeatureView, RepoConfig
from feast import FeatureStore as FeastStore
from feast.infra.online_stores.online_store import OnlineStore
from feast.infra.registry.base_registry import BaseRegistry
from feast.online_response import TIMESTAMP_POSTFIX, OnlineResponse
from feast.protos.feast.serving.ServingService_pb2 import FieldStatus, GetOnlineFeaturesResponse
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import (
    BoolList,
    DoubleList,
    FloatList,
    Int32List,
    Int64List,
    RepeatedValue,
    StringList,
    Value,
)
from feast.repo_config import FeastConfigBaseModel
from feast.value_type import ValueType
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import StrictStr

from feature_store import notices
from feature_store.batch import (
    MISSING,
    PRESENT,
    STALE,
    EntityId,
    WriteStats,
    plan_read,
    write_outcome,
)
from feature_store.connection import SyncClient, close_client, translated_errors
from feature_store.errors import RegistryError, RequestError
from feature_store.feast_mapping import (
    DEFAULT_ENTITY_TTL,
    feature_type,
    rows_to_columns,
    to_registry,
)
from feature_store.ingest.encode import BatchEncoder, EncodedBatch
from feature_store.ingest.spec import ColumnSpec, RetrySpec
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import IdType, feature_field, freshness_field
from feature_store.registry import FeatureGroup, Registry, load_registry, parse_registry
from feature_store.settings import target_from_env
from feature_store.store import read_plans

log = logging.getLogger(__name__)

NAME: Literal["feature_store.feast_redis.FeatureStoreRedisOnlineStore"] = (
    "feature_store.feast_redis.FeatureStoreRedisOnlineStore"
)
# entity -> key prefix, chosen once per Redis; '{' starts no entity key (prefixes exclude it)
PINS_KEY = "{feature_store}:feast:prefixes"
SCAN_COUNT = 1000
DELETE_CHUNK = 500
PLANS_MAX = 1024  # request shapes remembered per mapping
WRITE_CHUNK = 500  # entities per write pipeline, as the nightly job's
BAD_SHOWN = 5  # rows that do not encode, named in the error

# this project's statuses in Feast's terms (MISSING: NULL_VALUE or NOT_FOUND, by the group)
FEAST_PRESENT, FEAST_NOT_FOUND = int(FieldStatus.PRESENT), int(FieldStatus.NOT_FOUND)
FEAST_NULL, FEAST_INVALID = int(FieldStatus.NULL_VALUE), int(FieldStatus.INVALID)
STATUS = {PRESENT: FEAST_PRESENT, STALE: int(FieldStatus.OUTSIDE_MAX_AGE)}


class FeatureStoreRedisOnlineStoreConfig(FeastConfigBaseModel):
    """The plugin's settings in ``feature_store.yaml``."""

    # Feast finds the store by this dotted name, and the config class by its name + Config
    type: Literal["feature_store.feast_redis.FeatureStoreRedisOnlineStore"] = NAME
    # this project's Redis URL (redis://, rediss://, unix://, ?cluster=true), or Feast's
    # form: host:port[,host:port...][,password=...][,ssl=true]
    connection_string: StrictStr = "redis://127.0.0.1:6379"
    redis_type: Literal["redis", "redis_cluster"] = "redis"
    # this project's registry YAML: its mapping is used (and checked against Feast's views)
    registry: StrictStr | None = None
    entity_ttl: StrictStr = DEFAULT_ENTITY_TTL  # at least each entity's longest view ttl
    mapping_ttl_seconds: float = 60.0  # how long Feast's registry is trusted as read


def redis_url(config: FeatureStoreRedisOnlineStoreConfig) -> str:
    """This project's Redis URL of the plugin's ``connection_string`` (either form)."""
    text = config.connection_string.strip()
    cluster = config.redis_type == "redis_cluster"
    if "://" in text:
        if cluster and "cluster=" not in text:
            text += ("&" if "?" in text else "?") + "cluster=true"
        return text
    parts = [p.strip() for p in text.split(",") if p.strip()]
    hosts = [p for p in parts if "=" not in p]
    options = dict(p.split("=", 1) for p in parts if "=" in p)
    if not hosts:
        raise RegistryError(f"online_store.connection_string {text!r} names no host:port")
    scheme = "rediss" if options.get("ssl", "").lower() == "true" else "redis"
    auth = f":{quote(options['password'], safe='')}@" if options.get("password") else ""
    query = []
    if cluster:
        query.append("cluster=true")
        if len(hosts) > 1:
            query.append("nodes=" + ",".join(hosts[1:]))
    return f"{scheme}://{auth}{hosts[0]}" + ("?" + "&".join(query) if query else "")


# --- the mapping -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ViewMap:
    """A Feast view as this project's group, with the types Feast declares for it."""

    group: FeatureGroup
    types: Mapping[str, ValueType]  # feature -> Feast's type


@dataclass(frozen=True, slots=True)
class Layout:
    """Feast's definitions mapped onto this project's registry."""

    registry: Registry
    views: Mapping[str, ViewMap]
    id_types: Mapping[str, ValueType]  # join key -> Feast's type of its values
    text: str  # the registry's YAML, for feature-store serve


def _id_value_type(entity: Entity, views: Sequence[FeatureView]) -> ValueType:
    if entity.value_type != ValueType.UNKNOWN:
        return entity.value_type
    for view in views:  # not declared: Feast infers it from the views' entity columns
        for column in view.entity_columns:
            if column.name == entity.join_key:
                return column.dtype.to_value_type()
    return ValueType.UNKNOWN


def layout_of(
    entities: Sequence[Entity],
    views: Sequence[FeatureView],
    services: Sequence[FeatureService],
    pins: Mapping[str, str],
    config: FeatureStoreRedisOnlineStoreConfig,
    source: str,
) -> Layout:
    """The layout of Feast's definitions: ``import-feast``'s mapping with ``pins`` kept, or
    the configured registry's, checked against the views. RegistryError names every
    entry that does not map."""
    entities = [e for e in entities if any(e.name in v.entities for v in views)]
    if config.registry:
        text = Path(config.registry).read_text()
        registry = load_registry(Path(config.registry))
        _check_registry(registry, views, {e.name: e for e in entities}, config.registry)
    else:
        text = to_registry(
            entities, views, services, entity_ttl=config.entity_ttl, source=source, prefixes=pins
        )
        registry = parse_registry(text, source)
    mapped = {
        v.name: ViewMap(
            registry.groups[v.name], {f.name: f.dtype.to_value_type() for f in v.features}
        )
        for v in views
    }
    id_types = {e.join_key: _id_value_type(e, views) for e in entities}
    return Layout(registry, mapped, id_types, text)


def _check_registry(
    registry: Registry, views: Sequence[FeatureView], entities: Mapping[str, Entity], path: str
) -> None:
    problems = []
    for view in views:
        group = registry.groups.get(view.name)
        if group is None:
            problems.append(f"feature_views.{view.name}: no feature group of this name")
            continue
        names = [e for e in view.entities if e in entities]
        join_key = entities[names[0]].join_key if names else None
        if group.entity.join_key != join_key:
            problems.append(
                f"feature_views.{view.name}: join key {join_key!r}, but the group's entity "
                f"type {group.entity.name!r} has {group.entity.join_key!r}"
            )
        for f in view.features:
            want = feature_type(f.dtype, int(getattr(f, "vector_length", 0) or 0))
            try:
                have = group.feature(f.name)
            except RequestError:
                problems.append(f"feature_views.{view.name}.features.{f.name}: not in the group")
                continue
            kind = have.type.value + (f"({have.dim})" if have.dim else "")
            if want != kind:
                problems.append(
                    f"feature_views.{view.name}.features.{f.name}: Feast declares {f.dtype} "
                    f"({want}), the registry {kind}"
                )
    if problems:
        raise RegistryError(
            f"{path}: {len(problems)} Feast definition(s) do not match the registry:\n  "
            + "\n  ".join(problems)
        )


# --- answers ---------------------------------------------------------------------------------


def _float32(column: list[Any]) -> list[Any]:
    """Doubles as Feast reads a Float32 (the float32 value, widened)."""
    if None not in column:
        return array("f", column).tolist()
    return [None if v is None else array("f", (v,))[0] for v in column]


# a Python value of a declared type as Feast's Value
MAKERS: dict[ValueType, Callable[[Any], Value]] = {
    ValueType.FLOAT: lambda v: Value(float_val=v),
    ValueType.DOUBLE: lambda v: Value(double_val=v),
    ValueType.INT64: lambda v: Value(int64_val=v),
    ValueType.INT32: lambda v: Value(int32_val=v),
    ValueType.BOOL: lambda v: Value(bool_val=v),
    ValueType.STRING: lambda v: Value(string_val=v),
    ValueType.FLOAT_LIST: lambda v: Value(float_list_val=FloatList(val=v)),
    ValueType.DOUBLE_LIST: lambda v: Value(double_list_val=DoubleList(val=v)),
    ValueType.INT64_LIST: lambda v: Value(int64_list_val=Int64List(val=v)),
    ValueType.INT32_LIST: lambda v: Value(int32_list_val=Int32List(val=v)),
    ValueType.BOOL_LIST: lambda v: Value(bool_list_val=BoolList(val=v)),
    ValueType.STRING_LIST: lambda v: Value(string_list_val=StringList(val=v)),
}


class Response(OnlineResponse):
    """Feast's ``OnlineResponse`` of columns already decoded: ``to_dict`` (and so
    ``to_df``, ``to_arrow``) reads them as they are; ``proto`` is built on first use."""

    def __init__(
        self,
        names: list[str],
        values: list[list[Any]],
        statuses: list[list[int]],
        stamps: list[list[int]],
        types: dict[str, ValueType],
    ) -> None:
        # OnlineResponse.__init__ only stores a proto, which this one makes when asked
        self._feature_types = types
        self._names, self._values, self._statuses, self._stamps = names, values, statuses, stamps
        self._proto: GetOnlineFeaturesResponse | None = None

    @property
    def proto(self) -> GetOnlineFeaturesResponse:
        if self._proto is None:
            self._proto = self._build()
        return self._proto

    @proto.setter
    def proto(self, value: GetOnlineFeaturesResponse) -> None:
        self._proto = value

    def _build(self) -> GetOnlineFeaturesResponse:
        proto = GetOnlineFeaturesResponse()
        proto.metadata.feature_names.val.extend(self._names)
        stamp_of: dict[int, Timestamp] = {}
        for name, values, statuses, stamps in zip(
            self._names, self._values, self._statuses, self._stamps, strict=True
        ):
            make = MAKERS[self._feature_types[name]]
            vector = proto.results.add()
            vector.values.extend([Value() if v is None else make(v) for v in values])
            vector.statuses.extend(statuses)
            vector.event_timestamps.extend(
                [stamp_of.get(s) or stamp_of.setdefault(s, Timestamp(seconds=s)) for s in stamps]
            )
        proto.status = True
        return proto

    def to_dict(self, include_event_timestamps: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values, stamps in zip(self._names, self._values, self._stamps, strict=True):
            out[name] = list(values)
            if include_event_timestamps:
                out[name + TIMESTAMP_POSTFIX] = list(stamps)
        return out


# --- reads -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _EntityRead:
    entity: str  # this project's entity type
    join_key: str
    features: tuple[str, ...]  # "group:feature", for plan_read


@dataclass(frozen=True, slots=True)
class _Column:
    name: str  # as answered
    read: int  # index into _Plan.reads
    feature: int  # index into that read's features
    kind: ValueType


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one shape of request reads and answers, worked out once."""

    join_keys: tuple[tuple[str, ValueType], ...]  # the join key columns answered first
    reads: tuple[_EntityRead, ...]
    columns: tuple[_Column, ...]


def _refs(
    features: list[str] | FeatureService,
) -> list[tuple[str, str, str]] | None:
    """(view, view name answered, feature) of each requested feature; None where this
    path does not plan the request (Feast's generic path takes it)."""
    if isinstance(features, FeatureService):
        out = []
        for projection in features.feature_view_projections:
            if projection.join_key_map or getattr(projection, "version_tag", None) is not None:
                return None
            answered = projection.name_to_use()  # type: ignore[no-untyped-call]
            out += [(projection.name, answered, f.name) for f in projection.features]
        return out
    refs = []
    for ref in features:
        view, sep, name = ref.partition(":")
        if not sep or "@" in view:
            return None
        refs.append((view, view, name))
    return refs


def make_plan(
    layout: Layout,
    features: list[str] | FeatureService,
    row_keys: Sequence[str],
    full_feature_names: bool,
) -> _Plan | None:
    """The plan of a request, or None where Feast's generic path must answer it (a view
    this layout does not hold, such as an on-demand one; a join key not given; ...)."""
    refs = _refs(features)
    if refs is None:
        return None
    reads: dict[str, tuple[str, list[str]]] = {}  # entity -> (join key, features)
    columns: list[tuple[str, str, int, ValueType]] = []  # name, entity, feature index
    names: set[str] = set()
    for view, answered, feature in refs:
        mapped = layout.views.get(view)
        if mapped is None or feature not in mapped.types:
            return None
        entity = mapped.group.entity
        if entity.join_key not in row_keys:
            return None
        name = f"{answered}__{feature}" if full_feature_names else feature
        if name in names:
            if full_feature_names:
                continue  # asked twice: answered once, as Feast does
            return None  # two views' features of one name: Feast's generic path decides
        names.add(name)
        wanted = reads.setdefault(entity.name, (entity.join_key, []))[1]
        ref = f"{mapped.group.name}:{feature}"
        if ref not in wanted:
            wanted.append(ref)
        columns.append((name, entity.name, wanted.index(ref), mapped.types[feature]))
    if not columns:
        return None
    order = list(reads)
    used_keys = {reads[e][0] for e in order}
    return _Plan(
        join_keys=tuple((k, layout.id_types[k]) for k in row_keys if k in used_keys),
        reads=tuple(_EntityRead(e, reads[e][0], tuple(reads[e][1])) for e in order),
        columns=tuple(_Column(n, order.index(e), i, kind) for n, e, i, kind in columns),
    )


def _ids(values: Iterable[Any], id_type: IdType, join_key: str) -> list[EntityId]:
    """Entity values as this project's ids (numpy scalars and protobuf Values too)."""
    out: list[EntityId] = []
    for v in values:
        if isinstance(v, Value):
            kind = v.WhichOneof("val")
            v = None if kind is None else getattr(v, kind)
        if id_type is IdType.INT:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise ValueError(f"{join_key} {v!r}: this entity has int ids")
            out.append(int(v))
        else:
            if not isinstance(v, str):
                raise ValueError(f"{join_key} {v!r}: this entity has string ids")
            out.append(v)
    return out


# --- the store -------------------------------------------------------------------------------


@dataclass
class _Cached:
    layout: Layout
    made: float
    plans: dict[tuple[object, ...], _Plan | None]


class FeatureStoreRedisOnlineStore(OnlineStore):
    """Feast's online store on this project's Redis layout; see the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._writers: dict[str, ChunkWriter] = {}  # redis URL -> writer
        self._layouts: dict[tuple[str, int], _Cached] = {}  # (project, registry id)
        self._feast_registries: dict[str, BaseRegistry] = {}
        self._origin = notices.new_origin()  # serving instances skip nothing of ours

    async def close(self) -> None:
        """Feast's shutdown call (its feature server awaits it)."""
        self.disconnect()

    def disconnect(self) -> None:
        """Close the Redis connections (they are opened again when needed)."""
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            client = writer.client
            writer.close()
            close_client(client)  # a cluster's: the nodes it has since replaced, too

    # -- connections and the mapping

    @staticmethod
    def _config(config: RepoConfig) -> FeatureStoreRedisOnlineStoreConfig:
        cfg = config.online_store
        if not isinstance(cfg, FeatureStoreRedisOnlineStoreConfig):
            raise TypeError(f"online_store is {type(cfg).__name__}, not this store's config")
        return cfg

    def _writer(self, config: RepoConfig) -> ChunkWriter:
        """One writer (and its client, for reads too) per Redis."""
        url = redis_url(self._config(config))
        writer = self._writers.get(url)
        if writer is None:
            with self._lock:
                writer = self._writers.get(url)
                if writer is None:
                    writer = self._writers[url] = ChunkWriter(
                        target_from_env(url),
                        ttl_seconds=0,  # each entity's own, per call
                        chunk_size=WRITE_CHUNK,
                        retry=RetrySpec(),
                    )
        return writer

    def _client(self, config: RepoConfig) -> SyncClient:
        return self._writer(config).client

    def _pins(self, client: SyncClient) -> dict[str, str]:
        with translated_errors():
            found = client.hgetall(PINS_KEY)
        return {_text(k): _text(v) for k, v in found.items()}

    def _pin(self, client: SyncClient, registry: Registry) -> None:
        """Record each entity's prefix, unless one is recorded: the first choice stays."""
        with translated_errors():
            pipe = client.pipeline(transaction=False)
            for entity in registry.entities.values():
                pipe.hsetnx(PINS_KEY, entity.name, entity.prefix)
            pipe.execute()

    def _feast_registry(self, config: RepoConfig) -> BaseRegistry:
        """Feast's registry, for calls that are not given it (reads and writes by view)."""
        key = str(config.repo_path)
        found = self._feast_registries.get(key)
        if found is None:
            repo = str(config.repo_path) if config.repo_path else None
            found = self._feast_registries[key] = FeastStore(repo_path=repo, config=config).registry
        return found

    def _cached(self, config: RepoConfig, registry: BaseRegistry | None) -> _Cached:
        """The layout of the project, derived from Feast's registry at most once per
        ``mapping_ttl_seconds``; new entities' prefixes are pinned on the way."""
        registry = registry if registry is not None else self._feast_registry(config)
        project = config.project
        key = (project, id(registry))
        cfg = self._config(config)
        now = time.monotonic()
        cached = self._layouts.get(key)
        if cached is not None and now - cached.made < cfg.mapping_ttl_seconds:
            return cached
        client = self._client(config)
        views = [
            *registry.list_feature_views(project, allow_cache=True),
            *registry.list_stream_feature_views(project, allow_cache=True),
        ]
        layout = layout_of(
            registry.list_entities(project, allow_cache=True),
            views,
            registry.list_feature_services(project, allow_cache=True),
            self._pins(client),
            cfg,
            str(Path(config.repo_path).resolve()) if config.repo_path else f"project {project}",
        )
        self._pin(client, layout.registry)
        cached = self._layouts[key] = _Cached(layout, now, {})
        return cached

    def layout(self, config: RepoConfig, registry: BaseRegistry | None = None) -> Layout:
        """This project's registry for Feast's definitions, as this store writes and reads
        them (``feature-store import-feast`` writes it out for ``feature-store serve``)."""
        return self._cached(config, registry).layout

    # -- reads

    def get_online_features(
        self,
        config: RepoConfig,
        features: list[str] | FeatureService,
        entity_rows: list[dict[str, Any]] | Mapping[str, Sequence[Any] | RepeatedValue],
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        include_feature_view_version_metadata: bool = False,
    ) -> OnlineResponse:
        if isinstance(entity_rows, list):
            entity_rows = rows_to_columns(entity_rows)
        cached = self._cached(config, registry) if project == config.project else None
        plan = None
        if cached is not None and not include_feature_view_version_metadata:
            shape = (
                features.name if isinstance(features, FeatureService) else tuple(features),
                tuple(entity_rows),
                full_feature_names,
            )
            if shape in cached.plans:
                plan = cached.plans[shape]
            else:
                plan = make_plan(cached.layout, features, tuple(entity_rows), full_feature_names)
                if len(cached.plans) < PLANS_MAX:
                    cached.plans[shape] = plan
        if plan is None or cached is None:  # Feast's generic path, over online_read
            return super().get_online_features(
                config,
                features,
                entity_rows,
                registry,
                project,
                full_feature_names,
                include_feature_view_version_metadata,
            )
        return self._answer(config, cached.layout, plan, entity_rows)

    def _answer(
        self,
        config: RepoConfig,
        layout: Layout,
        plan: _Plan,
        entity_rows: Mapping[str, Sequence[Any] | RepeatedValue],
    ) -> Response:
        columns = {
            k: list(v.val) if isinstance(v, RepeatedValue) else list(v)
            for k, v in entity_rows.items()
        }
        lengths = {len(v) for v in columns.values()}
        if len(lengths) != 1:
            raise ValueError("All entity rows must have the same columns.")
        n = lengths.pop()
        registry = layout.registry
        plans = []
        for wanted in plan.reads:
            etype = registry.entities[wanted.entity]
            ids = _ids(columns[wanted.join_key], etype.id_type, wanted.join_key)
            try:
                plans.append(plan_read(registry, wanted.entity, ids, wanted.features))
            except RequestError as e:
                raise ValueError(str(e)) from None
        reads = read_plans(self._client(config), plans, time.time())
        names: list[str] = []
        values: list[list[Any]] = []
        statuses: list[list[int]] = []
        stamps: list[list[int]] = []
        types: dict[str, ValueType] = {}
        for key, kind in plan.join_keys:
            read_index = next(i for i, r in enumerate(plan.reads) if r.join_key == key)
            names.append(key)
            values.append(list(plans[read_index].ids))
            statuses.append([FEAST_PRESENT] * n)
            stamps.append([0] * n)
            types[key] = kind
        for col in plan.columns:
            rows = reads[col.read].rows
            group = plans[col.read].features[col.feature].group
            column = [row.values[col.feature] for row in rows]
            if col.kind is ValueType.FLOAT:
                column = _float32(column)
            col_statuses: list[int] = []
            col_stamps: list[int] = []
            for row in rows:
                status = row.statuses[col.feature]
                at = row.written[group]
                if status is MISSING:
                    col_statuses.append(FEAST_NOT_FOUND if at is None else FEAST_NULL)
                else:
                    col_statuses.append(STATUS.get(status, FEAST_INVALID))
                col_stamps.append(0 if at is None else at)
            names.append(col.name)
            values.append(column)
            statuses.append(col_statuses)
            stamps.append(col_stamps)
            types[col.name] = col.kind
        return Response(names, values, statuses, stamps, types)

    def online_read(
        self,
        config: RepoConfig,
        table: FeatureView,
        entity_keys: list[EntityKeyProto],
        requested_features: list[str] | None = None,
    ) -> list[tuple[datetime | None, dict[str, Value] | None]]:
        """Feast's generic read of one view: each entity's write time and present values."""
        layout = self.layout(config)
        mapped = self._view(layout, table)
        entity = mapped.group.entity
        wanted = requested_features or list(mapped.types)
        ids = [_entity_id(key, entity.join_key, entity.id_type) for key in entity_keys]
        if not ids:
            return []
        plan = plan_read(
            layout.registry, entity.name, ids, [f"{mapped.group.name}:{f}" for f in wanted]
        )
        (read,) = read_plans(self._client(config), [plan], time.time())
        out: list[tuple[datetime | None, dict[str, Value] | None]] = []
        for row in read.rows:
            at = row.written[mapped.group.name]
            if at is None:
                out.append((None, None))
                continue
            found: dict[str, Value] = {}
            for f, value in zip(plan.features, row.values, strict=True):
                if value is not None:
                    kind = mapped.types[f.name]
                    if kind is ValueType.FLOAT:
                        value = _float32([value])[0]
                    found[f.name] = MAKERS[kind](value)
            out.append((datetime.fromtimestamp(at, UTC), found))
        return out

    @staticmethod
    def _view(layout: Layout, table: FeatureView) -> ViewMap:
        name = table.projection.name if table.projection else table.name
        mapped = layout.views.get(name) or layout.views.get(table.name)
        if mapped is None:
            raise RegistryError(
                f"feature view {table.name!r} is not in Feast's registry as this store last "
                "read it; run 'feast apply'"
            )
        return mapped

    # -- writes

    def online_write_batch(
        self,
        config: RepoConfig,
        table: FeatureView,
        data: list[tuple[EntityKeyProto, dict[str, Value], datetime, datetime | None]],
        progress: Callable[[int], Any] | None,
    ) -> None:
        """Rows of one view through the event-time guard, encoded a column at a time as
        the nightly job encodes them; serving instances are told. Rows older than what
        Redis holds are skipped and logged; a row that does not encode is named in the
        error raised after the others are written."""
        layout = self.layout(config)
        mapped = self._view(layout, table)
        group = mapped.group
        writer = self._writer(config)
        encoded = encode_rows(group, mapped.types, data)
        stats = WriteStats()
        for start in range(0, len(encoded), WRITE_CHUNK):
            stop = min(start + WRITE_CHUNK, len(encoded))
            replies = writer.send(encoded.commands(group.entity.ttl_seconds, start, stop))
            stats += write_outcome(encoded.counts(start, stop), replies)
        if encoded.keys:
            writer.publish(
                notices.write_message(self._origin, group.name, encoded.keys, time.time())
            )
        if stats.skipped:
            log.warning(
                "%s: %d of %d row(s) skipped: Redis holds newer writes of those entities",
                table.name,
                stats.skipped,
                len(data),
            )
        log.info("%s: wrote %d row(s)", table.name, stats.entities)
        if progress:
            progress(len(data))
        if encoded.bad:
            shown = "; ".join(
                f"row {b.index} ({_entity_text(data[b.index][0])}): {b.detail}"
                for b in encoded.bad[:BAD_SHOWN]
            )
            raise ValueError(
                f"feature view {table.name!r}: {len(encoded.bad)} row(s) not written: {shown}"
            )

    # -- definitions

    def update(
        self,
        config: RepoConfig,
        tables_to_delete: Sequence[FeatureView],
        tables_to_keep: Sequence[FeatureView],
        entities_to_delete: Sequence[Entity],
        entities_to_keep: Sequence[Entity],
        partial: bool,
    ) -> None:
        """``feast apply``: the kept views must map (RegistryError names each that does
        not, and the apply stops); their entities' prefixes are pinned; the fields of the
        deleted views are deleted from their entities' hashes."""
        client = self._client(config)
        pins = self._pins(client)
        kept_views = [v for v in tables_to_keep if isinstance(v, FeatureView)]
        if kept_views:
            layout = layout_of(
                entities_to_keep, kept_views, (), pins, self._config(config), "feast apply"
            )
            self._pin(client, layout.registry)
            pins = self._pins(client)
        keep_fields: dict[str, set[bytes]] = {}
        for view in kept_views:
            for e in view.entities:
                keep_fields.setdefault(e, set()).update(
                    feature_field(f.name) for f in view.features
                )
        for view in tables_to_delete:
            self._delete_view(client, view, pins, keep_fields)
        self._layouts.clear()

    def teardown(
        self, config: RepoConfig, tables: Sequence[FeatureView], entities: Sequence[Entity]
    ) -> None:
        """``feast teardown``: the views' fields, then the entities' keys and pins."""
        client = self._client(config)
        pins = self._pins(client)
        for view in tables:
            self._delete_view(client, view, pins, {})
        for entity in entities:
            prefix = pins.get(entity.name)
            if prefix is None:
                continue
            _delete_keys(client, prefix, None)
            with translated_errors():
                client.hdel(PINS_KEY, entity.name)
        self._layouts.clear()

    @staticmethod
    def _delete_view(
        client: SyncClient,
        view: FeatureView,
        pins: Mapping[str, str],
        keep: Mapping[str, set[bytes]],
    ) -> None:
        for entity in view.entities:
            prefix = pins.get(entity)
            if prefix is None:  # never written through this store
                continue
            fields = [feature_field(f.name) for f in view.features]
            fields = [f for f in fields if f not in keep.get(entity, set())]
            _delete_keys(client, prefix, [*fields, freshness_field(view.name)])
            log.info("deleted feature view %s's fields from %s:* hashes", view.name, prefix)


def _delete_keys(client: SyncClient, prefix: str, fields: list[bytes] | None) -> None:
    """HDEL ``fields`` from every key of ``prefix`` (or UNLINK the keys: None), in pipelines."""
    with translated_errors():
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=SCAN_COUNT):
            batch.append(key)
            if len(batch) >= DELETE_CHUNK:
                _delete(client, batch, fields)
                batch = []
        if batch:
            _delete(client, batch, fields)


def _delete(client: SyncClient, keys: list[bytes], fields: list[bytes] | None) -> None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        if fields is None:
            pipe.unlink(key)
        else:
            pipe.hdel(key, *fields)
    pipe.execute()


def _entity_id(key: EntityKeyProto, join_key: str, id_type: IdType) -> EntityId:
    if list(key.join_keys) != [join_key]:
        raise ValueError(f"entity key {list(key.join_keys)}: this view's join key is {join_key!r}")
    return _ids([key.entity_values[0]], id_type, join_key)[0]


def _text(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data


def _python(value: Value) -> object:
    """A Feast Value as the Python value the codecs take (None: Feast's null)."""
    kind = value.WhichOneof("val")
    if kind is None:
        return None
    got = getattr(value, kind)
    return list(got.val) if kind.endswith("_list_val") else got


# the Value field of each declared type, and the Arrow type its column is built as
COLUMNS: dict[ValueType, tuple[str, pa.DataType]] = {
    ValueType.FLOAT: ("float_val", pa.float32()),
    ValueType.DOUBLE: ("double_val", pa.float64()),
    ValueType.INT32: ("int32_val", pa.int64()),
    ValueType.INT64: ("int64_val", pa.int64()),
    ValueType.BOOL: ("bool_val", pa.bool_()),
    ValueType.STRING: ("string_val", pa.string()),
    ValueType.FLOAT_LIST: ("float_list_val", pa.list_(pa.float32())),
    ValueType.INT32_LIST: ("int32_list_val", pa.list_(pa.int64())),
    ValueType.INT64_LIST: ("int64_list_val", pa.list_(pa.int64())),
}
ID_COLUMN, TIME_COLUMN = "__id", "__event_time"
NULL = Value()


def _column(values: Sequence[Value], kind: ValueType) -> pa.Array:
    """One feature's Values as an Arrow column (a null Value: null, which removes it)."""
    attr, arrow = COLUMNS[kind]
    has: Callable[[Value, str], bool] = Value.HasField  # type: ignore[assignment]  # a null Value sets no field
    if kind in (ValueType.FLOAT_LIST, ValueType.INT32_LIST, ValueType.INT64_LIST):
        cells: list[Any] = [list(getattr(v, attr).val) if has(v, attr) else None for v in values]
    else:
        cells = [getattr(v, attr) if has(v, attr) else None for v in values]
    return pa.array(cells, type=arrow)


def encode_rows(
    group: FeatureGroup,
    types: Mapping[str, ValueType],
    data: Sequence[tuple[EntityKeyProto, Mapping[str, Value], datetime, datetime | None]],
) -> EncodedBatch:
    """Feast's rows of one view as the guarded writes of this project's layout: columns
    by declared type, encoded by the nightly job's encoder. A feature a row leaves out is
    removed, as Feast's rows carry every feature of the view."""
    entity = group.entity
    names = [f.name for f in group.features if f.name in types]
    rows = [row[1] for row in data]
    columns = {}
    for name in names:
        try:
            values = [r[name] for r in rows]
        except KeyError:  # a row without the feature: removed (Feast's rows have them all)
            values = [r.get(name, NULL) for r in rows]
        columns[name] = _column(values, types[name])
    ids = [_entity_id(row[0], entity.join_key, entity.id_type) for row in data]
    columns[ID_COLUMN] = pa.array(
        ids, type=pa.int64() if entity.id_type is IdType.INT else pa.string()
    )
    columns[TIME_COLUMN] = pa.array(
        [(t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() for _, _, t, _ in data],
        type=pa.float64(),
    )
    encoder = BatchEncoder(
        group,
        ID_COLUMN,
        [ColumnSpec(name, name) for name in names],
        time.time(),
        event_time_column=TIME_COLUMN,
    )
    return encoder.encode(pa.RecordBatch.from_pydict(columns))


def _entity_text(key: EntityKeyProto) -> str:
    return ", ".join(
        f"{k}={_python(v)!r}" for k, v in zip(key.join_keys, key.entity_values, strict=False)
    )
