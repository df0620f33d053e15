"""Planned reads (``Hits::plan`` and ``Hits::render`` in native/src/hits/plan.rs): the commands a
front writes for a lookup without the L1 are what ``roundtrip.pack`` writes, and the answer it
writes from Redis's replies is the Python reference's, byte for byte (REST) and record for
record (gRPC); where the reference would name a fault, the front writes nothing. Lookups of
one group, of some of its features, Feast's, and lookups over several groups of one entity
(one command per id reads them all).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from feature_store import _native
from feature_store.errors import EncodingError
from feature_store.layout import KEY_SEPARATOR, MAX_STRING_ID_BYTES, IdType
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.registry import EntityType, Feature, parse_registry
from feature_store.serialization import FeatureType
from feature_store.serialization.answers import TYPE_CODES
from feature_store.serving.api import grpc_server, wire
from feature_store.serving.api.feast_api import Shapes, answer_json, answer_plan, parse_read
from feature_store.serving.api.rest_api import _picked_rows, _whole_group_rows
from feature_store.serving.fronts.hits import picks_layout
from feature_store.serving.l1.reads import Resolved
from feature_store.serving.l1.roundtrip import pack, whole
from feature_store.serving.l1.spec import GroupSpec
from feature_store.serving.service import Lookup, Projection

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

REGISTRY = parse_registry(
    """
version: 1
entities:
  shop: {prefix: s, id_type: string, ttl: 7d}
  user: {prefix: u, id_type: int, ttl: 7d}
feature_groups:
  daily:
    entity: shop
    max_age: 1d
    features: {rating: float, tags: int_list, name: string, open: bool, visits: int}
  forever:
    entity: user
    features: {rating: double, vector: embedding(3), scores: float_list}
  weekly:
    entity: shop
    max_age: 2h
    features: {score: double, orders: int, emb: embedding(3)}
"""
)
REST, GRPC, FEAST = 0, 1, 2


def value_of(t: FeatureType, draw: st.DrawFn) -> object:
    if t in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return draw(st.floats(allow_nan=False, allow_infinity=False, width=32))
    if t is FeatureType.INT:
        return draw(st.integers(-(2**63), 2**63 - 1))
    if t is FeatureType.BOOL:
        return draw(st.booleans())
    if t is FeatureType.STRING:
        return draw(st.text(max_size=12))
    if t is FeatureType.INT_LIST:
        return draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
    size = 3 if t is FeatureType.EMBEDDING else draw(st.integers(0, 4))
    return draw(st.lists(st.floats(width=32, allow_nan=False), min_size=size, max_size=size))


def bulk(value: bytes | None) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%b\r\n" % (len(value), value)


@st.composite
def lookups(draw: st.DrawFn) -> tuple[str, list[object], list[list[bytes | None]], bool, bool]:
    """A group, its entities' ids, each entity's stored values (its fields' order, the
    write time last), whether the read is an HGETALL, and whether one entity is broken."""
    name = draw(st.sampled_from(sorted(REGISTRY.groups)))
    group = REGISTRY.groups[name]
    int_ids = group.entity.id_type is IdType.INT
    ident = (
        st.integers(-(2**63), 2**63 - 1)
        if int_ids
        else st.text("abcxyz019-_", min_size=1, max_size=MAX_STRING_ID_BYTES)
    )
    ids = draw(st.lists(ident, min_size=1, max_size=5))
    now = int(time.time())
    stored = []
    for _ in ids:
        values: list[bytes | None] = [
            f.codec.encode(value_of(f.type, draw)) if draw(st.booleans()) else None
            for f in group.features
        ]
        age = draw(st.none() | st.integers(0, 200_000) | st.just(86_400))
        written = None if age is None else str(now - age).encode()
        if written is not None and draw(st.booleans()):
            written += b".25"
        stored.append([*values, written])
    broken = draw(st.booleans())
    if broken:
        bad = stored[draw(st.integers(0, len(stored) - 1))]
        if draw(st.booleans()):
            bad[-1] = b"yesterday"  # a corrupt write time
        else:
            bad[0] = b"not a number"  # the first feature's value does not decode
    return name, ids, stored, draw(st.booleans()), broken


def replies(spec: GroupSpec, stored: list[list[bytes | None]], hgetall: bool) -> bytes:
    out = b""
    for values in stored:
        if hgetall:  # the hash's pairs, in an order of its own, with another group's field
            pairs = [(f, v) for f, v in zip(spec.fields, values, strict=True) if v is not None]
            pairs = [*reversed(pairs), (b"zzzz", b"1")]
            out += b"*%d\r\n" % (2 * len(pairs)) + b"".join(bulk(f) + bulk(v) for f, v in pairs)
        else:
            out += b"*%d\r\n" % len(values) + b"".join(bulk(v) for v in values)
    return out


def picked_replies(
    spec: GroupSpec, stored: list[list[bytes | None]], picks: list[int], hgetall: bool
) -> bytes:
    """Redis's replies to a read of features ``picks`` and the write time: the whole hash
    (in an order of its own: the front finds the fields), or those fields in turn."""
    if hgetall:
        return replies(spec, stored, True)
    at = [*picks, len(spec.fields) - 1]
    return b"".join(b"*%d\r\n" % len(at) + b"".join(bulk(v[fi]) for fi in at) for v in stored)


def planner(spec: GroupSpec, hgetall: bool, api: int, head: bytes) -> _native.HitCache:
    group = spec.group
    cache = _native.HitCache(1000, MAX_STRING_ID_BYTES, 0.0, 0, True)
    cache.define_read(
        0, list(spec.fields), hgetall, [(TYPE_CODES[c.type], c.dim or 0) for c in spec.fmt.codecs]
    )
    label = orjson.dumps(group.name) if api == REST else group.name.encode()
    prefix = (group.entity.prefix + KEY_SEPARATOR).encode()
    int_ids = group.entity.id_type is IdType.INT
    assert cache.learn(
        api,
        group.entity.name,
        [],
        [group.name],
        [(0, group.max_age_seconds, None, label)],
        head,
        prefix,
        int_ids,
    )
    return cache


def features_request(
    api: int, entity: EntityType, features: Sequence[Feature], asked: list[str], ids: list[object]
) -> tuple[bytes, bytes]:
    """A REST or gRPC lookup of ``features`` (named as ``asked``) of ``ids``: its answer's
    head, as the handler writes it, and its body."""
    names = [f.name for f in features]
    if api == REST:
        head = b'{"entity_type":%b,"features":%b,"types":%b,"results":[' % (
            orjson.dumps(entity.name),
            orjson.dumps(names),
            orjson.dumps([f.type.value for f in features]),
        )
        return head, orjson.dumps({"entity_type": entity.name, "ids": ids, "features": asked})
    request = pb.GetFeaturesRequest(entity_type=entity.name, features=asked)
    if entity.id_type is IdType.INT:
        request.int_ids.extend(ids)  # type: ignore[arg-type]
    else:
        request.string_ids.extend(ids)  # type: ignore[arg-type]
    return wire.header(entity.name, names), request.SerializeToString()


def reference(
    spec: GroupSpec, ids: list[object], stored: list[list[bytes | None]], now: int, proto: bool
) -> Lookup:
    group = spec.group
    prefix = group.entity.prefix + KEY_SEPARATOR
    entries = [
        [Resolved(spec.entry((group.name, f"{prefix}{i}".encode()), values, proto=proto), False)]
        for i, values in zip(ids, stored, strict=True)
    ]
    proj = Projection(
        group.entity,
        group.features,
        tuple(f.name for f in group.features),
        (group,),
        tuple((0, i) for i in range(len(group.features))),
        True,
    )
    return Lookup(proj, ids, entries, now, [])  # type: ignore[arg-type]


@given(lookups(), st.sampled_from([REST, GRPC]))
@settings(max_examples=300, deadline=None)
def test_a_planned_lookup_is_the_references(
    case: tuple[str, list[object], list[list[bytes | None]], bool, bool], api: int
) -> None:
    name, ids, stored, hgetall, broken = case
    group = REGISTRY.groups[name]
    spec = GroupSpec.of(group, REGISTRY)
    proj_names = [f.name for f in group.features]
    if api == REST:
        head = b'{"entity_type":%b,"features":%b,"types":%b,"results":[' % (
            orjson.dumps(group.entity.name),
            orjson.dumps(proj_names),
            orjson.dumps([f.type.value for f in group.features]),
        )
        body = orjson.dumps({"entity_type": group.entity.name, "ids": ids, "groups": [name]})
    else:
        head = wire.header(group.entity.name, proj_names)
        request = pb.GetFeaturesRequest(entity_type=group.entity.name, groups=[name])
        if group.entity.id_type is IdType.INT:
            request.int_ids.extend(ids)  # type: ignore[arg-type]
        else:
            request.string_ids.extend(ids)  # type: ignore[arg-type]
        body = request.SerializeToString()
    cache = planner(spec, hgetall, api, head)
    before = int(time.time())
    planned = cache.plan(body, replies(spec, stored, hgetall), api == GRPC)
    assume(int(time.time()) == before)  # the ages are of one second
    assert planned is not None
    command, count, answer = planned
    keys = [f"{group.entity.prefix}{KEY_SEPARATOR}{i}".encode() for i in ids]
    assert count == len(ids)
    if hgetall == whole([spec]):  # the reads roundtrip.pack writes, of this group's shape
        assert command == pack([(k, [spec]) for k in keys])
    elif hgetall:
        assert command == b"".join(b"*2\r\n$7\r\nHGETALL\r\n" + bulk(k) for k in keys)
    else:
        head_of = b"*%d\r\n$5\r\nHMGET\r\n" % (len(spec.fields) + 2)
        assert command == b"".join(head_of + bulk(k) + spec.packed_fields for k in keys)
    if broken:
        with pytest.raises(EncodingError):
            reference(spec, ids, stored, before, api == GRPC)
        assert answer is None  # the handler answers, naming the fault
        return
    lookup = reference(spec, ids, stored, before, api == GRPC)
    if api == REST:
        assert answer == head + b",".join(_whole_group_rows(lookup)) + b"]}"
        orjson.loads(answer)
    else:
        assert answer == head + b"".join(grpc_server._answer_rows(lookup, None))


@given(lookups(), st.sampled_from([REST, GRPC]), st.data())
@settings(max_examples=300, deadline=None)
def test_a_planned_lookup_of_some_features_is_the_references(
    case: tuple[str, list[object], list[list[bytes | None]], bool, bool],
    api: int,
    data: st.DataObject,
) -> None:
    """Some of a group's features, in any order: the front reads those fields and the write
    time alone (hits.FrontLookups._read), and answers as the reference does from
    them; a value it does not read cannot fail the lookup."""
    name, ids, stored, hgetall, _ = case
    group = REGISTRY.groups[name]
    spec = GroupSpec.of(group, REGISTRY)
    n = len(group.features)
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    assume(picks != list(range(n)))  # all of them, in order: the whole group (above)
    features = [group.features[fi] for fi in picks]
    names = [f.name for f in features]
    entity = group.entity
    head, body = features_request(api, entity, features, names, ids)
    cache = _native.HitCache(1000, MAX_STRING_ID_BYTES, 0.0, 0, True)
    fields = [*(spec.fields[fi] for fi in picks), spec.fields[-1]]
    types = [(TYPE_CODES[c.type], c.dim or 0) for c in (spec.fmt.codecs[fi] for fi in picks)]
    cache.define_read(0, fields, hgetall, types)
    label = orjson.dumps(group.name) if api == REST else group.name.encode()
    prefix = (entity.prefix + KEY_SEPARATOR).encode()
    int_ids = entity.id_type is IdType.INT
    parts = [(0, group.max_age_seconds, None, label)]
    assert cache.learn(api, entity.name, names, [], parts, head, prefix, int_ids)
    redis_replies = picked_replies(spec, stored, picks, hgetall)
    before = int(time.time())
    planned = cache.plan(body, redis_replies, api == GRPC)
    assume(int(time.time()) == before)  # the ages are of one second
    assert planned is not None
    command, count, answer = planned
    assert count == len(ids)
    keys = [f"{entity.prefix}{KEY_SEPARATOR}{i}".encode() for i in ids]
    if hgetall:
        assert command == b"".join(b"*2\r\n$7\r\nHGETALL\r\n" + bulk(k) for k in keys)
    else:
        head_of = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
        assert command == b"".join(head_of + bulk(k) + b"".join(map(bulk, fields)) for k in keys)
    # the reference, from what the front read: the picked values and the write time
    read = [[v if fi in picks or fi == n else None for fi, v in enumerate(vs)] for vs in stored]
    try:
        entries = [
            [Resolved(spec.entry((name, key), vs, proto=api == GRPC), False)]
            for key, vs in zip(keys, read, strict=True)
        ]
    except EncodingError:
        assert answer is None  # the handler answers, naming the fault
        return
    proj = Projection(
        entity, tuple(features), tuple(names), (group,), tuple((0, fi) for fi in picks), False
    )
    lookup = Lookup(proj, ids, entries, before, [])  # type: ignore[arg-type]
    if api == REST:
        assert answer == head + b",".join(_picked_rows(lookup)) + b"]}"
        orjson.loads(answer)
    else:
        assert answer == head + b"".join(grpc_server._answer_rows(lookup, None))


@given(lookups(), st.data())
@settings(max_examples=300, deadline=None)
def test_a_planned_feast_lookup_is_the_references(
    case: tuple[str, list[object], list[list[bytes | None]], bool, bool], data: st.DataObject
) -> None:
    """Feast's ``/get-online-features`` of some or all of a group's features, in any order,
    repeats answered once: the front reads those fields and the write time, and writes the
    column-shaped answer ``feast_api.answer_json`` writes from what it read."""
    name, ids, stored, hgetall, _ = case
    group = REGISTRY.groups[name]
    spec = GroupSpec.of(group, REGISTRY)
    n = len(group.features)
    asked = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n + 2))
    picks = list(dict.fromkeys(asked))  # a repeated reference is answered once
    full = data.draw(st.booleans())
    entity = group.entity
    refs = [f"{name}:{group.features[fi].name}" for fi in asked]
    body = {"features": refs, "entities": {entity.join_key: ids}, "full_feature_names": full}
    request = parse_read(body, Shapes(REGISTRY, 100))
    shape = request.shape
    features = tuple(group.features[fi] for fi in picks)
    names = tuple(f.name for f in features)
    whole = picks == list(range(n))
    proj = Projection(entity, features, names, (group,), tuple((0, fi) for fi in picks), whole)
    head = answer_plan(shape, [Lookup(proj, ids, [], 0, [])]).head  # type: ignore[arg-type]
    cache = _native.HitCache(1000, MAX_STRING_ID_BYTES, 0.0, 0, True)
    fields = [*(spec.fields[fi] for fi in picks), spec.fields[-1]]
    types = [(TYPE_CODES[c.type], c.dim or 0) for c in (spec.fmt.codecs[fi] for fi in picks)]
    cache.define_read(0, fields, hgetall, types)
    prefix = (entity.prefix + KEY_SEPARATOR).encode()
    int_ids = entity.id_type is IdType.INT
    flags = ["full_feature_names"] if full else []
    parts = [(0, group.max_age_seconds, None, b"")]
    assert cache.learn(FEAST, entity.join_key, refs, flags, parts, head, prefix, int_ids)
    redis_replies = picked_replies(spec, stored, picks, hgetall)
    planned = cache.plan(orjson.dumps(body), redis_replies, feast=True)
    assert planned is not None
    _, count, answer = planned
    assert count == len(ids)
    keys = [f"{entity.prefix}{KEY_SEPARATOR}{i}".encode() for i in ids]
    # the reference, from what the front read: the picked values and the write time
    read = [[v if fi in picks or fi == n else None for fi, v in enumerate(vs)] for vs in stored]
    try:
        entries = [
            [Resolved(spec.entry((name, key), vs, bare=True), False)]
            for key, vs in zip(keys, read, strict=True)
        ]
    except EncodingError:
        assert answer is None  # the handler answers, naming the fault
        return
    lookup = Lookup(proj, ids, entries, int(time.time()), [])  # type: ignore[arg-type]
    expected = answer_json(request, [lookup])
    if answer != expected:  # stale or not: a second may have turned between the two
        lookup = Lookup(proj, ids, entries, int(time.time()) - 1, [])  # type: ignore[arg-type]
        expected = answer_json(request, [lookup])
    assert answer == expected
    orjson.loads(answer)


@given(st.sampled_from([REST, GRPC, FEAST]), st.booleans(), st.data())
@settings(max_examples=300, deadline=None)
def test_a_planned_lookup_over_several_groups_is_the_references(
    api: int, hgetall: bool, data: st.DataObject
) -> None:
    """Features of two groups of one entity, interleaved in any order: one command per id
    reads each group's features asked and its write time (an HMGET, or the whole hash),
    and the front writes the answer the reference writes from what it read: each group's
    statuses and age (REST's and gRPC's rows), each view's columns (Feast's); an entity
    with nothing of one group, or of either."""
    groups = [REGISTRY.groups["daily"], REGISTRY.groups["weekly"]]
    specs = {g.name: GroupSpec.of(g, REGISTRY) for g in groups}
    entity = groups[0].entity
    pairs = [(g.name, fi) for g in groups for fi in range(len(g.features))]
    asked = data.draw(st.lists(st.sampled_from(pairs), min_size=2, unique=True), "asked")
    assume(len({name for name, _ in asked}) == 2)
    refs = [f"{name}:{REGISTRY.groups[name].features[fi].name}" for name, fi in asked]
    ids = data.draw(st.lists(st.text("abxyz09", min_size=1, max_size=8), min_size=1, max_size=4))
    now = int(time.time())
    stored: dict[str, list[list[bytes | None]]] = {g.name: [] for g in groups}
    for _ in ids:
        for g in groups:
            has = data.draw(st.booleans(), "has the group")
            values = [
                f.codec.encode(value_of(f.type, data.draw)) if has and data.draw(st.booleans())
                else None
                for f in g.features
            ]  # fmt: skip
            age = data.draw(st.none() | st.integers(0, 20_000), "age") if has else None
            stored[g.name].append([*values, None if age is None else str(now - age).encode()])
    # the projection the handler resolves: groups in the order the features name them
    order = list(dict.fromkeys(name for name, _ in asked))
    proj_groups = tuple(REGISTRY.groups[name] for name in order)
    features = tuple(REGISTRY.groups[name].features[fi] for name, fi in asked)
    picks = tuple((order.index(name), fi) for name, fi in asked)
    names = tuple(f.name for f in features)
    proj = Projection(entity, features, names, proj_groups, picks, False)
    keys = [f"{entity.prefix}{KEY_SEPARATOR}{i}".encode() for i in ids]
    if api == FEAST:
        body: dict[str, object] = {"features": refs, "entities": {entity.join_key: ids}}
        request = parse_read(body, Shapes(REGISTRY, 100))
        plan = answer_plan(request.shape, [Lookup(proj, ids, [], 0, [])])  # type: ignore[arg-type]
        head, layout = plan.head, ([(gi, fis) for _, gi, fis in plan.groups], plan.order)
        sent, form = orjson.dumps(body), (entity.join_key, refs, [])
    else:
        layout = picks_layout(picks, len(proj_groups))
        head, sent = features_request(api, entity, features, refs, ids)
        form = (entity.name, refs, [])
    # the read the front is taught: each group's features asked, then its write time
    shares = [(proj_groups[gi], list(fis)) for gi, fis in layout[0]]
    fields = [f for g, fis in shares for f in [*(specs[g.name].fields[fi] for fi in fis),
                                              specs[g.name].fields[-1]]]  # fmt: skip
    types = [
        (TYPE_CODES[c.type], c.dim or 0)
        for g, fis in shares
        for c in (specs[g.name].fmt.codecs[fi] for fi in fis)
    ]
    cache = _native.HitCache(1000, MAX_STRING_ID_BYTES, 0.0, 0, True)
    cache.define_read(0, fields, hgetall, types, [len(fis) for _, fis in shares])
    parts = [
        (0, g.max_age_seconds, None, orjson.dumps(g.name) if api == REST else g.name.encode())
        for g, _ in shares
    ]
    prefix = (entity.prefix + KEY_SEPARATOR).encode()
    assert cache.learn(api, *form, parts, head, prefix, False, list(layout[1]))
    replies = b""
    for r in range(len(ids)):
        if hgetall:  # the whole hash, both groups', in an order of its own
            hashed = [
                (f, v)
                for g in groups
                for f, v in zip(specs[g.name].fields, stored[g.name][r], strict=True)
                if v is not None
            ]
            hashed = [*reversed(hashed), (b"zzzz", b"1")]
            replies += b"*%d\r\n" % (2 * len(hashed))
            replies += b"".join(bulk(f) + bulk(v) for f, v in hashed)
            continue
        at = [(g.name, fi) for g, fis in shares for fi in [*fis, len(g.features)]]
        replies += b"*%d\r\n" % len(at) + b"".join(bulk(stored[n][r][fi]) for n, fi in at)
    before = int(time.time())
    planned = cache.plan(sent, replies, api == GRPC, api == FEAST)
    assume(int(time.time()) == before)  # the ages are of one second
    assert planned is not None
    command, count, answer = planned
    assert count == len(ids)
    if hgetall:
        assert command == b"".join(b"*2\r\n$7\r\nHGETALL\r\n" + bulk(k) for k in keys)
    else:
        head_of = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
        assert command == b"".join(head_of + bulk(k) + b"".join(map(bulk, fields)) for k in keys)
    # the reference, from what the front read: the features asked and the write times
    entries = []
    for r, key in enumerate(keys):
        row = []
        for g in proj_groups:
            read_of = {fi for name, fi in asked if name == g.name} | {len(g.features)}
            vs = [v if fi in read_of else None for fi, v in enumerate(stored[g.name][r])]
            entry = specs[g.name].entry((g.name, key), vs, proto=api == GRPC, bare=api == FEAST)
            row.append(Resolved(entry, False))
        entries.append(row)
    lookup = Lookup(proj, ids, entries, before, [])  # type: ignore[arg-type]
    if api == REST:
        assert answer == head + b",".join(_picked_rows(lookup)) + b"]}"
    elif api == GRPC:
        assert answer == head + b"".join(grpc_server._answer_rows(lookup, None))
    else:
        assert answer == answer_json(request, [lookup])
