"""Feast's definitions as this project's layout (``layout_of``), and a request's read
worked out once per shape (``make_plan``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from feast import Entity, FeatureService, FeatureView
from feast.protos.feast.types.Value_pb2 import (
    Value,
)
from feast.value_type import ValueType

from feature_store.batch import (
    EntityId,
)
from feature_store.errors import RegistryError, RequestError
from feature_store.feast.mapping import (
    feature_type,
    to_registry,
)
from feature_store.layout import IdType
from feature_store.registry import FeatureGroup, Registry, load_registry, parse_registry

# --- the mapping -----------------------------------------------------------------------------


class LayoutSettings(Protocol):
    """What the layout takes of the plugin's settings (``FeatureStoreRedisOnlineStoreConfig``)."""

    registry: str | None  # this project's registry YAML, used instead of the derived one
    entity_ttl: str


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
    config: LayoutSettings,
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


# --- reads -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntityRead:
    entity: str  # this project's entity type
    join_key: str
    features: tuple[str, ...]  # "group:feature", for plan_read


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # as answered
    read: int  # index into Plan.reads
    feature: int  # index into that read's features
    kind: ValueType


@dataclass(frozen=True, slots=True)
class Plan:
    """What one shape of request reads and answers, worked out once."""

    join_keys: tuple[tuple[str, ValueType], ...]  # the join key columns answered first
    reads: tuple[EntityRead, ...]
    columns: tuple[Column, ...]


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
) -> Plan | None:
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
    return Plan(
        join_keys=tuple((k, layout.id_types[k]) for k in row_keys if k in used_keys),
        reads=tuple(EntityRead(e, reads[e][0], tuple(reads[e][1])) for e in order),
        columns=tuple(Column(n, order.index(e), i, kind) for n, e, i, kind in columns),
    )


def entity_ids(values: Iterable[Any], id_type: IdType, join_key: str) -> list[EntityId]:
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
