"""Warm start: a starting worker loads the hot set that running workers last had.

Every worker keeps, per feature group, a snapshot of its most recently used entity keys in
Redis (``notices.WARM_KEY``: the keys and the group's fingerprint), written every
``warm_snapshot_interval`` seconds and when it stops. A starting worker reads the
snapshots and loads those keys through the reader, in coalesced round trips, before it
serves: values come from Redis, so they are current, and only keys travel. It stops at
``warm_start_keys`` keys or ``warm_start_seconds``, whichever comes first (the runtime
bounds the time), so readiness never waits longer than that.

A snapshot written by a worker whose registry defines the group differently (another
fingerprint: features, types, prefix or id type changed) is not used for that group, with
a log line.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from feature_store import notices
from feature_store.connection import AsyncClient, translated_errors
from feature_store.errors import StoreError
from feature_store.registry import Registry
from feature_store.serving.l1.loader import CachedReader

log = logging.getLogger(__name__)

SNAPSHOT_TTL = 86_400  # seconds a snapshot is kept when no worker writes a newer one
LOAD_CHUNK = 500  # keys per coalesced read while warming


class WarmStart:
    def __init__(
        self, registry: Registry, reader: CachedReader, client: AsyncClient, max_keys: int
    ) -> None:
        self.registry = registry
        self.reader = reader
        self.client = client
        self.max_keys = max_keys
        self.fingerprints = {
            name: notices.group_fingerprint(g) for name, g in registry.groups.items()
        }
        self.loaded: dict[str, int] = {}  # per group, by the last load()

    async def snapshot(self) -> int:
        """Write this worker's hot keys of every group; the number of keys written."""
        cache = self.reader.cache
        if cache is None:
            return 0
        written = 0
        for group, fingerprint in self.fingerprints.items():
            keys = cache.keys(group, most_recent_first=True)[: self.max_keys]
            if not keys:
                continue
            doc = {
                "fingerprint": fingerprint,
                "saved_at": int(time.time()),
                "keys": [k[1].decode() for k in keys],
            }
            with translated_errors():
                await self.client.set(
                    notices.WARM_KEY.format(group=group), orjson.dumps(doc), ex=SNAPSHOT_TTL
                )
            written += len(keys)
        return written

    async def snapshots_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.snapshot()
            except StoreError as e:
                log.warning("could not save the warm-start snapshot: %s", e)

    async def load(self) -> int:
        """Load the hot keys of every group's snapshot; the number of entries loaded.

        Counted into ``self.loaded`` as it goes, so that a caller's timeout leaves a count.
        """
        budget = self.max_keys
        for group, fingerprint in self.fingerprints.items():
            if budget <= 0:
                break
            keys = await self._snapshot_keys(group, fingerprint)
            self.loaded[group] = 0
            for start in range(0, min(len(keys), budget), LOAD_CHUNK):
                chunk = keys[start : min(start + LOAD_CHUNK, budget)]
                # a key with bad data becomes a fault entry (logged by the reader); the
                # entries keep no answer bytes: each API makes its own on first use
                await self.reader.get([(group, k) for k in chunk], bare=True)
                self.loaded[group] += len(chunk)
                if self.reader.cache is not None:
                    self.reader.cache.stats.warm_loaded += len(chunk)
            budget -= self.loaded[group]
        return sum(self.loaded.values())

    async def _snapshot_keys(self, group: str, fingerprint: str) -> list[bytes]:
        with translated_errors():
            raw = await self.client.get(notices.WARM_KEY.format(group=group))
        if raw is None:
            return []
        try:
            doc = orjson.loads(raw)
            theirs, keys = doc["fingerprint"], [k.encode() for k in doc["keys"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            log.warning("warm start: the snapshot of group %s is malformed; not used", group)
            return []
        if theirs != fingerprint:
            log.warning(
                "warm start: the snapshot of group %s comes from a registry where the group "
                "differs (fingerprint %s, here %s); not used",
                group,
                theirs,
                fingerprint,
            )
            return []
        return keys
