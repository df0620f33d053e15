"""What one feature group's read asks Redis for, and how its reply decodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from feature_store.batch import hash_fields
from feature_store.errors import EncodingError
from feature_store.layout import decode_timestamp
from feature_store.registry import FeatureGroup, Registry
from feature_store.serialization import Value


def _resp(fields: Sequence[bytes]) -> bytes:
    return b"".join(b"$%d\r\n%b\r\n" % (len(f), f) for f in fields)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    group: FeatureGroup
    fields: tuple[bytes, ...]  # every feature field, then the freshness field
    packed_fields: bytes  # the same, RESP-encoded once
    decoders: tuple[Callable[[bytes], Value], ...]
    hash_fields: int  # fields the entity's whole hash can hold, all groups together

    @classmethod
    def of(cls, group: FeatureGroup, registry: Registry) -> GroupSpec:
        fields = (*(f.field for f in group.features), group.freshness_field)
        return cls(
            group,
            fields,
            _resp(fields),
            tuple(f.codec.fast_decode for f in group.features),
            hash_fields(registry, group.entity.name),
        )

    def decode(self, key: bytes, reply: Sequence[bytes | None]) -> tuple[Value | None, ...] | None:
        """The group's values, or None when the entity has nothing of this group."""
        raw = reply[:-1]
        if reply[-1] is None and all(r is None for r in raw):
            return None
        try:
            return tuple(
                [None if r is None else d(r) for d, r in zip(self.decoders, raw, strict=True)]
            )
        except ValueError:  # fast decoders raise plain ValueError; find the culprit
            for f, r in zip(self.group.features, raw, strict=True):
                if r is not None:
                    try:
                        f.codec.decode(r)
                    except EncodingError as e:
                        raise EncodingError(
                            f"{key.decode(errors='replace')} feature {f.name!r}: {e}"
                        ) from None
            raise EncodingError(f"{key.decode(errors='replace')}: undecodable value") from None

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
