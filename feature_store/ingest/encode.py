"""Arrow record batches to the write commands of ``batch.plan_write``, column at a time.

``plan_write`` encodes value by value from Python dicts. For a nightly refresh that is
most of the job's time, so this module produces the same commands from Arrow columns:

* Every value is encoded by the feature's shared codec (``Feature.codec.encode``), but for
  float features' text, which the native core writes (``feature_store.native``; property
  tests assert the codec's bytes, and the codec takes what the native code declines).
  Tests compare the commands with ``plan_write``'s for the same rows.
* Float columns are encoded once per distinct value: the column's IEEE bit patterns are
  deduplicated with numpy and each distinct pattern goes through the codec once (and is
  remembered across batches). Keying on bits, not on float equality, keeps ``-0.0`` apart
  from ``0.0`` and makes NaN a key like any other. Most float features are zero or a few
  recurring values, so this removes most codec calls.
* Rows are assembled in a numpy object matrix and turned into argument lists in one
  ``tolist()`` call instead of a Python loop per value.

Per entity the command is plan_write's: one guarded write (``layout.guarded_write``) of
the values, the null cells to remove and the group's event time: the job's snapshot time,
or each row's own from ``--event-time-column`` (a timestamp, unix seconds as a number, or
RFC 3339 text; a timestamp without a zone is UTC).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import snappy

from feature_store.batch import Command, event_time_seconds, refuse_aggregated
from feature_store.errors import EncodingError, RequestError
from feature_store.ingest.spec import BadReason, ColumnSpec, Source
from feature_store.layout import (
    IdType,
    encode_timestamp,
    entity_key,
    guarded_write,
    unguarded_write,
)
from feature_store.native import float32_encoder
from feature_store.registry import Feature, FeatureGroup
from feature_store.serialization import FeatureType, varint

MEMO_LIMIT = 1 << 20
_FLOAT32_MAX = float(
    np.finfo(np.float32).max
)  # distinct float encodings remembered per column before starting over

_FLOAT_TYPES = (FeatureType.FLOAT, FeatureType.DOUBLE)
_LIST_TYPES = (FeatureType.EMBEDDING, FeatureType.FLOAT_LIST, FeatureType.INT_LIST)
_TRUE_TEXT = {"true", "1", "t", "yes"}
_FALSE_TEXT = {"false", "0", "f", "no"}


@dataclass(frozen=True, slots=True)
class BadRow:
    index: int  # row position in the batch
    reason: BadReason
    detail: str


@dataclass(slots=True)
class EncodedBatch:
    """The good rows of one batch, ready to write, and the bad ones with their reasons."""

    keys: list[bytes] = field(default_factory=list)
    hset: list[list[bytes]] = field(default_factory=list)  # field, value, ..., freshness, ts
    hdel: list[list[bytes]] = field(default_factory=list)  # fields of null cells, or []
    values_written: int = 0
    values_removed: int = 0
    bad: list[BadRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)

    def counts(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Per entity ``start:stop``: values written and removed if its write applies."""
        return [
            (len(hset) // 2 - 1, len(hdel))  # the freshness pair is not a value
            for hset, hdel in zip(self.hset[start:stop], self.hdel[start:stop], strict=True)
        ]

    def commands(
        self, ttl_seconds: int, start: int = 0, stop: int | None = None, ordered: bool = True
    ) -> list[Command]:
        """The commands of entities ``start:stop``: plan_write's guarded call per entity,
        or (``ordered`` False) the same write unguarded."""
        end = len(self.keys) if stop is None else stop
        rows = zip(self.keys[start:end], self.hset[start:end], self.hdel[start:end], strict=True)
        if ordered:
            return [guarded_write(key, ttl_seconds, hdel, hset) for key, hset, hdel in rows]
        out: list[Command] = []
        for key, hset, hdel in rows:
            out += unguarded_write(key, ttl_seconds, hdel, hset)
        return out


class FloatMemos:
    """Encoded floats by codec type, width and IEEE bit pattern, bounded in entries.

    One instance can serve every task of a Python worker: the encoding of a value depends
    only on the codec's type, never on the feature. A full memo keeps what it has and
    takes no more: the values that recur (zero, counts, prices) come early and stay,
    while full-precision scores, which never repeat, would only churn it.
    """

    def __init__(self, limit: int = MEMO_LIMIT) -> None:
        self.limit = limit
        self._memos: dict[tuple[FeatureType, int], dict[int, bytes | EncodingError]] = {}

    def get(self, type_: FeatureType, width: int) -> dict[int, bytes | EncodingError]:
        return self._memos.setdefault((type_, width), {})


class _ColumnResult:
    __slots__ = ("errors", "values")

    def __init__(self, values: Sequence[bytes | None], errors: dict[int, tuple[BadReason, str]]):
        self.values = values
        self.errors = errors


class BatchEncoder:
    """Encodes Arrow batches of one feature group; float encodings are memoized in ``memos``."""

    def __init__(
        self,
        group: FeatureGroup,
        id_column: str,
        columns: Sequence[ColumnSpec],
        written_at: float,
        *,
        id_source: Source = Source.NATIVE,
        memos: FloatMemos | None = None,
        event_time_column: str | None = None,
        now: float | None = None,
    ) -> None:
        """``written_at``: the event time of every row, unless ``event_time_column`` names
        the column that holds each row's (then ``now`` bounds how far ahead one may be)."""
        by_name = {f.name: f for f in group.features}
        order = {f.name: i for i, f in enumerate(group.features)}
        # group order, so that a row's HSET matches plan_write's for a dict in that order
        self.columns = sorted(columns, key=lambda c: order[c.feature])
        self.features = [by_name[c.feature] for c in self.columns]
        refuse_aggregated(group)
        self.group = group
        self.id_column = id_column
        self.id_source = id_source
        self.freshness = [group.freshness_field, encode_timestamp(written_at)]
        self.event_time_column = event_time_column
        self.now = time.time() if now is None else now
        self.memos = FloatMemos() if memos is None else memos

    def encode(self, batch: pa.RecordBatch) -> EncodedBatch:
        n = batch.num_rows
        out = EncodedBatch()
        if n == 0:
            return out
        keys, bad = self._keys(batch.column(self.id_column))
        results = []
        any_null = np.zeros(n, dtype=bool)
        for spec, feature in zip(self.columns, self.features, strict=True):
            array = batch.column(spec.column)
            result = _encode_column(array, feature, spec.source, self.memos)
            for i, (reason, detail) in result.errors.items():
                bad.setdefault(i, (reason, f"column {spec.column!r}: {detail}"))
            if array.null_count:
                any_null |= array.is_null().to_numpy(zero_copy_only=False)
            results.append(result.values)

        k = len(results)
        matrix = np.empty((n, 2 * k + 2), dtype=object)
        for j, (feature, values) in enumerate(zip(self.features, results, strict=True)):
            matrix[:, 2 * j] = feature.field
            matrix[:, 2 * j + 1] = values
        matrix[:, 2 * k] = self.freshness[0]
        if self.event_time_column is None:
            matrix[:, 2 * k + 1] = self.freshness[1]
        else:
            column = self.event_time_column
            times = event_times(batch.column(column), self.now)
            for i, (reason, detail) in times.errors.items():
                bad.setdefault(i, (reason, f"column {column!r}: {detail}"))
            matrix[:, 2 * k + 1] = times.values
        event_time = 2 * k + 1
        rows: list[list[bytes]] = matrix.tolist()

        null_rows = set(np.flatnonzero(any_null).tolist())
        for i, (row, key) in enumerate(zip(rows, keys, strict=True)):
            if i in bad or key is None:
                continue
            if i in null_rows:
                hset: list[bytes] = []
                hdel: list[bytes] = []
                for j in range(0, 2 * k, 2):
                    if row[j + 1] is None:
                        hdel.append(row[j])
                    else:
                        hset += (row[j], row[j + 1])
                hset += (self.freshness[0], row[event_time])
                row = hset
                out.values_removed += len(hdel)
                out.values_written += len(hset) // 2 - 1
            else:
                hdel = []
                out.values_written += k
            out.keys.append(key)
            out.hset.append(row)
            out.hdel.append(hdel)
        out.bad = [BadRow(i, reason, detail) for i, (reason, detail) in sorted(bad.items())]
        return out

    def _keys(self, array: pa.Array) -> tuple[list[bytes | None], dict[int, tuple[BadReason, str]]]:
        entity = self.group.entity
        bad: dict[int, tuple[BadReason, str]] = {}
        keys: list[bytes | None] = []
        for i, raw in enumerate(array.to_pylist()):
            if raw is None:
                bad[i] = (BadReason.NULL_ID, f"column {self.id_column!r} is null")
                keys.append(None)
                continue
            value: object = raw
            if self.id_source is Source.TEXT and entity.id_type is IdType.INT:
                try:
                    value = int(raw)
                except ValueError:
                    bad[i] = (BadReason.INVALID_ID, f"id {raw!r} is not an integer")
                    keys.append(None)
                    continue
            try:
                keys.append(entity_key(entity.prefix, entity.id_type, value))
            except RequestError as e:
                bad[i] = (BadReason.INVALID_ID, str(e))
                keys.append(None)
        return keys, bad


def event_times(array: pa.Array, now: float) -> _ColumnResult:
    """Each row's event time as stored (``layout.encode_timestamp``): from a timestamp
    (without a zone: UTC), a number of unix seconds, or RFC 3339 text."""
    n = len(array)
    errors: dict[int, tuple[BadReason, str]] = {}
    seconds: list[object]
    if pa.types.is_timestamp(array.type):
        scale = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[array.type.unit]
        ints = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        seconds = (ints / scale).tolist()
    elif pa.types.is_integer(array.type) or pa.types.is_floating(array.type):
        seconds = array.cast(pa.float64()).fill_null(0).to_numpy(zero_copy_only=False).tolist()
    elif pa.types.is_decimal(array.type):
        seconds = array.cast(pa.float64()).fill_null(0).to_pylist()
    else:  # string: parsed (and checked) row by row below
        seconds = array.to_pylist()
    nulls = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
    memo: dict[object, bytes] = {}
    values: list[bytes | None] = [None] * n
    for i, value in enumerate(seconds):
        if nulls is not None and nulls[i]:
            errors[i] = (BadReason.NULL_EVENT_TIME, "no event time")
            continue
        encoded = memo.get(value)
        if encoded is None:
            try:
                encoded = encode_timestamp(event_time_seconds(value, now))
            except RequestError as e:
                errors[i] = (BadReason.INVALID_EVENT_TIME, str(e))
                continue
            memo[value] = encoded
        values[i] = encoded
    return _ColumnResult(values, errors)


def _encode_column(
    array: pa.Array, feature: Feature, source: Source, memos: FloatMemos
) -> _ColumnResult:
    if source is Source.TEXT:
        return _encode_values(array.to_pylist(), feature, _parser(feature.type))
    if feature.type in _FLOAT_TYPES and pa.types.is_floating(array.type):
        return _encode_floats(array, feature, memos)
    if feature.type is FeatureType.EMBEDDING:
        result = _encode_embeddings(array, feature)
        if result is not None:
            return result
    if feature.type is FeatureType.INT_LIST:
        result = _encode_int_lists(array, feature)
        if result is not None:
            return result
    return _encode_values(_cells(array), feature, None)


def _list_parts(array: pa.Array) -> tuple[np.ndarray, list[int]] | None:
    """A list column's flat values and offsets (from 0), or None if any item is null."""
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        return None
    flat = array.flatten()
    if flat.null_count:
        return None
    offsets = array.offsets.to_numpy()
    return flat.to_numpy(zero_copy_only=False), (offsets - offsets[0]).tolist()


def _encode_embeddings(array: pa.Array, feature: Feature) -> _ColumnResult | None:
    """Packed float32 protobuf bytes of a whole column at once, or None to use the codec.

    A FloatList of packed floats is a fixed header (tag, byte length) then the values as
    little-endian float32; the header is taken from the codec's own output. Columns with
    NaN (whose payload bits protobuf may not keep), values past the float32 range or
    null items go through the codec instead. Rows of the wrong dimension go through the
    codec too, which reports them. The first row is checked against the codec.
    """
    parts = _list_parts(array)
    if parts is None or not pa.types.is_floating(array.type.value_type):
        return None
    flat, offsets = parts
    if flat.dtype != np.float32:
        finite = flat[np.isfinite(flat)]
        if finite.size and float(np.abs(finite).max()) > _FLOAT32_MAX:
            return None
        flat = flat.astype(np.float32)
    if np.isnan(flat).any():
        return None
    dim = feature.dim or 0
    encode = feature.codec.encode
    header = encode([0.0] * dim)[: -4 * dim]
    raw = flat.astype("<f4", copy=False).tobytes()
    values: list[bytes | None] = []
    errors: dict[int, tuple[BadReason, str]] = {}
    for i, (a, b) in enumerate(itertools.pairwise(offsets)):
        if b - a == dim:
            values.append(header + raw[4 * a : 4 * b])
        else:
            values.append(None)
            try:
                encode(flat[a:b].tolist())
            except EncodingError as e:
                errors[i] = (BadReason.WRONG_EMBEDDING_DIM, str(e))
    return _checked(array, feature, values, errors)


def _encode_int_lists(array: pa.Array, feature: Feature) -> _ColumnResult | None:
    """Snappy-compressed packed-varint IntList bytes, varints made by numpy.

    Protobuf writes a packed ``repeated int64`` as tag, byte length, then each value's
    two's complement as a base-128 varint (10 bytes for negatives). The varints of the
    whole column are built at once; each row then costs one slice and one Snappy call.
    Empty lists and unsigned 64-bit columns go through the codec. The first row is
    checked against the codec.
    """
    parts = _list_parts(array)
    value_type = array.type.value_type if parts is not None else None
    if parts is None or not pa.types.is_integer(value_type) or value_type == pa.uint64():
        return None
    flat, offsets = parts
    words = flat.astype(np.int64).view(np.uint64)
    sizes = np.ones(len(words), dtype=np.int64)
    for k in range(1, 10):
        sizes += words >= np.uint64(1 << (7 * k))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    out = np.zeros(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
    for k in range(10):
        has = sizes > k
        if not has.any():
            break
        byte = (words[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes[has] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + k] = (byte | more).astype(np.uint8)
    payload = out.tobytes()
    byte_offsets = [0, *ends.tolist()]
    compress = snappy.compress
    encode = feature.codec.encode
    values: list[bytes | None] = []
    for a, b in itertools.pairwise(offsets):
        if a == b:
            values.append(encode([]))
            continue
        body = payload[byte_offsets[a] : byte_offsets[b]]
        values.append(bytes(compress(b"\x0a" + varint(len(body)) + body)))
    return _checked(array, feature, values, {})


def _checked(
    array: pa.Array,
    feature: Feature,
    values: list[bytes | None],
    errors: dict[int, tuple[BadReason, str]],
) -> _ColumnResult:
    """Refuse to write if the column-wise bytes of the first good row differ from the codec's."""
    for i, value in enumerate(values):
        if value is not None and not array[i].is_valid:
            values[i] = None
            continue
        if value is not None:
            expected = feature.codec.encode(array[i].as_py())
            if value != expected:
                raise EncodingError(
                    f"column-wise encoding of feature {feature.name!r} differs from its codec "
                    f"({value[:40]!r} != {expected[:40]!r}); refusing to write"
                )
            break
    if array.null_count:
        for i in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)).tolist():
            values[i] = None
            errors.pop(i, None)
    return _ColumnResult(values, errors)


def _cells(array: pa.Array) -> list[object]:
    """The column as Python values. Lists go through numpy: ``to_pylist`` is far slower."""
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        return array.to_pylist()  # type: ignore[no-any-return]
    flat = array.flatten()  # the children of this (possibly sliced) array only
    items = flat.to_pylist() if flat.null_count else flat.to_numpy(zero_copy_only=False).tolist()
    offsets = array.offsets.to_numpy()
    offsets = (offsets - offsets[0]).tolist()
    cells: list[object] = [items[a:b] for a, b in itertools.pairwise(offsets)]
    if array.null_count:
        for i in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)).tolist():
            cells[i] = None
    return cells


def _encode_floats(array: pa.Array, feature: Feature, memos: FloatMemos) -> _ColumnResult:
    """Encode each distinct IEEE bit pattern once (see the module docstring)."""
    if array.type == pa.float16():
        array = array.cast(pa.float32())
    float_dtype = np.float32 if array.type == pa.float32() else np.float64
    bits_dtype = np.uint32 if float_dtype is np.float32 else np.uint64
    n = len(array)
    bits = np.frombuffer(array.buffers()[1], dtype=bits_dtype, count=array.offset + n)
    bits = bits[array.offset :]
    uniq, inverse = np.unique(bits, return_inverse=True)
    memo = memos.get(feature.type, bits.itemsize)
    room = memos.limit - len(memo)
    encode = feature.codec.encode
    encoded = np.empty(len(uniq), dtype=object)
    failed = False
    patterns, floats = uniq.tolist(), uniq.view(float_dtype).tolist()
    fast = None
    native = float32_encoder() if feature.type is FeatureType.FLOAT else None
    if native is not None:  # one native call for every pattern not remembered yet
        fast = iter(native([v for p, v in zip(patterns, floats, strict=True) if p not in memo]))
    for j, (pattern, value) in enumerate(zip(patterns, floats, strict=True)):
        got = memo.get(pattern)
        if got is None:
            got = None if fast is None else next(fast)
            if got is None:  # the codec: without the extension, or to raise its error
                try:
                    got = encode(value)
                except EncodingError as e:
                    got = e
            if room > 0:
                memo[pattern] = got
                room -= 1
        if isinstance(got, EncodingError):
            failed = True
        encoded[j] = got
    values = encoded[inverse.reshape(-1)]
    if array.null_count:
        values[array.is_null().to_numpy(zero_copy_only=False)] = None
    errors: dict[int, tuple[BadReason, str]] = {}
    if failed:
        for i, v in enumerate(values.tolist()):
            if isinstance(v, EncodingError):
                errors[i] = (BadReason.INVALID_VALUE, str(v))
                values[i] = None
    return _ColumnResult(values, errors)


def _encode_values(
    cells: list[object], feature: Feature, parse: Callable[[str], object] | None
) -> _ColumnResult:
    encode = feature.codec.encode
    if parse is None:
        try:  # the common case: every cell encodes
            return _ColumnResult([None if v is None else encode(v) for v in cells], {})
        except EncodingError:
            pass
    values: list[bytes | None] = []
    errors: dict[int, tuple[BadReason, str]] = {}
    for i, cell in enumerate(cells):
        if cell is None:
            values.append(None)
            continue
        value = cell
        if parse is not None:
            try:
                value = parse(str(cell))
            except ValueError as e:
                errors[i] = (BadReason.UNPARSEABLE_VALUE, f"{_short(cell)}: {e}")
                values.append(None)
                continue
        try:
            values.append(encode(value))
        except EncodingError as e:
            errors[i] = (_reason(feature, value), str(e))
            values.append(None)
    return _ColumnResult(values, errors)


def _reason(feature: Feature, value: object) -> BadReason:
    if (
        feature.type is FeatureType.EMBEDDING
        and isinstance(value, list)
        and len(value) != feature.dim
    ):
        return BadReason.WRONG_EMBEDDING_DIM
    return BadReason.INVALID_VALUE


def _parser(type_: FeatureType) -> Callable[[str], object]:
    if type_ in _FLOAT_TYPES:
        return _parse_float
    if type_ is FeatureType.INT:
        return _parse_int
    if type_ is FeatureType.BOOL:
        return _parse_bool
    if type_ in _LIST_TYPES:
        return _parse_list
    return str


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not an integer") from None


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE_TEXT:
        return True
    if low in _FALSE_TEXT:
        return False
    raise ValueError("not a boolean (true/false/1/0)")


def _parse_list(text: str) -> list[object]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("not a JSON list") from None
    if not isinstance(value, list):
        raise ValueError("not a JSON list")
    return value


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
