"""Feast's online store on this project's Redis layout, in Feast's own process.

A team on Feast keeps its SDK, its repository and ``feast materialize``, and swaps the
online store in ``feature_store.yaml``:

    online_store:
      type: feature_store.feast.online_store.FeatureStoreRedisOnlineStore
      connection_string: redis://127.0.0.1:6379   # or redis://host:port?cluster=true
      # registry: features.yaml   # optional: this project's registry; else derived

The hashes it writes are the ones ``feature-store serve`` reads: one hash per entity,
xxHash32 field names, this project's codecs, each view's freshness field, the entity's key
TTL. The mapping from Feast's definitions is ``feature-store import-feast``'s
(``feast.mapping.to_registry``), derived from Feast's registry at run time. Key prefixes
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import quote

from feast import Entity, FeatureService, FeatureView, RepoConfig
from feast import FeatureStore as FeastStore
from feast.infra.online_stores.online_store import OnlineStore
from feast.infra.registry.base_registry import BaseRegistry
from feast.online_response import OnlineResponse
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import (
    RepeatedValue,
    Value,
)
from feast.repo_config import FeastConfigBaseModel
from feast.value_type import ValueType
from pydantic import StrictStr

from feature_store import notices
from feature_store.batch import (
    MISSING,
    WriteStats,
    plan_read,
    write_outcome,
)
from feature_store.connection import SyncClient, close_client, translated_errors
from feature_store.errors import RegistryError, RequestError
from feature_store.feast.answers import (
    FEAST_INVALID,
    FEAST_NOT_FOUND,
    FEAST_NULL,
    FEAST_PRESENT,
    MAKERS,
    STATUS,
    Response,
    encode_rows,
    entity_id,
    entity_text,
    float32_column,
    text_of,
)
from feature_store.feast.mapping import (
    DEFAULT_ENTITY_TTL,
    rows_to_columns,
)
from feature_store.feast.plans import Layout, Plan, ViewMap, entity_ids, layout_of, make_plan
from feature_store.ingest.spec import RetrySpec
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import feature_field, freshness_field
from feature_store.registry import Registry
from feature_store.settings import target_from_env
from feature_store.store import read_plans

log = logging.getLogger(__name__)

NAME: Final = "feature_store.feast.online_store.FeatureStoreRedisOnlineStore"


class FeatureStoreRedisOnlineStoreConfig(FeastConfigBaseModel):
    """The plugin's settings in ``feature_store.yaml``."""

    # Feast finds the store by this dotted name, and the config class by its name + Config
    type: Literal[
        "feature_store.feast.online_store.FeatureStoreRedisOnlineStore",
        "feature_store.feast_redis.FeatureStoreRedisOnlineStore",  # earlier releases' path
    ] = NAME
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


# entity -> key prefix, chosen once per Redis; '{' starts no entity key (prefixes exclude it)
PINS_KEY = "{feature_store}:feast:prefixes"
SCAN_COUNT = 1000
DELETE_CHUNK = 500
PLANS_MAX = 1024  # request shapes remembered per mapping
WRITE_CHUNK = 500  # entities per write pipeline, as the nightly job's
BAD_SHOWN = 5  # rows that do not encode, named in the error


# --- the store -------------------------------------------------------------------------------


@dataclass
class _Cached:
    layout: Layout
    made: float
    plans: dict[tuple[object, ...], Plan | None]


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
        return {text_of(k): text_of(v) for k, v in found.items()}

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
        plan: Plan,
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
            ids = entity_ids(columns[wanted.join_key], etype.id_type, wanted.join_key)
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
                column = float32_column(column)
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
        ids = [entity_id(key, entity.join_key, entity.id_type) for key in entity_keys]
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
                        value = float32_column([value])[0]
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
                f"row {b.index} ({entity_text(data[b.index][0])}): {b.detail}"
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
