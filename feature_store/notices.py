"""What writers tell serving instances, over Redis pub/sub: the messages and the channel.

Every writer publishes on ``CHANNEL`` after it writes, so that the serving instances' L1
caches do not hide the new values until their TTL:

- ``{"origin": o, "group": g, "keys": [k, ...], "written": t}``: these entity keys changed
  (push writes through the serving API, small library writes, the stream writer) at ``t``
  (unix seconds; optional). Serving drops the entries, and reports ``t`` as the group's
  last write.
- ``{"origin": o, "group": g, "generation": t}``: the group was written in bulk (the Spark
  job, a large library write) that ended at ``t`` (unix seconds, wall clock). Serving
  refreshes, in the background and at a bounded rate, every entry of the group it read
  from Redis before ``t``, and serves the current entry meanwhile: no mass drop, no
  stampede. (Not the event time of the values: a bulk write of old events must still
  refresh entries read before it.)

Pub/sub delivers at most once: a writer that cannot publish logs it and the write stands;
the cache TTL stays the bound. Also here: the Redis key of a group's warm-start snapshot
(the hot keys a serving worker last had), which a starting worker reads.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence

import orjson

from feature_store.registry import FeatureGroup

log = logging.getLogger(__name__)

CHANNEL = "feature_store:invalidate"
KEYS_MAX = 1000  # a write of more entities than this announces a generation, not keys
WARM_KEY = "feature_store:warm:{group}"


def new_origin() -> str:
    """An id for one publisher, so that an instance can tell its own messages."""
    return uuid.uuid4().hex


def keys_message(
    origin: str, group: str, keys: Sequence[bytes], written: float | None = None
) -> bytes:
    doc: dict[str, object] = {"origin": origin, "group": group, "keys": [k.decode() for k in keys]}
    if written is not None:
        doc["written"] = round(written, 3)
    return orjson.dumps(doc)


def generation_message(origin: str, group: str, generation: float) -> bytes:
    """A bulk write of ``group`` that ended at ``generation`` (unix seconds, to the
    millisecond): entries read before it are refreshed."""
    return orjson.dumps({"origin": origin, "group": group, "generation": round(generation, 3)})


def write_message(origin: str, group: str, keys: Sequence[bytes], now: float) -> bytes:
    """The message for a write of ``keys``: the keys themselves, or a generation if many."""
    if len(keys) <= KEYS_MAX:
        return keys_message(origin, group, keys, now)
    return generation_message(origin, group, now)


def parse(data: bytes) -> Mapping[str, object] | None:
    """A message as a dict with 'group' and 'keys' or 'generation'; None if malformed."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("group"), str):
        return None
    keys, generation = doc.get("keys"), doc.get("generation")
    if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
        written = doc.get("written")
        if written is not None and not (type(written) in (int, float) and 0 <= written < 2**40):
            return None
        return doc
    if type(generation) in (int, float) and 0 <= generation < 2**40:  # type: ignore[operator]
        return doc
    return None


def group_fingerprint(group: FeatureGroup) -> str:
    """What a cached entry of the group depends on: its features' names, types and order,
    its entity type's prefix and id type. Equal fingerprints: entries mean the same."""
    parts = [
        group.name,
        group.entity.prefix,
        group.entity.id_type.value,
        [(f.name, f.type.value, f.dim) for f in group.features],
    ]
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:16]
