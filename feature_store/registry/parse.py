"""Loading a registry from YAML: every error names the file and the offending entry, e.g.
``features.yaml: feature_groups.consumer.features.emb: unknown type 'embeding(32)'``.
The checks are small and specific (xxh32 collisions, names, durations, windows), so they
are written out here rather than in a schema library whose messages would need
translating anyway."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import yaml

from feature_store.errors import EncodingError, RegistryError
from feature_store.layout import (
    PREFIX_PATTERN,
    RESERVED_NAME_PREFIX,
    IdType,
    feature_field,
    freshness_field,
    windows_field,
)
from feature_store.registry.lock import check_against_lock, default_lock_path
from feature_store.registry.model import (
    DEFAULT_LATENESS,
    DEFAULT_TILE,
    FEATURE_NAME_PATTERN,
    MAX_DURATION,
    MAX_LAST_N,
    MAX_TILES,
    NAME_PATTERN,
    Aggregate,
    Aggregation,
    EntityType,
    Feature,
    FeatureGroup,
    Function,
    Registry,
)
from feature_store.serialization import Codec, FeatureType, codec_for

TYPE_PATTERN = re.compile(r"^\s*([a-z_0-9]+)\s*(?:\(\s*(\d+)\s*\))?\s*$")
DURATION_PATTERN = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# what each function answers (last_n: the list type the registry gives, int_list by default)
_ANSWERS = {
    Function.COUNT: "int",
    Function.SUM: "double",
    Function.MEAN: "double",
    Function.MIN: "double",
    Function.MAX: "double",
}


def parse_duration(value: object, where: str) -> int:
    """Seconds from an int or a string like ``90``, ``45s``, ``30m``, ``36h``, ``7d``, ``2w``."""
    if isinstance(value, bool):
        raise RegistryError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, int):
        seconds = value
    else:
        m = DURATION_PATTERN.match(str(value))
        if not m:
            raise RegistryError(
                f"{where}: {value!r} is not a duration (use seconds, or e.g. 30m, 36h, 7d)"
            )
        if len(m.group(1)) > 15:
            raise RegistryError(f"{where}: {value!r} is longer than the limit of 100 years")
        seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise RegistryError(f"{where}: duration must be positive, got {value!r}")
    if seconds > MAX_DURATION:
        # Redis refuses an EXPIRE this long, and only after the values are written
        raise RegistryError(
            f"{where}: {value!r} is longer than the limit of {MAX_DURATION} s (100 years)"
        )
    return seconds


def parse_type(value: object, where: str) -> Codec:
    """A codec from ``float``, ``embedding(32)`` or ``{type: embedding, dim: 32}``."""
    dim: object = None
    if isinstance(value, Mapping):
        _check_keys(value, {"type", "dim", "description"}, where)
        dim, value = value.get("dim"), value.get("type")
    m = TYPE_PATTERN.match(value) if isinstance(value, str) else None
    known = ", ".join(t.value for t in FeatureType)
    if m is None:
        raise RegistryError(f"{where}: unknown type {value!r}; expected one of {known}")
    try:
        type_ = FeatureType(m.group(1))
    except ValueError:
        raise RegistryError(
            f"{where}: unknown type {value!r}; expected one of {known} (embedding needs (dim))"
        ) from None
    if m.group(2) is not None:
        if dim is not None:
            raise RegistryError(f"{where}: dimension given twice")
        if len(m.group(2)) > 9:
            raise RegistryError(f"{where}: embedding dimension must be 1..65536")
        dim = int(m.group(2))
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)):
        raise RegistryError(f"{where}: dim must be an integer, got {dim!r}")
    if type_ is FeatureType.EMBEDDING and dim is None:
        raise RegistryError(f"{where}: an embedding needs a dimension, e.g. embedding(32)")
    if type_ is FeatureType.EMBEDDING and isinstance(dim, int) and not 1 <= dim <= 65536:
        raise RegistryError(f"{where}: embedding dimension must be 1..65536, got {dim}")
    try:
        return codec_for(type_, dim)
    except EncodingError as e:
        raise RegistryError(f"{where}: {e}") from None


def load_registry(
    path: str | Path, lock_path: str | Path | None = None, *, check_lock: bool = True
) -> Registry:
    """Load and validate a registry file, and check it against its lock file if one exists."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise RegistryError(f"{path}: cannot read the registry: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise RegistryError(
            f"{path}: line {line}: not UTF-8 (byte {data[e.start : e.start + 1]!r} at "
            f"offset {e.start}); save the registry as UTF-8"
        ) from None
    registry = parse_registry(text, source=str(path))
    lock = Path(lock_path) if lock_path is not None else default_lock_path(path)
    if check_lock and lock.exists():
        check_against_lock(registry, lock)
    return registry


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing what it would take silently: a key given twice in one
    mapping (the last would win: a feature declared twice, a group's features dropped), and
    integers too long for Python to convert."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, yaml.Node] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                first = seen.get(key) if isinstance(key, str | int) else None
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        f"{key!r} is given twice in one mapping, first",
                        first.start_mark,
                        "and again",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return dict(super().construct_mapping(node, deep))

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, "this number is too long", node.start_mark
            ) from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def parse_registry(text: str, source: str = "<registry>") -> Registry:
    try:
        stream = io.StringIO(text)
        stream.name = source  # how YAML's error marks name the file
        doc = yaml.load(stream, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        raise RegistryError(f"{source}: not valid YAML: {e}") from None
    return _Builder(source).build(doc)


class _Builder:
    """Validates a parsed YAML document into a Registry, raising at the first bad entry."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, where: str, message: str) -> RegistryError:
        return RegistryError(f"{self.source}: {where}: {message}")

    def mapping(self, value: object, where: str) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            raise self.error(where, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                raise self.error(where, f"key {k!r} is not a string")
        return value

    def build(self, doc: object) -> Registry:
        if doc is None:
            raise RegistryError(f"{self.source}: the registry is empty")
        top = self.mapping(doc, "top level")
        _check_keys(
            top,
            {"version", "entities", "feature_groups", "feature_services"},
            f"{self.source}: top level",
        )
        if top.get("version", 1) != 1:
            raise self.error("version", f"unsupported version {top['version']!r}; expected 1")
        entities = self.entities(top.get("entities"))
        groups = self.groups(top.get("feature_groups"), entities)
        by_entity: dict[str, dict[str, Feature]] = {name: {} for name in entities}
        for g in groups.values():
            for f in g.features:
                by_entity[g.entity.name][f.name] = f
        self.check_collisions(groups)
        self.check_push_sources(groups)
        return Registry(
            source=self.source,
            entities=MappingProxyType(entities),
            groups=MappingProxyType(groups),
            _by_entity=MappingProxyType({k: MappingProxyType(v) for k, v in by_entity.items()}),
            services=MappingProxyType(self.services(top.get("feature_services"), groups)),
        )

    def entities(self, raw: object) -> dict[str, EntityType]:
        if raw is None:
            raise self.error("entities", "missing; declare at least one entity type")
        out: dict[str, EntityType] = {}
        prefixes: dict[str, str] = {}
        join_keys: dict[str, str] = {}
        for name, spec in self.mapping(raw, "entities").items():
            where = f"entities.{name}"
            if not NAME_PATTERN.match(name):
                raise self.error(where, "name must be an identifier of at most 128 characters")
            spec = self.mapping(spec, where)
            _check_keys(
                spec,
                {"prefix", "id_type", "ttl", "description", "join_key"},
                f"{self.source}: {where}",
            )
            for required in ("prefix", "id_type", "ttl"):
                if required not in spec:
                    raise self.error(where, f"missing {required!r}")
            prefix = spec["prefix"]
            if not isinstance(prefix, str) or not PREFIX_PATTERN.match(prefix):
                raise self.error(
                    f"{where}.prefix",
                    f"{prefix!r} must be 1-32 characters of letters, digits, '_', '.', '-'",
                )
            if prefix in prefixes:
                raise self.error(
                    f"{where}.prefix", f"{prefix!r} is already the prefix of {prefixes[prefix]!r}"
                )
            prefixes[prefix] = name
            try:
                id_type = IdType(str(spec["id_type"]))
            except ValueError:
                raise self.error(
                    f"{where}.id_type", f"{spec['id_type']!r} is not one of int, string"
                ) from None
            ttl = parse_duration(spec["ttl"], f"{self.source}: {where}.ttl")
            join_key = spec.get("join_key", name)
            if not isinstance(join_key, str) or not NAME_PATTERN.match(join_key):
                raise self.error(
                    f"{where}.join_key",
                    f"{join_key!r} must be an identifier of at most 128 characters",
                )
            if join_key in join_keys:
                raise self.error(
                    f"{where}.join_key",
                    f"{join_key!r} is already the join key of {join_keys[join_key]!r}; "
                    "a Feast-shaped request names the entity type by it",
                )
            join_keys[join_key] = name
            out[name] = EntityType(
                name, prefix, id_type, ttl, str(spec.get("description", "")), join_key
            )
        if not out:
            raise self.error("entities", "declare at least one entity type")
        return out

    def groups(self, raw: object, entities: Mapping[str, EntityType]) -> dict[str, FeatureGroup]:
        if raw is None:
            raise self.error("feature_groups", "missing; declare at least one feature group")
        out: dict[str, FeatureGroup] = {}
        owner: dict[tuple[str, str], str] = {}  # (entity, feature) -> group
        for name, spec in self.mapping(raw, "feature_groups").items():
            where = f"feature_groups.{name}"
            if not NAME_PATTERN.match(name):
                raise self.error(where, "name must be an identifier of at most 128 characters")
            spec = self.mapping(spec, where)
            _check_keys(
                spec,
                {"entity", "features", "aggregations", "max_age", "description", "push_source"},
                f"{self.source}: {where}",
            )
            push_source = spec.get("push_source", "")
            if not isinstance(push_source, str) or (
                push_source and not NAME_PATTERN.match(push_source)
            ):
                raise self.error(
                    f"{where}.push_source",
                    f"{push_source!r} must be an identifier of at most 128 characters",
                )
            entity = entities.get(str(spec.get("entity")))
            if entity is None:
                raise self.error(
                    f"{where}.entity",
                    f"{spec.get('entity')!r} is not a declared entity type "
                    f"({', '.join(sorted(entities))})",
                )
            max_age = spec.get("max_age")
            max_age_s = (
                None
                if max_age is None
                else parse_duration(max_age, f"{self.source}: {where}.max_age")
            )
            aggregation = None
            raw_features: Mapping[str, object]
            if "aggregations" in spec:
                if "features" in spec:
                    raise self.error(
                        where,
                        "a group declares either 'features' (stored values) or "
                        "'aggregations' (computed from events), not both",
                    )
                aggregation, raw_features = self.aggregation(
                    spec["aggregations"], f"{where}.aggregations"
                )
                fwhere_base = f"{where}.aggregations.features"
            else:
                raw_features = self.mapping(spec.get("features"), f"{where}.features")
                fwhere_base = f"{where}.features"
            if not raw_features:
                raise self.error(fwhere_base, "declare at least one feature")
            features = []
            for fname, ftype in raw_features.items():
                fwhere = f"{fwhere_base}.{fname}"
                if not FEATURE_NAME_PATTERN.match(fname) or fname.startswith(RESERVED_NAME_PREFIX):
                    raise self.error(
                        fwhere,
                        "name must start with a letter or one '_', and hold only letters, "
                        "digits, '_' and '.' (at most 128)",
                    )
                if (entity.name, fname) in owner:
                    raise self.error(
                        fwhere,
                        f"feature {fname!r} is already declared for entity type "
                        f"{entity.name!r} in group {owner[entity.name, fname]!r}; "
                        "names are unique per entity type because its groups share one hash",
                    )
                owner[entity.name, fname] = name
                codec = parse_type(ftype, f"{self.source}: {fwhere}")
                desc = ftype.get("description", "") if isinstance(ftype, Mapping) else ""
                features.append(
                    Feature(fname, name, entity.name, codec, feature_field(fname), str(desc))
                )
            out[name] = FeatureGroup(
                name=name,
                entity=entity,
                features=tuple(features),
                max_age_seconds=max_age_s,
                freshness_field=freshness_field(name),
                description=str(spec.get("description", "")),
                push_source=push_source,
                aggregation=aggregation,
                windows_field=windows_field(name) if aggregation is not None else b"",
            )
        if not out:
            raise self.error("feature_groups", "declare at least one feature group")
        return out

    def aggregation(
        self, raw: object, where: str
    ) -> tuple[Aggregation, dict[str, Mapping[str, object]]]:
        """A group's ``aggregations``: its tiles, lateness and aggregates, and each
        feature's type (what its function answers) for the group's features."""
        spec = self.mapping(raw, where)
        _check_keys(spec, {"tile", "allowed_lateness", "features"}, f"{self.source}: {where}")
        raw_features = self.mapping(spec.get("features"), f"{where}.features")
        windows: list[tuple[str, int]] = []
        parsed: list[tuple[str, Mapping[str, object], Function]] = []
        for fname, fspec in raw_features.items():
            fwhere = f"{where}.features.{fname}"
            fspec = self.mapping(fspec, fwhere)
            _check_keys(
                fspec,
                {"function", "of", "window", "n", "type", "description"},
                f"{self.source}: {fwhere}",
            )
            try:
                function = Function(str(fspec.get("function")))
            except ValueError:
                known = ", ".join(f.value for f in Function)
                raise self.error(
                    f"{fwhere}.function", f"{fspec.get('function')!r} is not one of {known}"
                ) from None
            if "window" not in fspec:
                raise self.error(fwhere, "missing 'window' (e.g. 1h, 1d, 7d)")
            windows.append(
                (fwhere, parse_duration(fspec["window"], f"{self.source}: {fwhere}.window"))
            )
            parsed.append((fname, fspec, function))
        tile = (
            parse_duration(spec["tile"], f"{self.source}: {where}.tile")
            if "tile" in spec
            else math.gcd(DEFAULT_TILE, *(w for _, w in windows))
        )
        lateness = (
            parse_duration(spec["allowed_lateness"], f"{self.source}: {where}.allowed_lateness")
            if "allowed_lateness" in spec
            else DEFAULT_LATENESS
        )
        aggregates: list[Aggregate] = []
        types: dict[str, Mapping[str, object]] = {}
        for (fname, fspec, function), (fwhere, window) in zip(parsed, windows, strict=True):
            if window % tile:
                raise self.error(
                    f"{fwhere}.window", f"{window} s is not a multiple of the tile ({tile} s)"
                )
            if window // tile > MAX_TILES:
                raise self.error(
                    f"{fwhere}.window",
                    f"{window // tile} tiles of {tile} s; at most {MAX_TILES} (use a longer tile)",
                )
            of = fspec.get("of")
            if of is None and function is not Function.COUNT:
                raise self.error(fwhere, f"{function.value} needs 'of': the record field it reads")
            if of is not None and (not isinstance(of, str) or not FEATURE_NAME_PATTERN.match(of)):
                raise self.error(f"{fwhere}.of", f"{of!r} is not a record field name")
            n = fspec.get("n")
            if function is Function.LAST_N:
                if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LAST_N:
                    raise self.error(
                        f"{fwhere}.n", f"must be an integer 1..{MAX_LAST_N}, got {n!r}"
                    )
            elif n is not None:
                raise self.error(f"{fwhere}.n", "only last_n takes 'n'")
            type_ = fspec.get("type")
            if type_ is not None and function is not Function.LAST_N:
                raise self.error(
                    f"{fwhere}.type",
                    f"{function.value} answers {_ANSWERS[function]}; only "
                    "last_n takes a type (int_list or float_list)",
                )
            if function is Function.LAST_N:
                type_ = type_ or "int_list"
                if type_ not in ("int_list", "float_list"):
                    raise self.error(
                        f"{fwhere}.type", f"{type_!r}: last_n answers int_list or float_list"
                    )
            else:
                type_ = _ANSWERS[function]
            aggregates.append(Aggregate(function, of, window, n if isinstance(n, int) else 0))
            types[fname] = {"type": type_, "description": fspec.get("description", "")}
        aggregation = Aggregation(tile, lateness, tuple(aggregates))
        return aggregation, types

    def check_collisions(self, groups: Mapping[str, FeatureGroup]) -> None:
        seen: dict[tuple[str, bytes], str] = {}
        for g in groups.values():
            entries = [(f.field, f"feature_groups.{g.name}.features.{f.name}") for f in g.features]
            entries.append((g.freshness_field, f"feature_groups.{g.name} (its freshness field)"))
            if g.windows_field:
                entries.append((g.windows_field, f"feature_groups.{g.name} (its tiles' field)"))
            for fld, where in entries:
                other = seen.setdefault((g.entity.name, fld), where)
                if other != where:
                    raise self.error(
                        where,
                        f"its xxHash32 field {fld.hex()} collides with {other} in entity type "
                        f"{g.entity.name!r}; rename one of them",
                    )

    def check_push_sources(self, groups: Mapping[str, FeatureGroup]) -> None:
        """A push source feeds groups of one entity type (one id column in the pushed rows)."""
        entity_of: dict[str, tuple[str, str]] = {}  # source -> (entity, first group)
        for g in groups.values():
            if not g.push_source:
                continue
            first = entity_of.setdefault(g.push_source, (g.entity.name, g.name))
            if first[0] != g.entity.name:
                raise self.error(
                    f"feature_groups.{g.name}.push_source",
                    f"{g.push_source!r} also feeds {first[1]!r} of entity type {first[0]!r}; "
                    "a push source feeds groups of one entity type",
                )

    def services(
        self, raw: object, groups: Mapping[str, FeatureGroup]
    ) -> dict[str, tuple[str, ...]]:
        """``feature_services``: name -> list of ``group:feature`` or ``group`` references."""
        if raw is None:
            return {}
        out: dict[str, tuple[str, ...]] = {}
        for name, refs in self.mapping(raw, "feature_services").items():
            where = f"feature_services.{name}"
            if not NAME_PATTERN.match(name):
                raise self.error(where, "name must be an identifier of at most 128 characters")
            if not isinstance(refs, list) or not refs:
                raise self.error(where, "must be a non-empty list of 'group:feature' or 'group'")
            for i, ref in enumerate(refs):
                group_name, _, feature = str(ref).partition(":")
                group = groups.get(group_name)
                if not isinstance(ref, str) or group is None:
                    raise self.error(f"{where}[{i}]", f"{ref!r} names no declared feature group")
                if feature and all(f.name != feature for f in group.features):
                    raise self.error(
                        f"{where}[{i}]", f"feature group {group_name!r} has no feature {feature!r}"
                    )
            out[name] = tuple(refs)
        return out


def _check_keys(spec: Mapping[str, object], allowed: set[str], where: str) -> None:
    extra = sorted(set(spec) - allowed)
    if extra:
        raise RegistryError(
            f"{where}: unknown key(s) {', '.join(map(repr, extra))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
