"""The whole on-Redis format in one place: keys, fields, freshness and expiry.

    key        "{prefix}:{entity_id}"            one HASH per entity
    field      xxh32(feature_name), 4 raw bytes   see serialization.names
    value      codec of the feature's type        see serialization.codecs
    freshness  field xxh32("__written_at__:{group}") = the event time of the group's values:
               unix seconds, with up to 3 decimals ("1767225600" or "1767225600.25")
    windows    field xxh32("__windows__:{group}") of an aggregated group = its tiles of
               partial aggregates, its newest event and the stream offsets applied, as
               JSON after a version ("7|[...]"); see feature_store.windows
    expiry     EXPIRE key <entity ttl>, set by every writer on every write
    ordering   every write of one entity's group is one call of WRITE_SCRIPT, which changes
               nothing if the stored event time is newer (see ``guarded_write``)

A hash stays in Redis's compact listpack encoding only while every field and value is at
most ``hash-max-listpack-value`` bytes and it has at most ``hash-max-listpack-entries``
entries. A 32-dim embedding is 131 bytes, past the default 64, and one such value turns the
whole entity hash into a hashtable at about 3x the bytes. The Redis we ship and embed
raises the value limit (``LISTPACK_SETTINGS``); benchmarks/results/memory.md has the
measurement behind that choice, and ``listpack_value_needed`` tells an operator of an
external Redis what the registry needs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from enum import StrEnum

from feature_store.errors import RequestError
from feature_store.serialization import FeatureType, field_name, varint

KEY_SEPARATOR = ":"
RESERVED_NAME_PREFIX = "__"  # feature names may not start with it: freshness fields use it
FRESHNESS_NAME = "__written_at__:{group}"
WINDOWS_NAME = "__windows__:{group}"

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


_INT = IdType.INT  # a module constant: an enum member read off its class costs ~200 ns


def entity_key(prefix: str, id_type: IdType, entity_id: object) -> bytes:
    """The Redis key of one entity. Raises RequestError for an id of the wrong type."""
    if id_type is _INT:
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


def windows_field(group_name: str) -> bytes:
    """The field of an aggregated group's tiles (``feature_store.windows``)."""
    return field_name(WINDOWS_NAME.format(group=group_name))


MAX_TIMESTAMP = 2**40  # unix seconds: year 36812; a larger or negative one is corrupt


def encode_timestamp(unix_seconds: float) -> bytes:
    """An event time as stored: whole seconds, or seconds and milliseconds ("12.5" -> b"12.5").

    Milliseconds are what order two events of one entity a moment apart; finer fractions
    are rounded to the nearest one. ValueError for a negative or absurd time.
    """
    if unix_seconds != unix_seconds or not 0 <= unix_seconds <= MAX_TIMESTAMP:
        raise ValueError(f"not a unix time: {unix_seconds!r}")
    seconds, millis = divmod(round(unix_seconds * 1000), 1000)
    if not millis:
        return b"%d" % seconds
    return (b"%d.%03d" % (seconds, millis)).rstrip(b"0")


def decode_timestamp(data: bytes) -> int:
    """A stored event time in whole seconds (the fraction dropped). ValueError for anything
    but the digits of a sane time, with at most one decimal point."""
    whole, dot, fraction = data.partition(b".")
    if not whole.isdigit() or (dot and not (fraction.isdigit() and len(fraction) <= 9)):
        raise ValueError(f"not a unix time: {data[:40]!r}")
    value = int(whole)
    if value > MAX_TIMESTAMP:
        raise ValueError(f"not a unix time: {value}")
    return value


# The ordering guard: one call per entity and group write (one key, so Redis Cluster routes
# it like any command on that key). The compare and the write are one script, so no other
# writer can come between them. An older event time changes nothing; an equal one writes
# (a redelivered event writes the same bytes again, and a correction made at the same event
# time lands instead of being dropped unseen); a stored time that is not a number is treated
# as absent. Replies: 0 skipped (older), 1 written, 2 written over an equal event time.
#   KEYS[1] the entity's key
#   ARGV    ttl, n, n fields to remove, field/value pairs..., freshness field, event time
WRITE_SCRIPT = b"""\
local n = tonumber(ARGV[2])
local event_time = tonumber(ARGV[#ARGV])
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[#ARGV - 1]) or '')
local verdict = 1
if held then
  if event_time < held then return 0 end
  if event_time == held then verdict = 2 end
end
if n > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV, 3, 2 + n)) end
redis.call('HSET', KEYS[1], unpack(ARGV, 3 + n))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return verdict
"""
WRITE_SCRIPT_SHA = hashlib.sha1(WRITE_SCRIPT).hexdigest()
SKIPPED, WRITTEN, WRITTEN_EQUAL = 0, 1, 2  # WRITE_SCRIPT's replies


# An aggregated group's state (``feature_store.windows``) is replaced only by a writer that
# read the version now stored: a compare-and-set, so that two writers of one entity (events
# of it in two Kafka partitions, a backfill beside a stream) never lose each other's
# events; the loser reads again and applies its events to the new state. The state's
# version is the digits before its first '|' ("" when there is none). Replies: 1 written,
# 0 the version changed (nothing written).
#   KEYS[1] the entity's key
#   ARGV    the windows field, the version read, the new state, ttl
WINDOWS_SCRIPT = b"""\
local held = redis.call('HGET', KEYS[1], ARGV[1])
local version = ''
if held then version = string.match(held, '^(%d+)|') or '' end
if version ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""
WINDOWS_SCRIPT_SHA = hashlib.sha1(WINDOWS_SCRIPT).hexdigest()
SCRIPTS = {WRITE_SCRIPT_SHA: WRITE_SCRIPT, WINDOWS_SCRIPT_SHA: WINDOWS_SCRIPT}


def windows_write(
    key: bytes, field: bytes, version: int, state: bytes, ttl_seconds: int
) -> tuple[bytes | str | int, ...]:
    """One entity's new window state as a WINDOWS_SCRIPT call; ``version`` is the one read
    (0: none was stored)."""
    held = b"%d" % version if version else b""
    return ("EVALSHA", WINDOWS_SCRIPT_SHA, 1, key, field, held, state, ttl_seconds)


def guarded_write(
    key: bytes, ttl_seconds: int, remove: Sequence[bytes], hset: Sequence[bytes]
) -> tuple[bytes | str | int, ...]:
    """One entity's write of one group as a WRITE_SCRIPT call. ``hset`` is the field/value
    pairs to set, ending with the group's freshness field and the event time."""
    return ("EVALSHA", WRITE_SCRIPT_SHA, 1, key, ttl_seconds, len(remove), *remove, *hset)


def with_script(command: tuple[bytes | str | int, ...]) -> tuple[bytes | str | int, ...]:
    """A guarded write sent with the script's text (EVAL) instead of its digest: for a
    server that answered NOSCRIPT (restarted, flushed, or a replica promoted since the
    script was loaded). EVAL caches the script there, so the next EVALSHA finds it; no
    SCRIPT LOAD has to reach every node of a cluster, some of which may be down."""
    if command[0] != "EVALSHA" or command[1] not in SCRIPTS:
        return command
    return ("EVAL", SCRIPTS[command[1]], *command[2:])


def unguarded_write(
    key: bytes, ttl_seconds: int, remove: Sequence[bytes], hset: Sequence[bytes]
) -> list[tuple[bytes | str | int, ...]]:
    """The same write without the guard, last writer wins: HDEL, HSET, EXPIRE. For a first
    load into an empty store. A connection lost between them leaves old values under their
    old time, or a removed value, never an old value under a new time."""
    out: list[tuple[bytes | str | int, ...]] = [("HDEL", key, *remove)] if remove else []
    out += [("HSET", key, *hset), ("EXPIRE", key, ttl_seconds)]
    return out


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


def unguarded(command: tuple[bytes | str | int, ...]) -> list[tuple[bytes | str | int, ...]]:
    """A ``guarded_write`` command as the same write without the guard (benchmarks compare
    the two; ``--no-ordering`` writes so)."""
    key, ttl, n, rest = command[3], command[4], command[5], command[6:]
    if not (isinstance(key, bytes) and isinstance(ttl, int) and isinstance(n, int)):
        raise ValueError(f"not a guarded write: {command[:6]!r}")
    return unguarded_write(key, ttl, rest[:n], rest[n:])  # type: ignore[arg-type]
