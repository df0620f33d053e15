"""Lookups without the L1 read and answered on the native fronts' threads.

Without the L1, a lookup cost the worker 3.2 times what Redis spends on it
(benchmarks/results/rest_front.md): parsing the body, checking the ids, building keys and
commands, splitting the replies into entries and writing the answer, all in Python around
one round trip. Here the front does that in the extension (``native/src/hits/``:
``Hits::plan``, ``Hits::render``) for each request in a form Python has answered before
(learned as ``hits.NativeHits`` learns them): it writes the lookup's commands, as
``roundtrip.pack`` writes them, and writes the answer from Redis's replies. A lookup of
anything but one whole group has a read of its own (``FrontLookups._read``): of each group
it asks for, the fields of the features asked and the group's write time, where its
handler reads the whole groups; a lookup over several groups of one entity reads them with
one command per id, as the handler does. The round trip goes one of two ways:

- on the front's own Redis connections (links.py: opened, synced with the policy of every
  read, read on without Python);
- sent by Python (no connection, the circuit not closed, a TLS or unix-socket URL): the
  front queues the lookup's commands; this loop takes every planned call of a wake-up at
  once and sends their commands in round trips of up to FLUSH_KEYS keys through
  ``StoreReads.send_packed`` (the breaker, the adaptive timeout, the pooled connections)
  and hands each call its replies' bytes back.

What is Python's stays Python's:

- Redis failing (a timeout, unreachable, the circuit open) is answered with the route's own
  error answer (``RestHandlers.fail`` for REST: the same status, message and Retry-After);
- a reply the front does not answer from (an error reply for a key that holds another type,
  a value only the Python reference decodes, a write time that is not one) goes to the
  route's handler, which reads again, names the fault and answers the entity with status
  "error". Such an entity costs two reads per request; data that clean costs none.

On Redis Cluster the fronts route each command to the master that owns its key's slot
(links.py); a lookup the fronts do not read on a cluster is its handler's (there is no
packed path through Python there).

Only with the debouncer's coalescing on (``single_flight``) and a round trip of the native
core (``NativeRoundTrip``, ``ClusterRoundTrip``); with the L1 on, the fronts answer hits
(hits.py) and misses go through the cache. ``NATIVE_READS=off``: every lookup without the
L1 is answered by its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from feature_store.errors import StoreUnavailableError
from feature_store.serving.fronts.hits import FrontLookups
from feature_store.serving.fronts.links import FrontLinks
from feature_store.serving.l1.flight import FLUSH_KEYS
from feature_store.serving.l1.roundtrip import ClusterRoundTrip, NativeRoundTrip

if TYPE_CHECKING:
    from feature_store.serving.runtime import ServingRuntime

# answers a planned call with the error Redis's failure deserves (the call, the error, and
# perf_counter() when its round trip started)
Fail = Callable[[Any, BaseException, float], None]


def planned_reads(runtime: ServingRuntime) -> bool:
    """Whether this worker's lookups without the L1 can be planned by its fronts."""
    reader = runtime.reader
    return (
        runtime.settings.native_reads
        and reader.cache is None
        and reader.single_flight
        and isinstance(reader.reads.round_trip, NativeRoundTrip | ClusterRoundTrip)
    )


class FrontReads(FrontLookups):
    """The planned reads of one worker's fronts (see the module's text)."""

    def __init__(self, runtime: ServingRuntime) -> None:
        super().__init__(runtime, planning=True)
        self.reads = runtime.reader.reads
        self.links = FrontLinks(runtime)

    # --- planned reads Python sends ---------------------------------------------------

    async def read(self, calls: Sequence[Any], fail: Fail) -> None:
        """Send the commands of ``calls`` (each with ``command``, ``count`` and
        ``replies``) in round trips of up to FLUSH_KEYS keys; every call is answered."""
        chunks: list[list[Any]] = []
        size = FLUSH_KEYS
        for call in calls:
            if size + call.count > FLUSH_KEYS:
                chunks.append([])
                size = 0
            chunks[-1].append(call)
            size += call.count
        await asyncio.gather(*(self._chunk(chunk, fail) for chunk in chunks))

    async def _chunk(self, calls: list[Any], fail: Fail) -> None:
        t0 = time.perf_counter()
        try:
            data = b"".join([call.command for call in calls])
            buf, ends = await self.reads.send_packed(data, [call.count for call in calls])
            start = 0
            for call, end in zip(calls, ends, strict=True):
                call.replies(buf, start, end)
                start = end
        except BaseException as error:
            failure: BaseException = error
            if isinstance(error, asyncio.CancelledError):  # at shutdown
                failure = StoreUnavailableError("the serving process is shutting down")
            for call in calls:
                # RuntimeError: answered already (the failure came after its replies)
                with contextlib.suppress(RuntimeError):
                    fail(call, failure, t0)
            if not isinstance(error, Exception):
                raise
