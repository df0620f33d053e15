"""Registry loading: every malformed entry is named, collisions and type changes refused."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import xxhash

from feature_store import sample
from feature_store.errors import RegistryError, RegistryLockError, RequestError
from feature_store.layout import IdType, freshness_field
from feature_store.registry import (
    default_lock_path,
    load_registry,
    parse_registry,
    write_lock,
)
from feature_store.serialization import FeatureType, field_name

GOOD = """
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d}
  store: {prefix: s, id_type: string, ttl: 3600}
feature_groups:
  consumer_daily:
    entity: consumer
    max_age: 36h
    features:
      avg_order_value: float
      orders_7d: int
      cuisine_embedding: embedding(16)
      recent_stores: {type: int_list, description: last stores ordered from}
  consumer_realtime:
    entity: consumer
    features:
      is_active: bool
      last_search: string
  store_daily:
    entity: store
    features:
      rating: double
      prep_times: float_list
"""


def test_a_valid_registry_loads_into_typed_objects() -> None:
    reg = parse_registry(GOOD, source="features.yaml")
    consumer = reg.entity("consumer")
    assert (consumer.prefix, consumer.id_type, consumer.ttl_seconds) == ("c", IdType.INT, 604800)
    assert reg.entity("store").id_type is IdType.STRING
    daily = reg.group("consumer_daily")
    assert daily.max_age_seconds == 36 * 3600
    assert daily.freshness_field == freshness_field("consumer_daily")
    emb = daily.feature("cuisine_embedding")
    assert (emb.type, emb.dim, emb.field) == (
        FeatureType.EMBEDDING,
        16,
        field_name("cuisine_embedding"),
    )
    assert daily.feature("recent_stores").description == "last stores ordered from"
    assert reg.group("consumer_realtime").max_age_seconds is None
    assert set(reg.features_of("consumer")) == {
        "avg_order_value",
        "orders_7d",
        "cuisine_embedding",
        "recent_stores",
        "is_active",
        "last_search",
    }


def test_field_is_xxh32_of_the_name() -> None:
    assert field_name("avg_order_value") == xxhash.xxh32(b"avg_order_value").digest()
    assert len(field_name("x")) == 4


def test_registry_objects_are_frozen() -> None:
    reg = parse_registry(GOOD)
    with pytest.raises(AttributeError):
        reg.entity("consumer").prefix = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        reg.groups["x"] = reg.group("consumer_daily")  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the registry is empty"),
        ("[1, 2]", "top level: expected a mapping"),
        ("entities: {}\nfeature_groups: {}\nextra: 1", "unknown key(s) 'extra'"),
        ("feature_groups: {}", "entities: missing"),
        (
            "entities:\n  c: {prefix: c, id_type: uuid, ttl: 1d}\nfeature_groups: {}",
            "entities.c.id_type: 'uuid' is not one of int, string",
        ),
        (
            "entities:\n  c: {prefix: 'a:b', id_type: int, ttl: 1d}\nfeature_groups: {}",
            "entities.c.prefix: 'a:b' must be",
        ),
        (
            "entities:\n  c: {prefix: c, id_type: int}\nfeature_groups: {}",
            "entities.c: missing 'ttl'",
        ),
        (
            "entities:\n  c: {prefix: c, id_type: int, ttl: soon}\nfeature_groups: {}",
            "entities.c.ttl: 'soon' is not a duration",
        ),
        (
            "entities:\n  c: {prefix: c, id_type: int, ttl: 0}\nfeature_groups: {}",
            "entities.c.ttl: duration must be positive",
        ),
        (
            "entities:\n  a: {prefix: x, id_type: int, ttl: 1}\n"
            "  b: {prefix: x, id_type: int, ttl: 1}\nfeature_groups: {}",
            "entities.b.prefix: 'x' is already the prefix of 'a'",
        ),
        (
            "entities:\n  c: {prefix: c, id_type: int, ttl: 1d, color: red}\nfeature_groups: {}",
            "entities.c: unknown key(s) 'color'",
        ),
    ],
)
def test_malformed_entities_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(RegistryError) as info:
        parse_registry(text, source="features.yaml")
    assert str(info.value).startswith("features.yaml")
    assert message in str(info.value)


ENTITY = "entities:\n  c: {prefix: c, id_type: int, ttl: 1d}\n"


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ("feature_groups:\n  g: {entity: nope, features: {a: float}}", "feature_groups.g.entity"),
        ("feature_groups:\n  g: {entity: c, features: {}}", "g.features: declare at least one"),
        (
            "feature_groups:\n  g: {entity: c, features: {a: flaot}}",
            "feature_groups.g.features.a: unknown type 'flaot'",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {a: embedding}}",
            "feature_groups.g.features.a: an embedding needs a dimension",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {a: 'embedding(0)'}}",
            "embedding dimension must be 1..65536",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {a: 'int(3)'}}",
            "feature_groups.g.features.a: type int takes no dimension",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {__x: float}}",
            "feature_groups.g.features.__x: name must start",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {'a b': float}}",
            "feature_groups.g.features.a b: name must start",
        ),
        (
            "feature_groups:\n  g: {entity: c, max_age: -1, features: {a: float}}",
            "feature_groups.g.max_age",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {a: float}}\n"
            "  h: {entity: c, features: {a: int}}",
            "feature_groups.h.features.a: feature 'a' is already declared for entity type 'c' "
            "in group 'g'",
        ),
        (
            "feature_groups:\n  g: {entity: c, features: {a: {type: float, unit: s}}}",
            "feature_groups.g.features.a: unknown key(s) 'unit'",
        ),
    ],
)
def test_malformed_groups_name_the_entry(groups: str, message: str) -> None:
    with pytest.raises(RegistryError) as info:
        parse_registry(ENTITY + groups, source="features.yaml")
    assert message in str(info.value)


def test_invalid_yaml_names_the_file() -> None:
    with pytest.raises(RegistryError, match=r"^features.yaml: not valid YAML"):
        parse_registry("entities: [", source="features.yaml")


def test_xxh32_collision_is_refused_at_load() -> None:
    seen: dict[bytes, str] = {}
    pair = None
    for i in range(200_000):
        name = f"f{i}"
        h = field_name(name)
        if h in seen:
            pair = (seen[h], name)
            break
        seen[h] = name
    assert pair is not None, "no collision among 200k names; widen the search"
    a, b = pair
    text = ENTITY + f"feature_groups:\n  g: {{entity: c, features: {{{a}: float, {b}: int}}}}"
    with pytest.raises(RegistryError, match=f"collides with feature_groups.g.features.{a}"):
        parse_registry(text, source="features.yaml")


def test_same_names_in_different_entity_types_do_not_collide() -> None:
    text = (
        "entities:\n  a: {prefix: a, id_type: int, ttl: 1}\n"
        "  b: {prefix: b, id_type: int, ttl: 1}\n"
        "feature_groups:\n  ga: {entity: a, features: {x: float}}\n"
        "  gb: {entity: b, features: {x: int}}"
    )
    reg = parse_registry(text)
    assert reg.features_of("a")["x"].type is FeatureType.FLOAT
    assert reg.features_of("b")["x"].type is FeatureType.INT


def test_resolve_features_and_groups() -> None:
    reg = parse_registry(GOOD)
    names = [f.name for f in reg.resolve("consumer", ["is_active", "consumer_daily:orders_7d"])]
    assert names == ["is_active", "orders_7d"]
    by_group = [f.name for f in reg.resolve("consumer", ["is_active"], ["consumer_realtime"])]
    assert by_group == ["is_active", "last_search"]  # no repeats
    with pytest.raises(RequestError, match="no feature 'nope', feature 'consumer_realtime:orders"):
        reg.resolve("consumer", ["nope", "consumer_realtime:orders_7d"])
    with pytest.raises(RequestError, match="no group 'store_daily'"):
        reg.resolve("consumer", groups=["store_daily"])
    with pytest.raises(RequestError, match="unknown entity type 'user'"):
        reg.resolve("user", ["x"])
    with pytest.raises(RequestError, match="names no features"):
        reg.resolve("consumer")


# --- lock file ---------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_lock_refuses_a_type_change_without_rename(tmp_path: Path) -> None:
    reg_file = write(tmp_path / "features.yaml", GOOD)
    write_lock(load_registry(reg_file), default_lock_path(reg_file))
    assert (tmp_path / "features.lock").exists()

    write(tmp_path / "features.yaml", GOOD.replace("orders_7d: int", "orders_7d: float"))
    with pytest.raises(RegistryLockError) as info:
        load_registry(reg_file)
    message = str(info.value)
    assert "feature_groups.consumer_daily.features.orders_7d: type changed from int to float" in (
        message
    )
    assert "Rename the feature" in message
    assert "features.lock" in message


def test_lock_allows_a_rename_and_new_features(tmp_path: Path) -> None:
    reg_file = write(tmp_path / "features.yaml", GOOD)
    write_lock(load_registry(reg_file), default_lock_path(reg_file))
    write(tmp_path / "features.yaml", GOOD.replace("orders_7d: int", "orders_7d_v2: float"))
    reg = load_registry(reg_file)
    assert "orders_7d_v2" in reg.features_of("consumer")


def test_removed_feature_stays_locked(tmp_path: Path) -> None:
    reg_file = write(tmp_path / "features.yaml", GOOD)
    lock = default_lock_path(reg_file)
    write_lock(load_registry(reg_file), lock)
    write(tmp_path / "features.yaml", GOOD.replace("      orders_7d: int\n", ""))
    write_lock(load_registry(reg_file), lock)  # the feature is gone from the registry...
    write(tmp_path / "features.yaml", GOOD.replace("orders_7d: int", "orders_7d: string"))
    with pytest.raises(RegistryLockError, match="orders_7d: type changed from int to string"):
        load_registry(reg_file)  # ...but coming back with another type is still caught


def test_prefix_change_is_refused_and_accept_changes_records_it(tmp_path: Path) -> None:
    reg_file = write(tmp_path / "features.yaml", GOOD)
    lock = default_lock_path(reg_file)
    write_lock(load_registry(reg_file), lock)
    write(tmp_path / "features.yaml", GOOD.replace("prefix: c,", "prefix: cons,"))
    with pytest.raises(RegistryLockError, match=r"entities\.consumer\.prefix: changed from 'c'"):
        load_registry(reg_file)
    with pytest.raises(RegistryLockError):
        write_lock(load_registry(reg_file, check_lock=False), lock)
    write_lock(load_registry(reg_file, check_lock=False), lock, accept_changes=True)
    assert load_registry(reg_file).entity("consumer").prefix == "cons"


def test_fingerprint_tracks_types_not_descriptions() -> None:
    a = parse_registry(GOOD)
    b = parse_registry(GOOD.replace("description: last stores ordered from", "description: x"))
    c = parse_registry(GOOD.replace("rating: double", "rating: float"))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"missing\.yaml: cannot read"):
        load_registry(tmp_path / "missing.yaml")
    reg_file = write(tmp_path / "features.yaml", GOOD)
    (tmp_path / "features.lock").write_text("{not json")
    with pytest.raises(RegistryLockError, match=r"features\.lock: cannot read the lock file"):
        load_registry(reg_file)


DUPLICATES = [
    ("a feature declared twice", "      int_0: int\n", "      int_0: int\n      int_0: float\n"),
    ("an entity declared twice", "entities:\n", "entities:\n  consumer:\n    prefix: x\n"),
    ("a group declared twice", "feature_groups:\n", "feature_groups:\n  consumer_features: {}\n"),
]


@pytest.mark.parametrize(("what", "old", "new"), DUPLICATES, ids=[d[0] for d in DUPLICATES])
def test_a_key_given_twice_is_refused_naming_both_lines(what: str, old: str, new: str) -> None:
    text = sample.registry_text()
    assert old in text
    with pytest.raises(RegistryError) as raised:
        parse_registry(text.replace(old, new, 1), "features.yaml")
    message = str(raised.value)
    assert "given twice" in message
    assert message.count("features.yaml") >= 2  # both places, by line
    assert message.count("line ") == 2


def test_a_registry_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "features.yaml"
    path.write_bytes(sample.registry_text().encode().replace(b"consumer", b"consum\xe9r", 1))
    with pytest.raises(RegistryError, match=r"features\.yaml: line \d+: not UTF-8"):
        load_registry(path)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("ttl: ", "ttl: 99999999999999999999 #", "longer than the limit"),
        ("ttl: ", "ttl: " + "9" * 5000 + " #", "number is too long"),
        ("ttl: ", "ttl: " + "9" * 5000 + "d #", "longer than the limit"),
        ("embedding(32)", "embedding(" + "9" * 5000 + ")", "dimension must be 1..65536"),
    ],
    ids=["ttl past 100 years", "5000-digit int", "5000-digit duration", "5000-digit dim"],
)
def test_huge_numbers_are_refused_with_the_entry(old: str, new: str, expected: str) -> None:
    with pytest.raises(RegistryError, match=expected) as raised:
        parse_registry(sample.registry_text().replace(old, new, 1), "features.yaml")
    assert str(raised.value).startswith("features.yaml")


FEAST_SHAPED = """
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d, join_key: consumer_id}
  store: {prefix: s, id_type: string, ttl: 1d}
feature_groups:
  daily: {entity: consumer, push_source: pushed, features: {a: float, b: int}}
  live: {entity: consumer, push_source: pushed, features: {c: float}}
  store_daily: {entity: store, features: {d: double}}
feature_services:
  small: ["daily:a", live]
"""


def test_join_keys_push_sources_and_feature_services() -> None:
    reg = parse_registry(FEAST_SHAPED, source="features.yaml")
    assert reg.entities["consumer"].join_key == "consumer_id"
    assert reg.entities["store"].join_key == "store"  # Feast's default: the entity's name
    assert reg.by_join_key("consumer_id") is reg.entities["consumer"]
    assert reg.by_join_key("consumer") is None
    assert [g.name for g in reg.pushed_groups("pushed")] == ["daily", "live"]
    assert [g.name for g in reg.pushed_groups("store_daily")] == ["store_daily"]
    assert reg.pushed_groups("nothing") == ()
    assert reg.services == {"small": ("daily:a", "live")}


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "ttl: 1d}",
            "ttl: 1d, join_key: consumer_id}",
            "entities.store.join_key: 'consumer_id' is already the join key of 'consumer'",
        ),
        ("join_key: consumer_id", "join_key: 'a b'", "entities.consumer.join_key: 'a b'"),
        (
            "store_daily: {entity: store,",
            "store_daily: {entity: store, push_source: pushed,",
            "feature_groups.store_daily.push_source: 'pushed' also feeds 'daily' of entity "
            "type 'consumer'",
        ),
        ('"daily:a"', '"daily:zz"', "feature_services.small[0]: feature group 'daily' has no"),
        ("live]", "nope]", "feature_services.small[1]: 'nope' names no declared feature group"),
        ('small: ["daily:a", live]', "small: []", "feature_services.small: must be a non-empty"),
    ],
)
def test_feast_shaped_entries_name_the_entry(old: str, new: str, message: str) -> None:
    assert old in FEAST_SHAPED
    with pytest.raises(RegistryError) as info:
        parse_registry(FEAST_SHAPED.replace(old, new, 1), source="features.yaml")
    assert message in str(info.value)
