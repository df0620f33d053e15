"""The whole on-Redis format in one place: keys, fields, freshness and expiry.

    key        "{prefix}:{entity_id}"            one HASH per entity
    field      xxh32(feature_name), 4 raw bytes   see serialization.names
    value      codec of the feature's type        see serialization.codecs
    freshness  field xxh32("__written_at__:{group}") = unix seconds of the group's last write
    expiry     EXPIRE key <entity ttl>, set by every writer on every write

A hash stays in Redis's compact listpack encoding only while every field and value is at
most ``hash-max-listpack-value`` bytes and it has at most ``hash-max-listpack-entries``
entries. A 32-dim embedding is 131 bytes, past the default 64, and one such value turns the
whole entity hash into a hashtable at about 3x the bytes. The Redis we ship and embed
raises the value limit (``LISTPACK_SETTINGS``); benchmarks/results/memory.md has the
measurement behind that choice, and ``listpack_value_needed`` tells an operator of an
external Redis what the registry needs.
"""

from __future__ import annotations

import re
from enum import StrEnum

from feature_store.errors import RequestError
from feature_store.serialization import FeatureType, field_name, varint

KEY_SEPARATOR = ":"
RESERVED_NAME_PREFIX = "__"  # feature names may not start with it: freshness fields use it
FRESHNESS_NAME = "__written_at__:{group}"

PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")  # no ':', no '{}' (cluster hash tags)
MAX_STRING_ID_BYTES = 512

# The listpack thresholds of the shipped redis.conf and of the embedded Redis.
# 1024 bytes fits a 250-dim float32 embedding; larger vectors fall back to a hashtable.
LISTPACK_SETTINGS: dict[str, str] = {
    "hash-max-listpack-value": "1024",
    "hash-max-listpack-entries": "512",
}


class IdType(StrEnum):
    INT = "int"
    STRING = "string"


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def entity_key(prefix: str, id_type: IdType, entity_id: object) -> bytes:
    """The Redis key of one entity. Raises RequestError for an id of the wrong type."""
    if id_type is IdType.INT:
        if type(entity_id) is not int or not INT64_MIN <= entity_id <= INT64_MAX:
            raise RequestError(f"entity id {entity_id!r} is not an int64")
        return f"{prefix}{KEY_SEPARATOR}{entity_id}".encode()
    if type(entity_id) is not str or not entity_id:
        raise RequestError(f"entity id {entity_id!r} is not a non-empty string")
    key = f"{prefix}{KEY_SEPARATOR}{entity_id}".encode()
    if len(key) - len(prefix) - 1 > MAX_STRING_ID_BYTES:
        raise RequestError(f"entity id is longer than {MAX_STRING_ID_BYTES} bytes")
    return key


def feature_field(feature_name: str) -> bytes:
    return field_name(feature_name)


def freshness_field(group_name: str) -> bytes:
    return field_name(FRESHNESS_NAME.format(group=group_name))


def encode_timestamp(unix_seconds: int) -> bytes:
    return str(unix_seconds).encode("ascii")


MAX_TIMESTAMP = 2**40  # unix seconds: year 36812; a larger or negative one is corrupt


def decode_timestamp(data: bytes) -> int:
    """A stored write time. ValueError for anything but decimal digits of a sane time."""
    if not data.isdigit():
        raise ValueError(f"not a unix time: {data[:40]!r}")
    value = int(data)
    if value > MAX_TIMESTAMP:
        raise ValueError(f"not a unix time: {value}")
    return value


def max_encoded_size(type_: FeatureType, dim: int | None) -> int | None:
    """The largest encoded value of a type in bytes, or None if it is unbounded."""
    if type_ is FeatureType.EMBEDDING and dim is not None:
        payload = 4 * dim
        return 1 + len(varint(payload)) + payload  # tag, length, packed floats
    if type_ in (FeatureType.FLOAT, FeatureType.DOUBLE):
        return 24
    if type_ is FeatureType.INT:
        return 20
    if type_ is FeatureType.BOOL:
        return 1
    return None
