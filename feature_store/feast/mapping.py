"""Feast's definitions as this project's registry: the mapping ``feature-store
import-feast`` writes and the online store plugin (``feature_store.feast.online_store``) uses.

Given Feast's objects (read by Feast's SDK from a repository's registry), it maps:

    Feast                               registry
    Entity (one join key; Int32/Int64   entity type (join_key; id_type int or string;
      or String ids)                      prefix: the shortest unique start of its name)
    FeatureView / StreamFeatureView     feature group (one entity; ttl -> max_age)
    Float32 / Float64                   float / double
    Int32 / Int64                       int
    Bool / String                       bool / string
    Array(Float32), vector_length N     embedding(N); without a length: float_list
    Array(Int32) / Array(Int64)         int_list
    PushSource of a view                the group's push_source
    FeatureService                      feature_services

Everything else is refused, each entry named with the reason: other types (Bytes,
UnixTimestamp, Json, Map, Struct, sets, arrays of strings, bools or Float64), views of
several entities or none, on-demand feature views, and a
feature name used by two views of one entity type (this store keeps an entity's features
in one hash, so names are unique per entity type). The result is loaded back with
``parse_registry`` before it is written, so the file always loads.

Feast's objects are only read here (their types, for type checking); this module does not
import Feast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import yaml

from feature_store.errors import RegistryError
from feature_store.layout import PREFIX_PATTERN
from feature_store.registry import (
    FEATURE_NAME_PATTERN,
    NAME_PATTERN,
    parse_duration,
    parse_registry,
)

if TYPE_CHECKING:
    from feast import Entity, FeatureService, FeatureView, OnDemandFeatureView

SCALARS = {
    "Float32": "float",
    "Float64": "double",
    "Int32": "int",
    "Int64": "int",
    "Bool": "bool",
    "String": "string",
}
INT_IDS = {"INT32", "INT64"}
STRING_IDS = {"STRING"}
DEFAULT_ENTITY_TTL = "7d"
PREFIX_TAG = "feature_store_prefix"  # an entity's tag that sets its key prefix


@dataclass
class Imported:
    """What the import builds, and every entry it cannot map."""

    entities: dict[str, dict[str, object]] = field(default_factory=dict)
    groups: dict[str, dict[str, object]] = field(default_factory=dict)
    services: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def feature_type(dtype: object, vector_length: int) -> str | None:
    """This project's type of a Feast field type, or None where there is none."""
    name = str(dtype)
    if name in SCALARS:
        return SCALARS[name]
    if name == "Array(Float32)":
        return f"embedding({vector_length})" if vector_length > 0 else "float_list"
    if name in ("Array(Int32)", "Array(Int64)"):
        return "int_list"
    return None


def _why_not(dtype: object) -> str:
    name = str(dtype)
    if name == "Array(Float64)":
        return (
            "type Array(Float64) has no counterpart: float lists and embeddings hold float32 "
            "(declare the field Array(Float32) if float32 is precise enough)"
        )
    return (
        f"type {name} has no counterpart (supported: Float32, Float64, Int32, Int64, Bool, "
        "String, Array(Float32), Array(Int32), Array(Int64))"
    )


def short_prefixes(names: Sequence[str], pinned: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each name's shortest start that no other name shares (``consumer`` -> ``c``).

    ``pinned`` names keep the prefix given (one chosen earlier, or an entity's
    ``feature_store_prefix`` tag): adding an entity never moves another's keys."""
    out: dict[str, str] = {n: p for n, p in (pinned or {}).items() if n in names}
    for name in names:
        if name in out:
            continue
        for n in range(1, len(name) + 1):
            start = name[:n]
            if (
                not any(o != name and o.startswith(start) for o in names)
                and start not in out.values()
            ):
                out[name] = start[:32]
                break
        else:
            out[name] = name[:32]
    return out


def to_registry(
    entities: Sequence[Entity],
    views: Sequence[FeatureView],
    services: Sequence[FeatureService] = (),
    on_demand: Sequence[OnDemandFeatureView] = (),
    *,
    entity_ttl: str = DEFAULT_ENTITY_TTL,
    source: str = "<feast>",
    prefixes: Mapping[str, str] | None = None,
) -> str:
    """The registry YAML of Feast's definitions; RegistryError listing every entry that
    does not map. ``prefixes``: entity -> key prefix chosen before (kept); an entity's
    tag ``feature_store_prefix`` comes first."""
    m = Imported()
    min_ttl = parse_duration(entity_ttl, "--entity-ttl")
    by_name = {e.name: e for e in entities}
    used: set[str] = set()
    for view in views:
        _view(m, view, by_name, used)
    for odfv in on_demand:
        m.problems.append(
            f"on_demand_feature_views.{odfv.name}: computed at request time by Python "
            "transformations, which this store does not run; compute it in the writer"
        )
    pinned = dict(prefixes or {})
    for name in used:
        tag = (by_name[name].tags or {}).get(PREFIX_TAG)
        if tag:
            if not PREFIX_PATTERN.match(tag):
                m.problems.append(
                    f"entities.{name}: tag {PREFIX_TAG}={tag!r} is not a key prefix "
                    "(at most 32 letters, digits, '_', '.' or '-')"
                )
            pinned[name] = tag
    taken: dict[str, str] = {}
    for name in sorted(used):
        if name in pinned and pinned[name] in taken:
            m.problems.append(
                f"entities.{name}: key prefix {pinned[name]!r} is also entity "
                f"{taken[pinned[name]]!r}'s"
            )
        if name in pinned:
            taken[pinned[name]] = name
    prefixes = short_prefixes(sorted(used), pinned)
    for name in sorted(used):
        entity = by_name[name]
        join_key = entity.join_key
        id_type = _id_type(m, entity, views)
        ttls = [
            int(g["max_age"])  # type: ignore[call-overload]
            for g in m.groups.values()
            if g["entity"] == name and g.get("max_age")
        ]
        spec: dict[str, object] = {
            "prefix": prefixes[name],
            "join_key": join_key,
            "id_type": id_type,
            "ttl": max([min_ttl, *ttls]),
        }
        if entity.description:
            spec["description"] = entity.description
        m.entities[name] = spec
    for service in services:
        refs = []
        for projection in service.feature_view_projections:
            view_name = projection.name_alias or projection.name
            if view_name not in m.groups:
                m.problems.append(
                    f"feature_services.{service.name}: its view {view_name!r} is not imported"
                    + (" (see above)" if any(view_name in p for p in m.problems) else "")
                )
                continue
            refs += [f"{view_name}:{f.name}" for f in projection.features]
        m.services[service.name] = refs
    if m.problems:
        raise RegistryError(
            f"{source}: {len(m.problems)} Feast definition(s) cannot be mapped:\n  "
            + "\n  ".join(m.problems)
        )
    if not m.groups:
        raise RegistryError(
            f"{source}: no feature views; run 'feast apply' in the repository first"
        )
    doc: dict[str, object] = {"version": 1, "entities": m.entities, "feature_groups": m.groups}
    if m.services:
        doc["feature_services"] = m.services
    text = f"# imported from the Feast repository {source}\n" + yaml.safe_dump(
        doc, sort_keys=False, width=100
    )
    parse_registry(text, source)  # the file must load: collisions and names are checked
    return text


def _view(m: Imported, view: FeatureView, entities: dict[str, Entity], used: set[str]) -> None:
    where = f"feature_views.{view.name}"
    if not NAME_PATTERN.match(view.name):
        m.problems.append(f"{where}: the name must be an identifier of at most 128 characters")
        return
    names = [e for e in view.entities if e != "__dummy"]
    if len(names) != 1:
        m.problems.append(
            f"{where}: has {len(names)} entities ({', '.join(names) or 'none'}); a feature "
            "group belongs to exactly one entity type"
        )
        return
    entity = entities.get(names[0])
    if entity is None:
        m.problems.append(f"{where}: its entity {names[0]!r} is not in the registry")
        return
    features: dict[str, str] = {}
    taken = {
        str(f): g
        for g, spec in m.groups.items()
        if spec["entity"] == entity.name
        for f in spec["features"]  # type: ignore[attr-defined]
    }
    for f in view.features:
        fwhere = f"{where}.features.{f.name}"
        kind = feature_type(f.dtype, int(getattr(f, "vector_length", 0) or 0))
        if kind is None:
            m.problems.append(f"{fwhere}: {_why_not(f.dtype)}")
        elif not FEATURE_NAME_PATTERN.match(f.name):
            m.problems.append(f"{fwhere}: the name must be letters, digits, '_' and '.'")
        elif f.name in taken:
            m.problems.append(
                f"{fwhere}: feature_views.{taken[f.name]} of the same entity "
                f"{entity.name!r} has a feature of this name; names are unique per entity "
                "type here (one hash per entity): rename one"
            )
        else:
            features[f.name] = kind
    spec: dict[str, object] = {"entity": entity.name}
    ttl = int(view.ttl.total_seconds()) if view.ttl else 0
    if ttl > 0:
        spec["max_age"] = ttl
    stream = getattr(view, "stream_source", None)
    if stream is not None and type(stream).__name__ == "PushSource":
        spec["push_source"] = stream.name
    if view.description:
        spec["description"] = view.description
    spec["features"] = features
    m.groups[view.name] = spec
    used.add(entity.name)


def _id_type(m: Imported, entity: Entity, views: Sequence[FeatureView]) -> str:
    kind = entity.value_type.name
    if kind == "UNKNOWN":  # not declared: Feast infers it from the views' entity columns
        for view in views:
            for column in view.entity_columns:
                if column.name == entity.join_key:
                    kind = {"Int32": "INT32", "Int64": "INT64", "String": "STRING"}.get(
                        str(column.dtype), str(column.dtype)
                    )
    if kind in INT_IDS:
        return "int"
    if kind in STRING_IDS:
        return "string"
    m.problems.append(
        f"entities.{entity.name}: ids of type {kind} have no counterpart (int or string)"
    )
    return "int"


def rows_to_columns(rows: Sequence[Mapping[str, object]]) -> dict[str, list[object]]:
    """Feast's entity rows (a list of dicts) as its columnar form (name -> values)."""
    columns: dict[str, list[object]] = {k: [] for k in rows[0]}
    for row in rows:
        for key, value in row.items():
            try:
                columns[key].append(value)
            except KeyError:
                raise ValueError("All entity_rows must have the same keys.") from None
    return columns
