"""GetFeaturesResponse (serving.proto) written as protobuf wire bytes, straight from the cache.

Building a message object per value and serializing it cost more than the Redis round trip
(a peer feature server converts messages to dicts and JSON per value). Protobuf's wire
format is a concatenation of (tag, length, bytes) records, so the response is assembled
from pieces: each cached entry keeps its values' ``FeatureRow.values`` records, made from
the stored bytes on first use by the native core (or its reference,
``serialization.answers``), and a response is a join of those with the ids, statuses and
ages written here. tests/integration/test_serving_grpc.py
parses the result with the generated classes, which checks this encoder against the .proto.

Field numbers below mirror proto/feature_store/proto/v1/serving.proto.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from feature_store.batch import EntityError, EntityId
from feature_store.serialization import varint
from feature_store.serialization.answers import MISSING_VALUE
from feature_store.serving.l1.cache import Entry
from feature_store.serving.l1.loader import Resolved

PRESENT, MISSING, STALE, ERROR = 1, 2, 3, 4  # serving.proto Status
_PRESENT_CODES = bytes([MISSING, PRESENT]) + bytes(254)
_STALE_CODES = bytes([MISSING, STALE]) + bytes(254)


def record(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte (field << 3 | 2), length, payload."""
    return bytes((tag,)) + varint(len(payload)) + payload


def entry_values(entry: Entry, charge: Callable[[Entry], None] | None) -> bytes:
    """An entry's ``FeatureRow.values`` records, made on first use and kept on the entry
    when ``charge`` counts the growth against the cache's byte bound (None: not kept, as
    in a compact cache)."""
    found = entry.wire
    if found is None:
        raw = entry.raw
        found = MISSING_VALUE * len(entry.present) if raw is None else entry.fmt.proto(raw)
        if charge is not None:
            entry.wire = found
            charge(entry)
    return found


def picked_values(
    picks: Sequence[tuple[int, int]], resolved: Sequence[Resolved], stale: Sequence[bool]
) -> tuple[bytes, bytes]:
    """The values records and the packed statuses of some features of one row's groups."""
    parts = [e.fmt.proto_parts(e.raw) if e.raw is not None else None for e, _ in resolved]
    values, codes = [], bytearray()
    for gi, fi in picks:
        part = parts[gi]
        if part is None or not resolved[gi].entry.present[fi]:
            values.append(MISSING_VALUE)
            codes.append(MISSING if resolved[gi].entry.fault is None else ERROR)
        else:
            values.append(part[fi])
            codes.append(STALE if stale[gi] else PRESENT)
    return b"".join(values), record(0x1A, bytes(codes))


def entity_id(value: EntityId) -> bytes:
    """FeatureRow.id = 1, an EntityId: int_id = 1 (varint) or string_id = 2."""
    if isinstance(value, int):
        return record(0x0A, b"\x08" + varint(value))
    return record(0x0A, record(0x12, value.encode()))


def statuses(present: bytes, stale: bool) -> bytes:
    """FeatureRow.statuses = 3, packed enum (every code fits one byte), of a whole group:
    from the entry's ``present`` bytes (1 value, 0 none) by one translate in C."""
    return record(0x1A, present.translate(_STALE_CODES if stale else _PRESENT_CODES))


def error_statuses(count: int) -> bytes:
    """FeatureRow.statuses of a whole group whose stored data cannot be read."""
    return record(0x1A, bytes([ERROR]) * count)


def errors(faults: Sequence[EntityError]) -> bytes:
    """GetFeaturesResponse.errors = 4: id = 1, group = 2, reason = 3, message = 4."""
    return b"".join(
        record(
            0x22,
            entity_id(e.entity_id)
            + record(0x12, e.group.encode())
            + record(0x1A, e.reason.encode())
            + record(0x22, e.message.encode()),
        )
        for e in faults
    )


def ages(values: dict[str, int | None]) -> bytes:
    """FeatureRow.ages = 4, map<string, int64>: one entry record per known age."""
    out = b""
    for group, age in values.items():
        if age is not None:
            out += record(0x22, record(0x0A, group.encode()) + b"\x10" + varint(age))
    return out


def header(entity_type: str, names: Sequence[str]) -> bytes:
    """GetFeaturesResponse.entity_type = 1 and features = 2."""
    return record(0x0A, entity_type.encode()) + b"".join(record(0x12, n.encode()) for n in names)


def row(payload: bytes) -> bytes:
    """GetFeaturesResponse.rows = 3."""
    return record(0x1A, payload)
