"""Cache hits answered on the native fronts' threads (``native/src/hits/``): REST, gRPC,
and Feast's ``/get-online-features`` (its columns written from the entries' JSON).

The worker's L1 is one cache in the extension (``l1/native_cache.py``): the fronts answer
from its entries and load their misses into it, and Python's lookups use the same entries.
``NativeHits`` teaches it each request form that Python answered with one group's values,
or with several groups' of one entity (``learner(api)``). The fronts then answer such a
request without taking the GIL (gRPC only for a caller whose key may read) from entries
that hold the answer bytes of its API: an entry keeps those of the API whose lookup loaded
it (JSON, or gRPC records), and the other API's are made on its first use. In a compact
cache (``CACHE_FORM=compact``) an entry holds its packed values alone, and the front writes
each answer's JSON or gRPC records from them with the group's value types (taught by
``define_read``). A lookup in such a form with entities missing or expired is loaded by the
front itself, on its own Redis connections (``load.rs``: single flight, decoded and stored
there, no Python). Where the front cannot load them (no connection of its own: a TLS or
unix-socket URL; a cluster's redirect; a reply only Python reads) or an entry lacks its
API's answer bytes, it hands Python only those keys (``fill``): they load through the
cache's policy (single-flight, coalescing, the counters) into the same cache, and the front
answers the whole lookup from it, so a batch of 1,000 ids with 100 misses costs Python 100
loads, not 1,000 lookups. Where they do not all load (Redis failing, an entity's data
broken, an entry not kept) and for every other request (a form not seen yet, anything
Python would refuse) the handler answers, as before.

What a hit decides besides its answer stays here, decided by the code that decides it for
hits in Python: every DRAIN_EVERY seconds ``drain`` takes what the front served (hits for
the cache's counters, answer times for the request histogram, entities served) and the keys
hit inside their refresh window or sampled for a shadow check, which go through
``CachedReader.noted_hit`` and ``ShadowChecker.sample``; but an entry the fronts loaded
themselves is refreshed ahead by them (read again on their connections, ``lookup.rs``), so
that a hot entry stays theirs and never reaches Python. After a batch write of its group
such an entry is outdated: the fronts read it again on its next hit, or when the policy's
background sweep hands its key over (``refresh_outdated``, at ``refresh_rate``), so it
stays theirs then too. Differences from a hit in Python:

- the front notes an entry once per load, when it is first hit inside its refresh window:
  refresh ahead's last share of the TTL, or, when it is longer, XFetch's window drawn once
  when the entry is stored (time to expiry <= cost x beta x -ln u) instead of on every hit.
  A note is a refresh (``Refresher.on_notice``): were XFetch drawn again there, a draw that
  said no would leave the entry to expire, since the front notes it only once (under load,
  when round trips are slow and XFetch's horizon is wider than refresh ahead's window, a
  quarter of the hot entries expired that way and their lookups waited for Redis);
- a hit there marks the entry for CLOCK's second chance, as a hit in Python does.

``NATIVE_HITS=off`` (or the cache off, or the extension off) answers every lookup in Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import orjson

from feature_store.batch import reads_whole_hash
from feature_store.layout import KEY_SEPARATOR, MAX_STRING_ID_BYTES, IdType
from feature_store.native import FEAST, REST
from feature_store.serialization.answers import TYPE_CODES
from feature_store.serving.api import wire
from feature_store.serving.fronts.links import FrontLinks
from feature_store.serving.l1.cache import entry_json, keeper
from feature_store.serving.l1.native_cache import NativeCache, group_tags
from feature_store.serving.l1.roundtrip import ClusterRoundTrip, NativeRoundTrip

if TYPE_CHECKING:
    from feature_store._native import FrontRedis, HitCache
    from feature_store.serving.l1.loader import Settled
    from feature_store.serving.runtime import ServingRuntime
    from feature_store.serving.service import Layout, Learn, Projection

log = logging.getLogger(__name__)

DRAIN_EVERY = 0.02  # seconds between takes of what the fronts served
MAX_FORMS = 1024  # request forms taught (the extension's bound, every API together)
API_NAMES = ("rest", "grpc", "feast")  # as the metrics name them


# a group's share of a planned read: its name and the indices of its features read
Share: TypeAlias = tuple[str, tuple[int, ...]]


def picks_layout(picks: Sequence[tuple[int, int]], groups: int) -> Layout:
    """The layout of a REST or gRPC answer over several groups (``picks``: a projection's, per
    value of a row its group and feature): each group's features in the row's order, the
    groups in the projection's (its rows' "ages" are); then per value its place among the
    groups' in turn."""
    fis: list[list[int]] = [[] for _ in range(groups)]
    for gi, fi in picks:
        fis[gi].append(fi)
    start, taken = [], 0
    for group in fis:
        start.append(taken)
        taken += len(group)
    order = []
    for gi, _ in picks:
        order.append(start[gi])
        start[gi] += 1
    return list(enumerate(fis)), order


def front_loads(runtime: ServingRuntime) -> bool:
    """Whether this worker's fronts load the L1's misses themselves (with their own
    connections: a redis:// URL's; ``FrontLinks``)."""
    reader = runtime.reader
    return (
        runtime.settings.native_loads
        and reader.cache is not None
        and reader.single_flight
        and isinstance(reader.reads.round_trip, NativeRoundTrip | ClusterRoundTrip)
    )


def label(api: int, group: str) -> bytes:
    """A group's name in a row's "ages": as JSON for REST, as it is for gRPC."""
    return orjson.dumps(group) if api == REST else group.encode()


class FrontLookups:
    """Lookups answered on the native fronts' threads: the extension's ``HitCache``, the
    request forms it learns from Python's answers, and what it served, drained into the
    metrics. ``NativeHits`` answers the L1's hits there; ``front_reads.FrontReads``, without
    the L1, the lookups whose Redis commands the front writes."""

    def __init__(
        self,
        runtime: ServingRuntime,
        *,
        planning: bool,
        compact: bool = False,
        native: HitCache | None = None,
    ) -> None:
        from feature_store import _native

        reader, settings = runtime.reader, runtime.settings
        self.reader = reader
        # the worker's L1 (``NativeCache``'s), or, without it, one of its own
        self.owns_native = native is None
        self.native = (
            native
            if native is not None
            else _native.HitCache(
                settings.max_entities,
                MAX_STRING_ID_BYTES,
                reader.shadow_fraction,
                random.getrandbits(64),
                planning,
                compact,
            )
        )
        # a key in the extension: the group's index (2 bytes) and the entity's Redis key
        names = sorted(runtime.registry.groups)
        self.index = {name: i for i, name in enumerate(names)}
        self.planning = planning
        self.specs = reader.reads.specs
        # each group's read and value types: a planned read's commands and answer, and a
        # compact entry's answer (an entry that keeps its answers needs neither)
        for name, spec in self.specs.items() if planning or compact else ():
            self._define_read(self.index[name], [(name, tuple(range(len(spec.fmt.codecs))))])
        # planned reads of anything but one whole group (per group, the indices of the
        # features read): read ids after the groups' own
        self.read_ids: dict[tuple[Share, ...], int] = {}
        self.tags = group_tags(names)
        self.names = {tag: name for name, tag in self.tags.items()}
        self.metrics = runtime.metrics
        self.how = "read" if planning else "hit"
        self.forms: set[tuple[int, str, tuple[str, ...], tuple[str, ...]]] = set()
        self._task: asyncio.Task[None] | None = None
        # the fronts' own Redis connections, where they read on them (planned reads, loads)
        self.links: FrontLinks | None = None
        # the misses the fronts loaded themselves since the last drain (``HitCache.drain``)
        self.loads: tuple[int, int, int, int, int, int, int, int, int] = (0,) * 9

    # --- the handler's side ----------------------------------------------------------

    def learner(self, api: int) -> Learn:
        """What a handler of ``api`` (REST, GRPC, FEAST) calls with each form it answered
        from its lookup's entries: the front may answer it from then on. A form of some of
        the group's features is answered there too: without the L1, by a read of those
        features alone; from the L1's hits, their values picked from the entries'. Forms
        over several groups of one entity (Feast's ``layout``; REST's and gRPC's,
        ``picks_layout``) too: each group's features read (one command per id reads them
        all) or picked from its entries, the row's values or the columns in the answer's
        order."""

        def learn(
            entity: str,
            features: list[str],
            groups: list[str],
            proj: Projection,
            head: bytes,
            layout: Layout | None = None,
        ) -> None:
            form = (api, entity, tuple(features), tuple(groups))
            if form in self.forms or len(self.forms) >= len(API_NAMES) * MAX_FORMS:
                return
            self.forms.add(form)  # taught or not, asked once
            parts: list[tuple[int, int | None, list[int] | None, bytes]] = []
            order = None
            if len(proj.groups) != 1:
                # several groups: each group's features in the answer's order
                if api != FEAST and layout is None:
                    layout = picks_layout(proj.picks, len(proj.groups))
                if layout is None:
                    return
                groups_read = [(proj.groups[gi], fis) for gi, fis in layout[0]]
                order = list(layout[1])
            else:
                groups_read = [(proj.groups[0], [fi for _, fi in proj.picks])]
            if self.planning:
                # one read per id of each group's features (and its write time), unless
                # they are one whole group: its own read
                read = self._read(tuple((g.name, tuple(fis)) for g, fis in groups_read))
                for group, _ in groups_read:
                    parts.append((read, group.max_age_seconds, None, label(api, group.name)))
            else:
                # hits: each group's entries' values, picked where they are not all of them
                # in its order (Feast's columns always pick, and so do the rows over several
                # groups but where each group's values follow the one before's: each
                # group's then copied as its answer bytes are)
                in_turn = api != FEAST and order == list(range(len(order or ())))
                order = None if in_turn else order
                for group, fis in groups_read:
                    whole = (
                        proj.whole_group
                        if len(groups_read) == 1
                        else in_turn and list(fis) == list(range(len(group.features)))
                    )
                    picks = None if whole and api != FEAST else list(fis)
                    tag, max_age = self.index[group.name], group.max_age_seconds
                    parts.append((tag, max_age, picks, label(api, group.name)))
            self.native.learn(
                api,
                entity,
                features,
                groups,
                parts,
                head,
                (proj.entity.prefix + KEY_SEPARATOR).encode(),
                proj.entity.id_type is IdType.INT,
                order,
            )

        return learn

    def _define_read(self, read: int, shares: Sequence[Share]) -> None:
        """Teach read ``read``: of each group in ``shares``, its features there (indices,
        in the answer's order), then its freshness field, with their value types; an
        HGETALL when they are most of the hash, as ``roundtrip.whole`` decides for a
        read, unless a field repeats (an HGETALL's reply holds it once)."""
        fields: list[bytes] = []
        types: list[tuple[int, int]] = []
        windows: list[
            tuple[int, int, list[bool], list[tuple[int, int, int, int, int]], list[int]] | None
        ] = []
        for name, picks in shares:
            spec = self.specs[name]
            codecs = [spec.fmt.codecs[fi] for fi in picks]
            if spec.windows is not None:
                # an aggregated group: its one field, its tiles, answered at the read
                fields.append(spec.fields[0])
                windows.append((*spec.windows.native_spec, list(picks)))
            else:
                fields += [*(spec.fields[fi] for fi in picks), spec.fields[-1]]
                windows.append(None)
            types += [(TYPE_CODES[c.type], c.dim or 0) for c in codecs]
        spec = self.specs[shares[0][0]]
        whole = reads_whole_hash(len(fields), spec.hash_fields)
        counts = [len(picks) for _, picks in shares]
        self.native.define_read(
            read, fields, whole and len(set(fields)) == len(fields), types, counts, windows
        )

    def _read(self, shares: tuple[Share, ...]) -> int:
        """The planned read of ``shares`` (per group, the indices of its features read),
        taught on first use: one command per id reads them all, and a lookup of ten of
        fifty features asks Redis for those ten (an HMGET), not the whole hash as the
        handler does. One whole group's is its own read."""
        if len(shares) == 1:
            name, picks = shares[0]
            if picks == tuple(range(len(self.specs[name].fmt.codecs))):
                return self.index[name]
        read = self.read_ids.get(shares)
        if read is None:
            read = len(self.index) + len(self.read_ids)
            self.read_ids[shares] = read
            self._define_read(read, shares)
        return read

    # --- what the front served -------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drains())

    async def _drains(self) -> None:
        while True:
            await asyncio.sleep(DRAIN_EVERY)
            try:
                self.drain()
            except Exception:  # the next drain tries again; serving goes on
                log.exception("could not take what the native fronts served")

    def attach(self, front: FrontRedis) -> None:
        """A front's own Redis connections, where this reads on them (``FrontLinks``)."""
        if self.links is not None:
            self.links.attach(front)

    def drain(self) -> tuple[list[bytes], list[bytes], int, int]:
        """Count what the fronts answered; the keys hit in their refresh window and those
        sampled for shadow checks, and the hit counts, for ``NativeHits``; the fronts'
        connections' round trips to the policy."""
        served, hits, negative, refresh, shadow, self.loads = self.native.drain()
        if self.links is not None:
            self.links.sync()
        metrics = self.metrics
        for name, (seconds, entities, direct, loaded) in zip(API_NAMES, served, strict=True):
            if not seconds:  # an API's series appear once it is served, as its handler's do
                continue
            metrics.entities.labels(name).inc(entities)
            lookups = metrics.front_lookups
            lookups.labels(name, self.how).inc(len(seconds) - direct - loaded)
            if direct:
                lookups.labels(name, "read_direct").inc(direct)
            if loaded:
                lookups.labels(name, "hit_loaded").inc(loaded)
            observe = metrics.requests.labels(name, "get", "200").observe
            for s in seconds:
                observe(s)
        return refresh, shadow, hits, negative

    async def close(self) -> None:
        """Stop draining (the fronts have stopped) and count what they served last."""
        if self.links is not None:
            await self.links.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.drain()
        if self.owns_native:
            self.native.clear()


class NativeHits(FrontLookups):
    """The fronts' lookups of one worker's L1 (see the module's text)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        cache = runtime.reader.cache
        if not isinstance(cache, NativeCache):
            raise ValueError("native hits need the L1 cache in the extension")
        super().__init__(
            runtime, planning=False, compact=not cache.keep_answers, native=cache.native
        )
        self.cache: NativeCache = cache
        self.clock = cache.clock
        if front_loads(runtime):
            self._load_misses(runtime)

    def _load_misses(self, runtime: ServingRuntime) -> None:
        """The fronts load their lookups' misses themselves, on connections of their own:
        each group's whole read taught, and the cache's settings handed over."""
        links = FrontLinks(runtime)
        if not links.connections:
            return  # a TLS or unix-socket URL: Python loads them
        self.links = links
        if self.cache.keep_answers:  # (a compact cache's reads are taught already)
            for name, spec in self.specs.items():
                self._define_read(self.index[name], [(name, tuple(range(len(spec.fmt.codecs))))])
        cache, settings = self.cache, runtime.settings
        self.native.load_misses(
            cache.ttl,
            cache.negative_ttl,
            cache.jitter,
            settings.cache_refresh_ahead,
            settings.redis_timeout_max,
            cache.max_stale,
        )
        fronts = links.fronts
        cache.refreshing_front = lambda: fronts[0] if fronts else None

    # --- the fronts' misses -----------------------------------------------------------

    async def fill(self, tagged: list[bytes], proto: bool) -> Settled | None:
        """Load the keys a front found missing or expired for one lookup (or without its
        API's answer bytes: gRPC records, ``proto``, or JSON) into the cache, through the
        reader's own policy (``CachedReader.get``: single-flight, coalescing, the
        counters), loaded in that API's form. None: the front answers the lookup from the
        cache. Otherwise what the load resolved for each key, for the handler to answer
        with (``loader.settled``): a read failed (served stale, or its error), an entity's
        data is broken (the handler names it), or an entry was not kept (dropped in
        flight, a negative TTL of 0)."""
        names = self.names
        keys = [(names[key[:2]], key[2:]) for key in tagged]
        try:
            resolved = await self.reader.get(keys, proto=proto)
        except Exception as e:  # the handler answers with it
            return dict.fromkeys(keys, e)
        cache = self.cache
        charge = keeper(cache)
        for key, (entry, stale) in zip(keys, resolved, strict=True):
            if stale or entry.fault is not None or not cache.holds(key, entry):
                return dict(zip(keys, resolved, strict=True))
            if charge is None:
                continue
            # the cache's entry keeps them (``charge``)
            if proto and entry.wire is None:
                wire.entry_values(entry, charge)
            elif not proto and entry.json is None:
                entry_json(entry, charge)
        return None

    # --- what the front served -------------------------------------------------------

    def drain(self) -> tuple[list[bytes], list[bytes], int, int]:
        """Count the hits the fronts answered; the entries they noted go through the
        policy (``CachedReader.noted_hit``, ``ShadowChecker.sample``)."""
        refresh, shadow, hits, negative = super().drain()
        cache = self.cache
        stats = cache.stats
        stats.hits += hits
        stats.negative_hits += negative
        stats.front_hits += hits + negative
        (
            misses,
            deduplicated,
            loaded,
            round_trips,
            evicted,
            stale,
            refreshed,
            outdated,
            passed,
        ) = self.loads
        stats.misses += misses
        stats.deduplicated += deduplicated
        stats.keys_loaded += loaded
        stats.round_trips += round_trips
        stats.evictions += evicted
        stats.not_admitted += passed
        stats.stale_serves += stale
        stats.early_refreshes += refreshed  # refreshed ahead by the fronts themselves
        stats.generation_refreshes += outdated  # read again by them after a batch write
        if refresh:
            now = self.clock()
            noted = self.reader.noted_hit
            names = self.names
            for tagged in refresh:
                noted((names[tagged[:2]], tagged[2:]), now)
        if shadow:
            sample = self.reader.shadow_sample
            for tagged in shadow:
                sample((self.names[tagged[:2]], tagged[2:]))
        return refresh, shadow, hits, negative

    async def close(self) -> None:
        """The fronts have stopped: count what they served last (the cache stays the
        worker's)."""
        await super().close()
        self.cache.refreshing_front = None
