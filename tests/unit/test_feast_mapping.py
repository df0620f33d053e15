"""The Feast -> registry mapping (``feature_store.feast.mapping.to_registry``) on Feast's own
definition objects: what maps, and every entry that does not, named at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Bool, Bytes, Float32, Float64, Int32, Int64, String, UnixTimestamp

from feature_store.errors import RegistryError
from feature_store.feast.mapping import short_prefixes, to_registry
from feature_store.registry import parse_registry

SOURCE = FileSource(name="src", path="x.parquet", timestamp_field="event_timestamp")
CONSUMER = Entity(name="consumer", join_keys=["consumer_id"], value_type=ValueType.INT64)
COURIER = Entity(name="courier", join_keys=["courier_id"], value_type=ValueType.STRING)


def view(
    name: str, fields: list[Field], entities: list[Entity] | None = None, **kw: object
) -> FeatureView:
    return FeatureView(
        name=name,
        entities=[CONSUMER] if entities is None else entities,
        schema=fields,
        source=kw.pop("source", SOURCE),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_types_entities_sources_and_services_map() -> None:
    push = PushSource(name="live_push", batch_source=SOURCE)
    daily = view(
        "daily",
        [
            Field(name="f32", dtype=Float32),
            Field(name="f64", dtype=Float64),
            Field(name="i32", dtype=Int32),
            Field(name="i64", dtype=Int64),
            Field(name="flag", dtype=Bool),
            Field(name="city", dtype=String),
            Field(name="emb", dtype=Array(Float32), vector_length=8),
            Field(name="floats", dtype=Array(Float32)),
            Field(name="ids", dtype=Array(Int32)),
        ],
        ttl=timedelta(days=30),
        description="daily",
    )
    live = view("live", [Field(name="rating", dtype=Float32)], [COURIER], source=push)
    service = FeatureService(name="svc", features=[daily[["f32", "emb"]], live])
    text = to_registry([CONSUMER, COURIER], [daily, live], [service])
    reg = parse_registry(text)
    consumer, courier = reg.entities["consumer"], reg.entities["courier"]
    assert (consumer.join_key, consumer.id_type.value, consumer.prefix) == (
        "consumer_id",
        "int",
        "con",
    )
    assert (courier.join_key, courier.id_type.value, courier.prefix) == (
        "courier_id",
        "string",
        "cou",
    )
    assert consumer.ttl_seconds == 30 * 86400  # the view's ttl is longer than the 7 d default
    assert courier.ttl_seconds == 7 * 86400
    types = {f.name: f.codec.signature for f in reg.groups["daily"].features}
    assert types == {
        "f32": "float", "f64": "double", "i32": "int", "i64": "int", "flag": "bool",
        "city": "string", "emb": "embedding(8)", "floats": "float_list", "ids": "int_list",
    }  # fmt: skip
    assert reg.groups["daily"].max_age_seconds == 30 * 86400
    assert reg.groups["live"].max_age_seconds is None  # no ttl in Feast: never stale
    assert reg.groups["live"].push_source == "live_push"
    assert reg.groups["daily"].push_source == ""
    assert reg.services == {"svc": ("daily:f32", "daily:emb", "live:rating")}


def test_every_entry_that_does_not_map_is_named_at_once() -> None:
    bad = view(
        "bad",
        [
            Field(name="ok", dtype=Float32),
            Field(name="blob", dtype=Bytes),
            Field(name="when", dtype=UnixTimestamp),
            Field(name="doubles", dtype=Array(Float64)),
            Field(name="tags", dtype=Array(String)),
        ],
    )
    twice = view("again", [Field(name="ok", dtype=Int64)])
    pair = view("pair", [Field(name="x", dtype=Float32)], [CONSUMER, COURIER])
    with pytest.raises(RegistryError) as info:
        to_registry([CONSUMER, COURIER], [bad, twice, pair], source="repo")
    message = str(info.value)
    for needle in [
        "repo: 6 Feast definition(s) cannot be mapped",
        "feature_views.bad.features.blob: type Bytes has no counterpart",
        "feature_views.bad.features.when: type UnixTimestamp",
        "feature_views.bad.features.doubles: type Array(Float64) has no counterpart: float "
        "lists and embeddings hold float32",
        "feature_views.bad.features.tags: type Array(String)",
        "feature_views.again.features.ok: feature_views.bad of the same entity 'consumer' "
        "has a feature of this name",
        "feature_views.pair: has 2 entities (consumer, courier)",
    ]:
        assert needle in message, message


def test_a_repository_without_views_says_to_apply_it() -> None:
    with pytest.raises(RegistryError, match="feast apply"):
        to_registry([CONSUMER], [], source="repo")


def test_short_prefixes_are_unique_starts() -> None:
    assert short_prefixes(["consumer"]) == {"consumer": "c"}
    assert short_prefixes(["consumer", "courier", "store"]) == {
        "consumer": "con", "courier": "cou", "store": "s",
    }  # fmt: skip
    assert short_prefixes(["user", "user_session"]) == {"user": "user", "user_session": "user_"}


def test_pinned_prefixes_stay_and_a_tag_sets_one() -> None:
    """An entity added beside another never moves the other's keys: a prefix chosen before
    is kept, a new entity takes a start no one has; ``feature_store_prefix`` sets one."""
    rating = [Field(name="rating", dtype=Float32)]
    alone = parse_registry(to_registry([CONSUMER], [view("a", rating)]))
    assert alone.entities["consumer"].prefix == "c"
    both = [view("a", rating), view("b", [Field(name="n", dtype=Int64)], [COURIER])]
    unpinned = parse_registry(to_registry([CONSUMER, COURIER], both))
    assert unpinned.entities["consumer"].prefix == "con"  # the key would move
    pinned = parse_registry(to_registry([CONSUMER, COURIER], both, prefixes={"consumer": "c"}))
    assert pinned.entities["consumer"].prefix == "c"
    assert pinned.entities["courier"].prefix not in ("c", "")
    reg = parse_registry(to_registry([CONSUMER, courier("cr")], both, prefixes={"consumer": "c"}))
    assert (reg.entities["consumer"].prefix, reg.entities["courier"].prefix) == ("c", "cr")
    with pytest.raises(RegistryError, match="key prefix 'c' is also entity"):
        to_registry([CONSUMER, courier("c")], both, prefixes={"consumer": "c"})
    with pytest.raises(RegistryError, match="is not a key prefix"):
        to_registry([CONSUMER, courier("a:b")], both)


def courier(prefix: str) -> Entity:
    """COURIER with its key prefix set by the ``feature_store_prefix`` tag."""
    return Entity(
        name="courier",
        join_keys=["courier_id"],
        value_type=ValueType.STRING,
        tags={"feature_store_prefix": prefix},
    )
