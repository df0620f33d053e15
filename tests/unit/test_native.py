"""The Rust data plane writes the same bytes as its Python reference, for every type.

``feature_store._native.GroupCodec`` may refuse a value (ValueError: a form it does not
take, or a bad value), and the reference then answers it; what it does answer must be
byte-identical to ``feature_store.serialization.answers.PureGroupCodec``. Canonical values,
as the writers store them, must not be refused: a native path that always fell back would
be identical and useless.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence

import hiredis
import orjson
import pytest
import snappy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from feature_store import _native, sample
from feature_store.batch import align_hash
from feature_store.errors import EncodingError
from feature_store.layout import decode_timestamp
from feature_store.native import GroupFormat
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.values_pb2 import FloatList
from feature_store.registry import parse_registry
from feature_store.serialization import FeatureType, codec_for
from feature_store.serialization.answers import TYPE_CODES, PureGroupCodec, pack, unpack
from feature_store.serialization.codecs import encode_float32
from feature_store.serving.api import grpc_server
from feature_store.serving.api.rest_api import _picked_rows, _whole_group_rows, picked_rows
from feature_store.serving.l1.cache import Entry
from feature_store.serving.l1.loader import Resolved
from feature_store.serving.service import Lookup, Projection

CODECS = {
    "float": codec_for(FeatureType.FLOAT),
    "double": codec_for(FeatureType.DOUBLE),
    "int": codec_for(FeatureType.INT),
    "bool": codec_for(FeatureType.BOOL),
    "string": codec_for(FeatureType.STRING),
    "embedding": codec_for(FeatureType.EMBEDDING, 4),
    "float_list": codec_for(FeatureType.FLOAT_LIST),
    "int_list": codec_for(FeatureType.INT_LIST),
}
ORDER = list(CODECS)
f32s = st.floats(width=32)
f64s = st.floats()
int64s = st.integers(-(2**63), 2**63 - 1)

VALUES = {
    "float": f32s,
    "double": f64s,
    "int": int64s,
    "bool": st.booleans(),
    "string": st.text(),
    "embedding": st.lists(f32s, min_size=4, max_size=4),
    "float_list": st.lists(f32s, max_size=20),
    "int_list": st.lists(int64s, max_size=20),
}
# stored forms other writers (or corruption) may leave: the reference decides what they mean
ODD_VALUES = [
    b"", b" 1", b"1 ", b"+1", b"007", b"-0", b"1_0", b"1.", b".5", b"NaN", b"-nan", b"Infinity",
    b"1e", b"1e+", b"9" * 30, b"-", b"0x10", b"\xff", b"1.5E3", b"2", b"true", b"\x00",
    b"0.10", b"5.", b"00.5", b"0.000001", b"0.00001", b"1234567890123456", b"123456789012345",
    b"0.1234567890123456", b"-0.0", b"0.0", b"1000", b"9007199254740993", b"1e400",
]  # fmt: skip
ODD_TEXT = st.sampled_from(ODD_VALUES)


def native_codec(names: list[str]) -> _native.GroupCodec:
    codecs = [CODECS[n] for n in names]
    return _native.GroupCodec([(TYPE_CODES[c.type], c.dim or 0) for c in codecs])


def pure_codec(names: list[str]) -> PureGroupCodec:
    return PureGroupCodec([CODECS[n] for n in names])


def same_object(a: object, b: object) -> bool:
    """Equal and of the same type, NaN equal to NaN, lists element by element."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        pairs = zip(a, b, strict=False)  # type: ignore[call-overload]
        return len(a) == len(b) and all(same_object(x, y) for x, y in pairs)  # type: ignore[arg-type]
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)  # type: ignore[arg-type]
    return a == b


def reference_values(names: list[str], reply: list[bytes | None]) -> list[object]:
    pairs = zip(names, reply, strict=True)
    return [None if r is None else CODECS[n].fast_decode(r) for n, r in pairs]


def same_values(names: list[str], reply: list[bytes | None]) -> bool:
    """The store client's decode: identical objects where native answers; True if it did."""
    try:
        got = native_codec(names).values(reply)
    except ValueError:
        return False
    want = reference_values(names, reply)
    assert all(same_object(g, w) for g, w in zip(got, want, strict=True)), (got, want)
    return True


def same_answers(names: list[str], reply: list[bytes | None]) -> bool:
    """Asserts identity where native answers; True when native answered every part."""
    native, pure = native_codec(names), pure_codec(names)
    try:
        loaded = native.load(reply)
    except ValueError:
        return False
    assert loaded == pure.load(reply)
    raw = loaded[0]
    assert native.json(raw) == loaded[2]  # a compact cache's entry answered
    assert native.json_parts(raw) == pure.json_parts(raw)
    # a Feast answer's columns: the rows' values per feature (an entity with nothing
    # between), their statuses (NULL_VALUE where a row lacks the value) and times
    raws = [raw, None, raw]
    statuses, stamps = [b'"PRESENT"', b'"NOT_FOUND"', b'"OUTSIDE_MAX_AGE"'], [b'"t1"', b"0", b"1"]
    picks = [*reversed(range(len(names))), 0]
    columns = native.feast_columns(raws, statuses, stamps, picks)
    assert columns == pure.feast_columns(raws, statuses, stamps, picks)
    parts = pure.json_parts(raw)
    for fi, column in zip(picks, columns, strict=True):
        status = b'"PRESENT"' if reply[fi] is not None else b'"NULL_VALUE"'
        late = b'"OUTSIDE_MAX_AGE"' if reply[fi] is not None else b'"NULL_VALUE"'
        assert orjson.loads(column) == {
            "values": orjson.loads(b"[%b,null,%b]" % (parts[fi], parts[fi])),
            "statuses": orjson.loads(b'[%b,"NOT_FOUND",%b]' % (status, late)),
            "event_timestamps": ["t1", 0, 1],
        }
    assert native.feast_columns([], [], [], picks) == pure.feast_columns([], [], [], picks)
    assert native.proto(raw) == pure.proto(raw)
    assert native.proto_parts(raw) == pure.proto_parts(raw)
    # loaded for a gRPC answer: the records in place of the JSON
    assert native.load(reply, True) == pure.load(reply, True) == (*loaded[:2], pure.proto(raw))
    packed = pack([b"x", *reply, b"1700000000.5"])  # as resp_split packs a read
    for proto in (False, True):
        # a well-formed write time comes back read: its unix seconds
        assert native.load_packed(packed, 1, proto) == (pure.load(reply, proto), 1700000000)
    return True


@given(
    st.one_of(
        st.from_regex(rb"\A[0-9]{1,14}(\.[0-9]{0,11})?\Z"),
        st.binary(max_size=16),
        st.sampled_from([b"", b"1.", b".5", b"1e9", b"-1", b" 1", b"1099511627777", b"\xd9\xa3"]),
    )
)
@example(b"1099511627776")
def test_load_packed_reads_a_write_time_as_decode_timestamp_does(stamp: bytes) -> None:
    """Where ``decode_timestamp`` takes the freshness value, the native load returns its
    seconds; where it refuses it, the bytes themselves, for the reference to name."""
    native = native_codec(["float"])
    (_, _, _), freshness = native.load_packed(pack([b"1.5", stamp]), 0)
    try:
        expected: int | bytes = decode_timestamp(stamp)
    except ValueError:
        expected = stamp
    assert freshness == expected
    assert type(freshness) is type(expected)
    (_, _, _), absent = native.load_packed(pack([b"1.5", None]), 0)
    assert absent is None


@st.composite
def stored_rows(draw: st.DrawFn) -> tuple[list[str], list[bytes | None]]:
    names = draw(st.lists(st.sampled_from(ORDER), min_size=1, max_size=8))
    reply: list[bytes | None] = []
    for n in names:
        value = draw(st.none() | VALUES[n])
        reply.append(None if value is None else CODECS[n].encode(value))
    return names, reply


@given(stored_rows())
@settings(max_examples=400)
def test_canonical_values_are_answered_natively_and_identically(
    row: tuple[list[str], list[bytes | None]],
) -> None:
    names, reply = row
    assert same_answers(names, reply), "the native path refused values a writer stored"
    assert same_values(names, reply), "the native decode refused values a writer stored"


@pytest.mark.parametrize("data", ODD_VALUES)
@pytest.mark.parametrize("name", ORDER)
def test_each_odd_stored_form(name: str, data: bytes) -> None:
    check_odd(name, data)


@given(st.sampled_from(ORDER), ODD_TEXT | st.binary(max_size=40))
@example("int_list", snappy.compress(b"\x0a\x02\x80\x00"))  # a varint that is not minimal
@example("float_list", b"\x0a\x00")  # an empty packed field written out
@example("embedding", FloatList(values=[1.0, 2.0, 3.0]).SerializeToString())  # wrong dim
@example("float_list", b"\x0d\x00\x00\x80\x3f")  # one float, not packed
@example("float_list", b"\x0a\x04\x01\x00\x80\x7f")  # a signalling NaN
def test_odd_stored_values_are_identical_or_left_to_the_reference(name: str, data: bytes) -> None:
    check_odd(name, data)


def check_odd(name: str, data: bytes) -> None:
    try:
        native_values = native_codec([name]).values([data])
    except ValueError:
        pass  # the codec decodes it (or raises)
    else:
        assert same_object(native_values, reference_values([name], [data]))
    try:
        expected = pure_codec([name]).load([data])
    except EncodingError:
        expected = None
    try:
        got = native_codec([name]).load([data])
    except ValueError:
        return  # the reference answers it (or raises its EncodingError)
    assert expected is not None, f"native accepted {data!r}, which the reference refuses"
    assert got == expected
    assert same_answers([name], [data])


@given(st.from_regex(rb"\A-?[0-9]{1,18}(\.[0-9]{0,18})?\Z"))
def test_float_text_copied_as_it_is_or_parsed_reads_the_same(text: bytes) -> None:
    """Stored decimal text of every shape: the native JSON equals the reference's, and
    every text of the number grammar is answered natively (copied, or parsed and written)."""
    for name in ("float", "double"):
        answered = same_answers([name], [text])
        if re.fullmatch(rb"-?[0-9]+(\.[0-9]+)?", text):
            assert answered, text


@st.composite
def plain_decimals(draw: st.DrawFn) -> bytes:
    """-?digits(.digits)? of any magnitude: an integer of up to 21 digits with the point
    anywhere in it, or after zeros before it."""
    digits = str(draw(st.integers(0, 10**21)))
    point = draw(st.integers(-5, len(digits)))
    if point <= 0:
        digits = "0." + "0" * -point + digits
    elif point < len(digits):
        digits = digits[:point] + "." + digits[point:]
    return (draw(st.sampled_from(["", "-"])) + digits).encode()


@given(
    plain_decimals()
    | st.from_regex(rb"\A-?(0|[1-9][0-9]{0,19})\.[0-9]{1,24}\Z")
    | st.from_regex(rb"\A-?[0-9]{1,17}(\.[0-9]{1,9})?[eE][+-]?[0-9]{1,3}\Z")
)
@example(b"-0")
@example(b"9007199254740992")  # 2^53: the largest integer the quick path divides
@example(b"9007199254740993")  # 2^53 + 1: read by the general parser
@example(b"900719925474099.35")  # more than 2^53 in its digits
@example(b"0.0000000000000000000001234")  # 25 digits after the point
@example(b"0.000000000000000001")  # 18 after the point
@example(b"0.0000000000000000001")  # 19
@example(b"18446744073709551617")  # past 64 bits
@example(b"44667375401.9253275")  # divided after rounding its digits, it is one off
def test_stored_float_text_is_read_as_python_reads_it(text: bytes) -> None:
    """Every text of the number grammar, whichever way the native core reads it (an exact
    division for short plain decimals, the general parser otherwise): the gRPC record's
    double is float(text), bit for bit, and the answers are the reference's."""
    for name in ("float", "double"):
        assert same_answers([name], [text]), text
        record = native_codec([name]).proto(pack([text]))
        assert record == b"\x12\x09\x09" + struct.pack("<d", float(text)), text


@given(f32s)
def test_float32_json_is_the_shortest_float32_decimal(x: float) -> None:
    text = _native.float32_json(x)
    if math.isnan(x):
        assert text == b'"NaN"'
        return
    if math.isinf(x):
        assert text == (b'"Infinity"' if x > 0 else b'"-Infinity"')
        return
    parsed = orjson.loads(text)
    assert struct.unpack("<f", struct.pack("<f", parsed))[0] == x  # round-trips
    assert text == orjson.dumps(float(encode_float32(x)))  # the reference's definition
    digits = text.lstrip(b"-").split(b"e")[0].replace(b".", b"").strip(b"0")
    assert len(digits) <= 9  # never the 17 digits of the widened double


@given(f64s)
def test_float64_json_is_orjsons(x: float) -> None:
    if math.isfinite(x):
        assert _native.float64_json(x) == orjson.dumps(x)


def test_embeddings_are_written_as_float32_decimals() -> None:
    codec = GroupFormat([CODECS["embedding"]])
    data = CODECS["embedding"].encode([0.1, -2.5, 1e-7, 3.4028234663852886e38])
    for fmt in (codec, GroupFormat([CODECS["embedding"]], native=False)):
        assert fmt.load([data])[2] == b"[[0.1,-2.5,1e-7,3.4028235e+38]]"


def test_the_whole_standard_group_round_trips_through_both_paths() -> None:
    group = sample.registry().groups[sample.GROUP]
    values = sample.features(7)
    reply = [f.codec.encode(values[f.name]) for f in group.features]
    reply[3] = None
    native = GroupFormat([f.codec for f in group.features], native=True)
    pure = GroupFormat([f.codec for f in group.features], native=False)
    assert native.native is not None
    assert pure.native is None
    raw, present, json = native.load(reply)
    assert (raw, present, json) == pure.load(reply)
    assert unpack(raw) == reply
    assert present == bytes(0 if i == 3 else 1 for i in range(len(reply)))
    decoded = orjson.loads(json)
    assert decoded[3] is None
    assert decoded[0] == pytest.approx(values[group.features[0].name])
    # the protobuf records parse as serving.proto's FeatureRow values
    row = pb.FeatureRow.FromString(native.proto(raw))
    assert len(row.values) == len(reply)
    assert row.values[3].WhichOneof("kind") is None
    assert native.values(raw)[0] == pure.values(raw)[0]


def test_a_bad_value_raises_the_references_error_on_every_path() -> None:
    for native in (True, False):
        fmt = GroupFormat([CODECS["bool"], CODECS["int"]], native=native)
        with pytest.raises(EncodingError, match="not 0 or 1"):
            fmt.load([b"2", b"1"])
    # per value a varint of its length plus one (0: none), then the value
    assert pack([b"1", None, b""]) == b"\x021\x00\x01"
    long = bytes(range(256)) * 2  # a two-byte length: 513 = 0x81 0x04
    assert pack([long]) == b"\x81\x04" + long
    assert unpack(pack([long, None, b"x"])) == [long, None, b"x"]


# --- RESP replies read by the native round trip ------------------------------------------


def bulk(value: bytes | None, resp3: bool) -> bytes:
    if value is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    return b"$%d\r\n%b\r\n" % (len(value), value)


@st.composite
def replies(draw: st.DrawFn) -> tuple[list[tuple[list[bytes], bool, object]], bytes]:
    """Reads (fields, whole, what Redis holds) and the bytes Redis sends for them."""
    resp3 = draw(st.booleans())
    reads: list[tuple[list[bytes], bool, object]] = []
    wire = b""
    for _ in range(draw(st.integers(1, 6))):
        fields = draw(
            st.lists(st.binary(min_size=4, max_size=4), min_size=1, max_size=8, unique=True)
        )
        whole = draw(st.booleans())
        if draw(st.integers(0, 9)) == 0:
            reads.append((fields, whole, "WRONGTYPE Operation against a key"))
            wire += b"-WRONGTYPE Operation against a key\r\n"
            continue
        values = [draw(st.none() | st.binary(max_size=30)) for _ in fields]
        if whole:  # the hash's pairs, in its own order, with fields the read does not want
            pairs = [(f, v) for f, v in zip(fields, values, strict=True) if v is not None]
            extra = draw(st.lists(st.binary(min_size=5, max_size=5), max_size=3, unique=True))
            pairs += [(f, b"x") for f in extra]
            pairs = draw(st.permutations(pairs))
            head = b"%%%d\r\n" % len(pairs) if resp3 else b"*%d\r\n" % (2 * len(pairs))
            wire += head + b"".join(bulk(f, resp3) + bulk(v, resp3) for f, v in pairs)
        else:
            wire += b"*%d\r\n" % len(values) + b"".join(bulk(v, resp3) for v in values)
        reads.append((fields, whole, values))
    return reads, wire


@given(replies(), st.data())
@settings(max_examples=300)
def test_replies_read_natively_equal_hiredis_then_alignment(
    case: tuple[list[tuple[list[bytes], bool, object]], bytes], data: st.DataObject
) -> None:
    """resp_scan finds reply boundaries however the bytes arrive; resp_split packs each
    read's values in field order, as hiredis's parse followed by the alignment does."""
    reads, wire = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=5)))
    buf, pos, done = b"", 0, 0
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        buf += wire[start:end]
        pos, found = _native.resp_scan(buf, pos, len(reads) - done)
        done += found
        if end < len(wire):
            assert pos <= end
    assert (pos, done) == (len(wire), len(reads))
    plans = [_native.ReadPlan(fields, whole) for fields, whole, _ in reads]
    got = _native.resp_split(wire, plans)
    reader = hiredis.Reader(notEnoughData=None)
    reader.feed(wire)
    for (fields, whole, _), native_reply in zip(reads, got, strict=True):
        reference = reader.gets()
        if isinstance(reference, hiredis.ReplyError):
            assert native_reply == str(reference)
        elif whole:
            assert native_reply == pack(align_hash(reference, fields))
        else:
            assert native_reply == pack(reference)


def test_a_cut_reply_is_not_counted_and_garbage_is_refused() -> None:
    wire = b"*2\r\n$1\r\na\r\n$-1\r\n"
    for cut in range(len(wire)):
        assert _native.resp_scan(wire[:cut], 0, 1) == (0, 0)
    assert _native.resp_scan(wire, 0, 1) == (len(wire), 1)
    with pytest.raises(ValueError, match="RESP protocol error"):
        _native.resp_scan(b"?what\r\n", 0, 1)
    # a CR inside a line is refused at once, as hiredis refuses it (it used to leave the
    # read waiting for a CRLF until its timeout)
    for stray in (b"-ERR a\rb\r\n", b"*1\r\n$1\rx\r\na\r\n"):
        reader = hiredis.Reader()
        reader.feed(stray)
        with pytest.raises(hiredis.ProtocolError):
            reader.gets()
        with pytest.raises(ValueError, match="RESP protocol error"):
            _native.resp_scan(stray, 0, 1)


# --- REST rows ---------------------------------------------------------------------------

ROWS_REGISTRY = parse_registry(
    """
version: 1
entities:
  shop: {prefix: s, id_type: string, ttl: 7d}
  user: {prefix: u, id_type: int, ttl: 7d}
feature_groups:
  daily:
    entity: shop
    max_age: 1d
    features: {rating: float, tags: int_list, name: string}
  forever:
    entity: user
    features: {rating: float, vector: embedding(3)}
"""
)


def row_value(t: FeatureType, n: int) -> object:
    if t is FeatureType.EMBEDDING:
        return [0.5, -1.25, 3.0]
    if t is FeatureType.INT_LIST:
        return [n, -n]
    if t is FeatureType.STRING:
        return f'name "{n}"\n'
    return n / 7


ROWS = st.lists(
    st.tuples(
        st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(min_size=1),
        st.none() | st.integers(-10, 200_000),  # seconds since the write
        st.booleans(),  # served stale (Redis failing)
        st.lists(st.booleans(), min_size=3, max_size=3),  # which values are stored
    ),
    min_size=1,
    max_size=6,
)


def rows_lookup(
    group_name: str,
    rows: list[tuple],  # type: ignore[type-arg]
    compact: bool,
    picks: Sequence[int] | None = None,
) -> Lookup:
    """A lookup of ``rows`` (ROWS) of one group of ROWS_REGISTRY: of all its features, or
    of ``picks``; ``compact``: the entries keep no JSON."""
    group = ROWS_REGISTRY.groups[group_name]
    fmt = GroupFormat([f.codec for f in group.features])
    now = 1_800_000_000
    ids: list[object] = []
    entries = []
    for n, (entity_id, age, served_stale, stored) in enumerate(rows):
        reply = [
            f.codec.encode(row_value(f.type, n)) if keep else None
            for f, keep in zip(group.features, stored, strict=False)
        ]
        key = ("g", b"k")
        if age is None and not any(stored[: len(group.features)]):
            entry = Entry(key, fmt, None, fmt.absent_present, fmt.absent_json, None)
        else:
            raw, present, json = fmt.load(reply)
            written_at = None if age is None else now - age
            entry = Entry(key, fmt, raw, present, None if compact else json, written_at)
        ids.append(entity_id if entity_id is not None else n)
        entries.append([Resolved(entry, served_stale)])
    indices = range(len(group.features)) if picks is None else picks
    features = tuple(group.features[i] for i in indices)
    proj = Projection(
        group.entity,
        features,
        tuple(f.name for f in features),
        (group,),
        tuple((0, i) for i in indices),
        picks is None,
    )
    return Lookup(proj, ids, entries, now, [])  # type: ignore[arg-type]


@given(st.sampled_from(["daily", "forever"]), ROWS, st.booleans())
def test_whole_group_rows_are_the_references(
    group_name: str,
    rows: list[tuple],  # type: ignore[type-arg]
    compact: bool,
) -> None:
    """REST's and gRPC's rows of whole-group answers: native and reference, byte for byte;
    ``compact``: the entries keep no JSON (a compact cache's), and each answer makes it."""
    group = ROWS_REGISTRY.groups[group_name]
    lookup = rows_lookup(group_name, rows, compact)
    ids, entries, now = lookup.ids, lookup.entries, lookup.now
    native = _native.rest_rows(ids, entries, now, group.max_age_seconds, orjson.dumps(group.name))  # type: ignore[arg-type]
    assert native == b",".join(_whole_group_rows(lookup))
    assert orjson.loads(b"[" + native + b"]")[0]["id"] == ids[0]
    assert grpc_server._grpc_rows is not None  # the native core answers whole groups
    records = grpc_server.answer_rows(lookup, None)
    assert records == b"".join(grpc_server._answer_rows(lookup, None))
    answer = pb.GetFeaturesResponse.FromString(records)
    assert [r.id.WhichOneof("id") for r in answer.rows] == [
        "int_id" if isinstance(i, int) else "string_id" for i in ids
    ]


@given(st.sampled_from(["daily", "forever"]), ROWS, st.data())
def test_picked_rows_are_the_references(
    group_name: str,
    rows: list[tuple],  # type: ignore[type-arg]
    data: st.DataObject,
) -> None:
    """REST's rows of answers that pick some of a group's features, in any order: native
    (from the packed values) and reference, byte for byte."""
    count = len(ROWS_REGISTRY.groups[group_name].features)
    picks = data.draw(
        st.permutations(range(count)).flatmap(
            lambda p: st.sampled_from([p[:n] for n in range(1, count + 1)])
        )
    )
    lookup = rows_lookup(group_name, rows, compact=True, picks=picks)
    group = lookup.projection.groups[0]
    fmt = lookup.entries[0][0].entry.fmt
    assert fmt.native is not None  # the native core answers these values
    native = fmt.native.picked_rows(
        lookup.ids,
        lookup.entries,
        lookup.now,
        group.max_age_seconds,
        orjson.dumps(group.name),
        picks,
    )
    assert native == b",".join(_picked_rows(lookup)) == picked_rows(lookup)
    answered = orjson.loads(b"[" + native + b"]")
    assert [len(r["values"]) for r in answered] == [len(picks)] * len(rows)


# --- the Spark job's float features ------------------------------------------------------


@given(st.floats() | st.floats(width=32) | st.sampled_from([1e-45, -1e-46, 3.4028235e38, 3.5e38]))
@example(1e-5)
@example(123456790.0)
@example(1e16)
@example(0.0001)
def test_native_float_text_is_the_codecs(x: float) -> None:
    (got,) = _native.encode_float32_many([x])
    try:
        want = encode_float32(x)
    except EncodingError:
        assert got is None
        return
    assert got == want
