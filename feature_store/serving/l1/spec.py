"""What one feature group's read asks Redis for, and how its reply becomes a cache entry."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from feature_store.batch import Fault, FaultReason, hash_fields, reads_whole_hash
from feature_store.errors import EncodingError, EntityDataError
from feature_store.layout import decode_timestamp, encode_timestamp
from feature_store.native import GroupFormat
from feature_store.registry import FeatureGroup, Registry
from feature_store.serialization.answers import unpack
from feature_store.serving.l1.cache import CacheKey, Entry
from feature_store.windows import Layout, stored_answer


def _resp(fields: Sequence[bytes]) -> bytes:
    return b"".join(b"$%d\r\n%b\r\n" % (len(f), f) for f in fields)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    group: FeatureGroup
    fields: tuple[bytes, ...]  # every feature field, then the freshness field
    packed_fields: bytes  # the same, RESP-encoded once
    fmt: GroupFormat  # stored values -> answer bytes (native or the Python reference)
    hash_fields: int  # fields the entity's whole hash can hold, all groups together
    # read alone (the common read: one group of an entity), by HGETALL rather than HMGET
    # (``batch.reads_whole_hash``)
    whole_alone: bool
    # an aggregated group: its one field is its window state, answered at the time of the
    # read (``feature_store.windows``)
    windows: Layout | None = None

    @classmethod
    def of(cls, group: FeatureGroup, registry: Registry) -> GroupSpec:
        entity_fields = hash_fields(registry, group.entity.name)
        if group.aggregation is not None:
            fields: tuple[bytes, ...] = (group.windows_field,)
            fmt = GroupFormat([f.codec for f in group.features])
            return cls(group, fields, _resp(fields), fmt, entity_fields, False, Layout.of(group))
        fields = (*(f.field for f in group.features), group.freshness_field)
        return cls(
            group,
            fields,
            _resp(fields),
            GroupFormat([f.codec for f in group.features]),
            entity_fields,
            reads_whole_hash(len(fields), entity_fields),
        )

    def entry(
        self,
        key: CacheKey,
        reply: Sequence[bytes | None] | bytes,
        offset: int = 0,
        proto: bool = False,
        bare: bool = False,
    ) -> Entry:
        """This group's values in a read's reply, from value ``offset`` on (its fields in
        order, the freshness field last), as an entry; negative when the entity has
        nothing of this group. ``reply`` is a list of values, or the read's values packed
        (``feature_store._native.resp_split``). ``proto``: the entry is for a gRPC answer,
        so it gets the values' gRPC records and no JSON. ``bare``: for an answer written
        from the packed values, it gets neither (the records are written all the same, the
        cheaper check that every value decodes, and dropped)."""
        fmt, entity_key = self.fmt, key[1]
        records = proto or bare
        if self.windows is not None:
            return self._answered(key, reply, offset, records, bare)
        try:
            if isinstance(reply, bytes):
                (raw, present, answer), freshness = fmt.load_packed(reply, offset, records)
            else:
                part = reply if not offset else reply[offset : offset + len(self.fields)]
                raw, present, answer = fmt.load(part, records)
                freshness = part[len(self.fields) - 1]
        except EncodingError as e:  # name the feature: the reference decodes each value again
            values = unpack(reply) if isinstance(reply, bytes) else reply
            self._name_bad_value(entity_key, values[offset : offset + len(self.fields)])
            raise EntityDataError(f"{entity_key.decode(errors='replace')}: {e}") from None
        # the native core reads a well-formed write time itself (its unix seconds)
        written_at = (
            freshness if isinstance(freshness, int) else self.written_at(entity_key, freshness)
        )
        if written_at is None and present == fmt.absent_present:
            return Entry(key, fmt, None, fmt.absent_present, fmt.absent_json, None)
        if records:
            return Entry(key, fmt, raw, present, None, written_at, wire=None if bare else answer)
        return Entry(key, fmt, raw, present, answer, written_at)

    def _answered(
        self,
        key: CacheKey,
        reply: Sequence[bytes | None] | bytes,
        offset: int,
        records: bool,
        bare: bool,
    ) -> Entry:
        """An aggregated group's entry: its window state in the reply, answered now, as
        the values a plain group would have stored; it holds until the next tile boundary."""
        assert self.windows is not None
        fmt = self.fmt
        data = unpack(reply)[offset] if isinstance(reply, bytes) else reply[offset]
        if data is None:
            return Entry(key, fmt, None, fmt.absent_present, fmt.absent_json, None)
        wall, mono = time.time(), time.monotonic()
        try:
            stored, newest = stored_answer(data, self.windows, wall)
        except EncodingError as e:
            raise EntityDataError(f"{key[1].decode(errors='replace')}: {e}") from None
        stored.append(None if newest is None else encode_timestamp(newest / 1000))
        raw, present, answered = fmt.load(stored, records)
        written_at = None if newest is None else newest // 1000
        # the answer holds until the next tile boundary
        tile = self.windows.tile_ms
        until = mono + max(0.0, ((math.floor(wall * 1000) // tile + 1) * tile) / 1000 - wall)
        if records:
            wire = None if bare else answered
            return Entry(key, fmt, raw, present, None, written_at, wire=wire, until=until)
        return Entry(key, fmt, raw, present, answered, written_at, until=until)

    def _name_bad_value(self, entity_key: bytes, values: Sequence[bytes | None]) -> None:
        for f, r in zip(self.group.features, values, strict=False):
            if r is not None:
                try:
                    f.codec.decode(r)
                except EncodingError as e:
                    raise EntityDataError(
                        f"{entity_key.decode(errors='replace')} feature {f.name!r}: {e}"
                    ) from None

    def written_at(self, key: bytes, ts: bytes | None) -> int | None:
        """The group's write time (unix seconds), from its freshness field's value."""
        if ts is None:
            return None
        try:
            return decode_timestamp(ts)
        except ValueError:
            raise EntityDataError(
                f"{key.decode(errors='replace')}: the write time of group {self.group.name!r} "
                f"is not a unix time: {ts[:40]!r}",
                FaultReason.CORRUPT_WRITE_TIME,
            ) from None

    def fault_entry(self, key: CacheKey, error: EntityDataError) -> Entry:
        """The entry of an entity whose data of this group cannot be read: no values,
        answered with status "error" and ``error``'s reason."""
        fmt = self.fmt
        return Entry(
            key, fmt, None, fmt.absent_present, fmt.absent_json, None, fault=Fault.of(error)
        )
