"""What one feature group's read asks Redis for, and how its reply becomes a cache entry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from feature_store.batch import hash_fields
from feature_store.errors import EncodingError
from feature_store.layout import decode_timestamp
from feature_store.native import GroupFormat
from feature_store.registry import FeatureGroup, Registry
from feature_store.serving.cache import CacheKey, Entry


def _resp(fields: Sequence[bytes]) -> bytes:
    return b"".join(b"$%d\r\n%b\r\n" % (len(f), f) for f in fields)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    group: FeatureGroup
    fields: tuple[bytes, ...]  # every feature field, then the freshness field
    packed_fields: bytes  # the same, RESP-encoded once
    fmt: GroupFormat  # stored values -> answer bytes (native or the Python reference)
    hash_fields: int  # fields the entity's whole hash can hold, all groups together

    @classmethod
    def of(cls, group: FeatureGroup, registry: Registry) -> GroupSpec:
        fields = (*(f.field for f in group.features), group.freshness_field)
        return cls(
            group,
            fields,
            _resp(fields),
            GroupFormat([f.codec for f in group.features]),
            hash_fields(registry, group.entity.name),
        )

    def entry(self, key: CacheKey, reply: Sequence[bytes | None]) -> Entry:
        """The reply's values of this group (its fields in order, the freshness field last)
        as an entry; negative when the entity has nothing of this group."""
        fmt, entity_key = self.fmt, key[1]
        written_at = self.written_at(entity_key, reply)
        if written_at is None and all(r is None for r in reply):
            return Entry(key, fmt, None, fmt.absent_present, fmt.absent_json, None)
        try:
            raw, present, json = fmt.load(reply)
        except EncodingError:  # name the feature: the reference decodes each value again
            for f, r in zip(self.group.features, reply, strict=False):
                if r is not None:
                    try:
                        f.codec.decode(r)
                    except EncodingError as e:
                        raise EncodingError(
                            f"{entity_key.decode(errors='replace')} feature {f.name!r}: {e}"
                        ) from None
            raise
        return Entry(key, fmt, raw, present, json, written_at)

    def written_at(self, key: bytes, reply: Sequence[bytes | None]) -> int | None:
        """The group's write time (unix seconds), from the freshness field of the reply."""
        ts = reply[-1]
        if ts is None:
            return None
        try:
            return decode_timestamp(ts)
        except ValueError:
            raise EncodingError(
                f"{key.decode(errors='replace')}: the write time of group {self.group.name!r} "
                f"is not a unix time: {ts[:40]!r}"
            ) from None
