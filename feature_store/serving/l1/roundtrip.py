"""Sending the read path's reads to Redis: one pipelined round trip per call.

The loader hands over (entity key, groups) pairs. Each becomes one command: an HMGET of
the groups' fields, or an HGETALL when they are most of the entity's hash (a listpack
field lookup is a scan, so HMGET of all 51 fields of the standard shape costs the server
2.3x an HGETALL; see ``feature_store.batch.reads_whole_hash``). Either reply comes back
as the fields' values in order. A group's fields never change, so their RESP encoding is
made once (``GroupSpec.packed_fields``) and an HMGET costs one bytes join. redis-py's
generic ``pack_command`` re-encodes all 51 arguments of every HMGET and cost more CPU than
everything else on the path (about 100 us per entity); the packed form is written on a
pooled connection and the replies read in order.

Against Redis Cluster (``ClusterRoundTrip``) the reads are grouped by the master that owns
each key's slot, as redis-py's cluster client knows the slots, and each master's share goes
in a packed round trip of its own, all at once, read by the native core as on one node. A
read whose slot moved (MOVED, ASK) is sent again to the node the reply names, in one more
packed round trip per node; a master gone, or a read redirected twice, sends those reads
through redis-py's cluster pipeline (``PipelineRoundTrip``), which follows redirects and
learns the layout again; so does everything when the native core is off.

An error reply to one command (WRONGTYPE: the key holds a string, say) is that entity's
problem, not Redis failing: it comes back in that read's place as a ``KeyDataError`` and the
other reads of the round trip are answered as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.cluster import get_node_name

from feature_store.batch import align_hash, reads_whole_hash
from feature_store.connection import AsyncClient, RedisTarget, is_key_error, translated_errors
from feature_store.errors import EntityDataError, StoreTimeoutError
from feature_store.native import native_enabled
from feature_store.serving.l1.spec import GroupSpec

if TYPE_CHECKING or native_enabled():
    from feature_store._native import ReadPlan, key_slot, resp_scan, resp_split

T = TypeVar("T")
Read = tuple[bytes, Sequence[GroupSpec]]  # an entity key and the groups to read of it
CONNECTION_WAIT = 1.0  # seconds a read may wait for a free pooled connection
CLUSTER_RETRIES = 2  # quick retries of a cluster round trip whose connection was closed
LAYOUT_WAIT = 1.0  # seconds a cluster read may wait for the layout to be learnt


class ConnectionWaitTimeout(StoreTimeoutError):
    """Every pooled connection stayed busy: the worker is overloaded, Redis may be fine."""


class KeyDataError(EntityDataError):
    """Redis answered one read with an error (WRONGTYPE): bad data under that key."""

    @classmethod
    def of(cls, key: bytes, error: object) -> KeyDataError:
        return cls(f"{key.decode(errors='replace')}: Redis answered {error}", "wrong_type")


# A read's values in field order: a list, or packed in one bytes (NativeRoundTrip)
Reply = list[bytes | None] | bytes | KeyDataError
READ_SIZE = 1 << 16  # bytes asked of the socket at a time by the native round trip


class RoundTrip(Protocol):
    """One command per read, all in one round trip; the values of each in field order.

    ``answer_within`` (seconds) bounds the exchange with Redis (TimeoutError when it passes).
    """

    async def __call__(self, reads: Sequence[Read], answer_within: float) -> list[Reply]: ...


def whole(specs: Sequence[GroupSpec]) -> bool:
    if len(specs) == 1:
        return specs[0].whole_alone
    return reads_whole_hash(sum(len(s.fields) for s in specs), specs[0].hash_fields)


def key_error(key: bytes, reply: Exception) -> KeyDataError:
    """An error reply about one key's data as its ``KeyDataError``; any other error reply
    (NOPERM, LOADING, a cluster error: Redis failing) raises, translated."""
    if not is_key_error(reply):
        with translated_errors():
            raise reply
    return KeyDataError.of(key, reply)


def align(reads: Sequence[Read], replies: list[object]) -> list[Reply]:
    """HGETALL replies turned into the read's fields' values; HMGET replies as they are;
    an error reply as the key's ``KeyDataError``."""
    out: list[Reply] = []
    for (key, specs), reply in zip(reads, replies, strict=True):
        if isinstance(reply, Exception):
            out.append(key_error(key, reply))
        elif whole(specs):
            out.append(align_hash(reply, [f for s in specs for f in s.fields]))
        else:
            out.append(reply)  # type: ignore[arg-type]  # an HMGET reply: values or None
    return out


ASKING = b"*1\r\n$6\r\nASKING\r\n"
OK = b"+OK\r\n"


def pack(reads: Sequence[Read], asking: bool = False) -> bytes:
    """One command per read; each after an ASKING where ``asking``."""
    parts = []
    for key, specs in reads:
        if asking:
            parts.append(ASKING)
        if whole(specs):
            parts.append(b"*2\r\n$7\r\nHGETALL\r\n$%d\r\n%b\r\n" % (len(key), key))
            continue
        nfields = sum(len(s.fields) for s in specs)
        parts.append(b"*%d\r\n$5\r\nHMGET\r\n$%d\r\n%b\r\n" % (nfields + 2, len(key), key))
        parts.extend(s.packed_fields for s in specs)
    return b"".join(parts)


def asked(buf: bytes, ends: Sequence[int]) -> bytes:
    """The replies of ``pack(reads, asking=True)``'s commands without their ASKINGs' (each
    pair of replies ends at one of ``ends``)."""
    replies, start = [], 0
    for end in ends:
        if not buf.startswith(OK, start):
            raise redis.exceptions.InvalidResponse(f"ASKING answered {buf[start:end][:80]!r}")
        replies.append(buf[start + len(OK) : end])
        start = end
    return b"".join(replies)


async def retried(exchange: Callable[[], Awaitable[T]]) -> T:
    """``exchange()`` with Redis's errors translated, once more on a connection error: a
    pooled connection that died with a Redis restart fails on first use, and the reads are
    idempotent, so one retry on a fresh connection is safe. Not after its deadline passed
    (TimeoutError, an OSError too): a hung Redis would cost the caller two."""
    with translated_errors():
        try:
            return await exchange()
        except TimeoutError:
            raise
        except (redis.exceptions.ConnectionError, OSError):
            return await exchange()


class PackedRoundTrip:
    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.pool = client.connection_pool

    async def __call__(self, reads: Sequence[Read], answer_within: float) -> list[Reply]:
        data = pack(reads)
        replies = await retried(lambda: self._send(data, len(reads), answer_within))
        return align(reads, replies)

    async def _send(self, data: bytes, count: int, answer_within: float) -> list[object]:
        async with self._held(answer_within) as conn, asyncio.timeout(answer_within):
            await conn.send_packed_command(data, check_health=False)
            replies: list[object] = []
            for _ in range(count):
                try:
                    replies.append(await conn.read_response())
                except redis.exceptions.ResponseError as e:
                    replies.append(e)  # one command's error reply; the stream goes on
        return replies

    @contextlib.asynccontextmanager
    async def _held(self, answer_within: float) -> AsyncIterator[redis.asyncio.Connection]:
        """A pooled connection for one exchange, dropped when the exchange does not end
        (timed out, cancelled or failed halfway: unread replies would poison it).

        A connection the pool has room for is had within the exchange's own timeout
        (``answer_within``, then the exchange has its own): making one asks Redis (the
        handshake), and a Redis that accepts connections but does not answer (SIGSTOP, a
        partition) held it for redis-py's socket timeout, twice with its retry (a lookup
        took 2.4 s with a 0.3 s timeout). Only the wait for a free one, with the pool at its
        bound, is the pool's own (local overload, ``_connection``). A caller cut meanwhile
        (that timeout, or cancelled) leaves the connect to finish on its own and the
        connection to go back to the pool: cancelled halfway, redis-py left the socket open."""
        room = getattr(self.pool, "can_get_connection", None)
        within = answer_within if room is None or room() else None
        getting = asyncio.ensure_future(self._connection())
        try:
            async with asyncio.timeout(within):
                conn = await asyncio.shield(getting)
        except (asyncio.CancelledError, TimeoutError):
            getting.add_done_callback(self._back_to_pool)
            raise
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            raise
        finally:
            await self.pool.release(conn)

    def _back_to_pool(self, getting: asyncio.Future[redis.asyncio.Connection]) -> None:
        """A connection made for a caller that was cut meanwhile, returned to the pool."""
        if getting.cancelled() or getting.exception() is not None:
            return
        releasing = asyncio.ensure_future(self.pool.release(getting.result()))
        releasing.add_done_callback(consume)

    async def _connection(self) -> redis.asyncio.Connection:
        """A pooled connection. The pool's wait for a free one (its ``timeout``, set to
        CONNECTION_WAIT by the serving runtime) is local overload; connecting, which
        blocks when Redis hangs, is Redis failing and raises as such."""
        try:
            return await self.pool.get_connection()  # type: ignore[no-untyped-call,no-any-return]
        except redis.exceptions.ConnectionError as e:
            if not isinstance(e.__cause__, TimeoutError):
                raise
            raise ConnectionWaitTimeout(
                f"no free Redis connection within {CONNECTION_WAIT:.0f} s (worker overloaded; "
                "see FEATURE_STORE_MAX_CONNECTIONS)"
            ) from None


class NativeRoundTrip(PackedRoundTrip):
    """The packed round trip with the replies read by the native core: the socket's bytes
    go to ``resp_split``, which packs each read's values in field order into one bytes
    (an HGETALL's pairs looked up by field), with no Python object per value. hiredis
    stays the parser of every other command on these connections (the handshake); this
    reads only the replies to what it sent, and a connection it leaves halfway is dropped.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        super().__init__(client)
        self._plans: dict[str | tuple[str, ...], ReadPlan] = {}

    def _plan(self, specs: Sequence[GroupSpec]) -> ReadPlan:
        names = specs[0].group.name if len(specs) == 1 else tuple(s.group.name for s in specs)
        plan = self._plans.get(names)
        if plan is None:
            fields = [f for s in specs for f in s.fields]
            plan = self._plans[names] = ReadPlan(fields, whole(specs))
        return plan

    async def __call__(self, reads: Sequence[Read], answer_within: float) -> list[Reply]:
        data = pack(reads)
        plans = [self._plan(specs) for _, specs in reads]
        replies = await retried(lambda: self._exchange(data, plans, answer_within))
        return [
            key_error(key, r) if isinstance(r, Exception) else r
            for (key, _), r in zip(reads, replies, strict=True)
        ]

    async def packed(
        self, data: bytes, counts: Sequence[int], answer_within: float
    ) -> tuple[bytes, list[int]]:
        """Send ``data`` (the commands of several lookups, ``counts`` of them each) and
        return their replies' bytes, unread, and where each lookup's replies end: the
        planned reads of the native fronts (front_reads.py), whose front reads them."""
        return await retried(lambda: self._replies(data, counts, answer_within))

    async def _replies(
        self, data: bytes, counts: Sequence[int], answer_within: float
    ) -> tuple[bytes, list[int]]:
        async with self._held(answer_within) as conn, asyncio.timeout(answer_within):
            return await self._read_replies(conn, data, counts)

    @staticmethod
    async def _read_replies(
        conn: redis.asyncio.Connection, data: bytes, counts: Sequence[int]
    ) -> tuple[bytes, list[int]]:
        """Send ``data`` and read the replies of its commands, ``counts`` of them per
        part: the bytes, and where each part's replies end (one scan of the bytes)."""
        await conn.send_packed_command(data, check_health=False)
        reader = conn._reader
        assert reader is not None
        # The complete replies are set aside as they are scanned and joined once at the
        # end: only the unscanned tail (one partial reply and a read) is ever added to. A
        # single growing ``bytes`` was copied whole on every read, quadratic in the reply:
        # a batch of 1,000 misses (1.3 MB) spent a tenth of its time in memmove.
        done: list[bytes] = []
        before = 0  # bytes in ``done``
        tail = b""
        pos = 0  # in ``tail``
        ends = []
        try:  # ValueError: not RESP, which no Redis sends
            for count in counts:
                while True:
                    pos, found = resp_scan(tail, pos, count)
                    count -= found
                    if not count:
                        break
                    chunk = await reader.read(READ_SIZE)
                    if not chunk:
                        raise redis.exceptions.ConnectionError("Redis closed the connection")
                    if pos:
                        done.append(tail[:pos])
                        before += pos
                        tail, pos = tail[pos:], 0
                    tail += chunk
                ends.append(before + pos)
        except ValueError as e:
            raise redis.exceptions.InvalidResponse(str(e)) from None
        if pos != len(tail):
            raise redis.exceptions.InvalidResponse("bytes past the last reply")
        done.append(tail)
        return b"".join(done), ends  # one part: the part itself, not a copy

    async def _exchange(
        self, data: bytes, plans: list[ReadPlan], answer_within: float, asking: bool = False
    ) -> list[bytes | Exception]:
        """Send ``data`` (``pack``'s) and read its replies by ``plans``. ``asking``: each
        command of ``data`` is preceded by an ASKING (``pack(reads, asking=True)``: a slot
        being migrated to this node), whose replies are checked and left out."""
        async with self._held(answer_within) as conn, asyncio.timeout(answer_within):
            if asking:
                buf, ends = await self._read_replies(conn, data, [2] * len(plans))
                buf = asked(buf, ends)
            else:
                buf, _ = await self._read_replies(conn, data, [len(plans)])
            try:  # ValueError: not RESP, which no Redis sends
                replies = resp_split(buf, plans)
            except ValueError as e:
                raise redis.exceptions.InvalidResponse(str(e)) from None
            parser = conn._parser
            return [
                parser.parse_error(r) if isinstance(r, str) else r  # type: ignore[no-untyped-call]
                for r in replies
            ]


class PipelineRoundTrip:
    """Reads through redis-py's cluster pipeline, which routes each key to its node.

    While slots move (a reshard, a failover), the client re-learns the cluster's layout and
    a connection in use can be closed under a read: the reads are idempotent, so such a
    round trip is retried (``CLUSTER_RETRIES`` times, within the same time budget).

    The layout is learnt outside the reads' budget (``known_layout``).
    """

    def __init__(self, client: redis.asyncio.cluster.RedisCluster) -> None:
        self.client = client
        self._learning: asyncio.Task[redis.asyncio.cluster.RedisCluster] | None = None
        self._relearning: asyncio.Future[None] | None = None

    def learn_again(self) -> None:
        """Learn the layout again in the background, one learning at a time: a MOVED reply
        said a slot has a new owner. Reads go on meanwhile (``ClusterRoundTrip`` follows
        the redirects itself) and use the new layout once it is learnt."""
        if self._relearning is None or self._relearning.done():
            self._relearning = asyncio.ensure_future(self.client.nodes_manager.initialize())
            self._relearning.add_done_callback(consume)

    async def __call__(self, reads: Sequence[Read], answer_within: float) -> list[Reply]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + answer_within
        with translated_errors():
            for attempt in range(CLUSTER_RETRIES + 1):
                waited = loop.time()
                await self.known_layout()
                deadline += loop.time() - waited  # learning the layout is not the read's time
                try:
                    async with asyncio.timeout_at(deadline):
                        if attempt:
                            await asyncio.sleep(0.01 * attempt)
                        replies = await self._once(reads)
                    break
                except (redis.exceptions.ConnectionError, OSError):
                    if attempt == CLUSTER_RETRIES:
                        raise
        return align(reads, replies)

    async def known_layout(self) -> None:
        """Return once the client knows the cluster's layout (at most ``LAYOUT_WAIT``).

        After a connection error (a node died), redis-py forgets the layout and learns it
        again at the next command: CLUSTER SLOTS, then COMMAND, tens of milliseconds, more
        on a loaded host. That wait is not counted in a read's budget (the adaptive
        timeout, 100 ms at its floor), for two reasons:

        - A refresh cut by a read's timeout started over at the next read, and when each
          took longer than the budget none ever ended: serving stayed down after a
          failover until the load stopped. So it runs in a task of its own, shared by the
          reads that wait for it and shielded from them; a read cut meanwhile leaves it to
          finish for the next.
        - While the circuit is open, one probe read at a time decides whether Redis is
          back, and the first probe after a failover is the read that learns the new
          layout. Cut by its budget, it failed although the cluster was fine, and the
          circuit stayed open twice as long (4 s after a 3 s failover, by default).
        """
        if not self.client._initialize:  # redis-py's flag: the layout is to be learnt
            return
        learning = self._learning
        if learning is None or learning.done():
            learning = asyncio.ensure_future(self.client.initialize())
            learning.add_done_callback(consume)
            self._learning = learning
        try:
            async with asyncio.timeout(LAYOUT_WAIT):
                await asyncio.shield(learning)
        except TimeoutError:
            raise StoreTimeoutError(
                f"the Redis Cluster's layout was not learnt within {LAYOUT_WAIT:.0f} s"
            ) from None

    async def _once(self, reads: Sequence[Read]) -> list[object]:
        pipe = self.client.pipeline(transaction=False)
        for key, specs in reads:
            if whole(specs):
                pipe.execute_command("HGETALL", key)
            else:
                pipe.execute_command("HMGET", key, *(f for s in specs for f in s.fields))
        try:
            replies: list[object] = await pipe.execute(raise_on_error=False)
        except (RuntimeError, AttributeError) as e:
            if not closed_under(e):
                raise
            raise redis.exceptions.ConnectionError(str(e)) from e
        for reply in replies:
            # redis-py hands back a connection closed under a command as that command's reply
            if isinstance(reply, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
                raise reply
            if closed_under(reply):
                raise redis.exceptions.ConnectionError(str(reply)) from reply
        return replies


def consume(future: asyncio.Future[Any]) -> None:
    """Take a finished future's error, if any, as its done callback: those who waited for
    it may all have been cut, and asyncio reports an error nobody took."""
    if not future.cancelled():
        future.exception()


WRITER_METHODS = frozenset({"writelines", "write", "drain"})  # asyncio.StreamWriter's


def closed_under(error: object) -> TypeGuard[RuntimeError | AttributeError]:
    """A write on a connection closed under redis-py's cluster client, which can hand out
    a pooled connection while another task is closing it: seen when it sent a redirected
    read again during a reshard under load, where it became the lookup's 503 ("the read
    failed: ..."). Two forms, by how far the close had gone:

    - uvloop's RuntimeError, "the handler is closed": the transport was closed;
    - AttributeError, "'NoneType' object has no attribute 'writelines'": the close had
      already dropped the connection's writer (``disconnect`` sets it to None after
      awaiting the transport's end, while another task had found the connection connected).

    Either is a connection error in all but its type, and a read is tried again after one.
    Any other RuntimeError or AttributeError is a bug and is not retried."""
    if isinstance(error, RuntimeError):
        return "the handler is closed" in str(error)
    return isinstance(error, AttributeError) and error.obj is None and error.name in WRITER_METHODS


class ClusterRoundTrip:
    """Reads on Redis Cluster as on one node: grouped by the master that owns each key's
    slot (redis-py's cluster client's slot map, learnt from ``CLUSTER SLOTS`` and kept up to
    date by its redirects), one packed round trip per master (a ``NativeRoundTrip`` on a
    pool of that master's own), all sent at once, the replies put back in the reads' order.

    redis-py's cluster pipeline cost the worker five to six times what the masters spent
    on a lookup without the L1, this path about what one node's costs
    (benchmarks/results/cluster_dataplane.md).

    A reply that says a read's slot moved (MOVED, or ASK during a migration) is followed
    here: the redirected reads are sent to the nodes the replies name, one packed round
    trip per node, all at once (each after an ASKING where the reply was ASK), and a MOVED
    has the layout learnt again in the background. redis-py's pipeline sends each
    redirected command again alone, one after another: a lookup of ten ids during a
    reshard took ten round trips and outran its budget on a loaded host. Whatever this
    does not cover goes through the pipeline (``PipelineRoundTrip``), in the same time
    budget: a slot no known master owns, a read redirected again, a master's connection
    failing (a failover). The pipeline follows the redirect and learns the layout again;
    the next calls use it.
    """

    def __init__(self, client: redis.asyncio.cluster.RedisCluster, target: RedisTarget) -> None:
        self.client = client
        self.target = target
        self.pipeline = PipelineRoundTrip(client)
        self._masters: dict[str, NativeRoundTrip] = {}  # by node name, host:port
        self.handed_over = 0  # calls the pipeline answered, for tests and metrics

    async def __call__(self, reads: Sequence[Read], answer_within: float) -> list[Reply]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + answer_within
        waited = loop.time()
        with translated_errors():
            await self.pipeline.known_layout()
        deadline += loop.time() - waited  # learning the layout is not the read's time
        slots = self.client.nodes_manager.slots_cache
        shares: dict[str, list[int]] = {}
        for i, (key, _) in enumerate(reads):
            owners = slots.get(key_slot(key))
            if not owners:
                return await self._handed_over(reads, deadline)
            shares.setdefault(owners[0].name, []).append(i)
        with translated_errors():
            try:
                # the deadline bounds the whole exchange: a pooled connection is taken (and
                # made, where a master has none free) before a share's own timeout starts,
                # and a master that hangs (SIGSTOP) would hold a new one for the connect
                # and handshake timeouts
                async with asyncio.timeout_at(deadline):
                    answers = await asyncio.gather(
                        *(
                            self._share(name, [reads[i] for i in share], deadline)
                            for name, share in shares.items()
                        )
                    )
            except TimeoutError:
                raise
            except (redis.exceptions.ConnectionError, OSError):
                answers = None  # a master gone (a failover): the pipeline learns the layout
        if answers is None:
            return await self._handed_over(reads, deadline)
        out: list[Reply | Exception] = [b""] * len(reads)
        for share, replies in zip(shares.values(), answers, strict=True):
            for i, reply in zip(share, replies, strict=True):
                out[i] = reply
        moved = [i for i, r in enumerate(out) if isinstance(r, redis.exceptions.AskError)]
        if moved:
            followed = await self._follow(
                [reads[i] for i in moved], [out[i] for i in moved], deadline
            )
            for i, got in zip(moved, followed, strict=True):
                out[i] = got
        return [
            key_error(key, r) if isinstance(r, Exception) and not isinstance(r, KeyDataError) else r
            for (key, _), r in zip(reads, out, strict=True)
        ]

    async def _share(
        self, name: str, reads: Sequence[Read], deadline: float, asking: bool = False
    ) -> list[bytes | Exception]:
        """One master's share, read on its own pool (each read after an ASKING where
        ``asking``)."""
        master = self._master(name)
        data = pack(reads, asking)
        plans = [master._plan(specs) for _, specs in reads]
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError
        return await master._exchange(data, plans, left, asking)

    async def _follow(
        self, reads: Sequence[Read], redirects: Sequence[Reply | Exception], deadline: float
    ) -> list[Reply | Exception]:
        """``reads`` sent again where their ``redirects`` (MOVED, ASK; MovedError is an
        AskError) point: one packed round trip per node, all at once. Those redirected again,
        or all when a connection fails, go through the pipeline."""
        nodes: dict[tuple[str, bool], list[int]] = {}
        for j, e in enumerate(redirects):
            assert isinstance(e, redis.exceptions.AskError)
            asking = not isinstance(e, redis.exceptions.MovedError)
            nodes.setdefault((get_node_name(e.host, e.port), asking), []).append(j)
        if any(not asking for _, asking in nodes):
            self.pipeline.learn_again()
        out: list[Reply | Exception] = list(redirects)
        with translated_errors():
            try:
                async with asyncio.timeout_at(deadline):
                    answers = await asyncio.gather(
                        *(
                            self._share(name, [reads[j] for j in js], deadline, asking)
                            for (name, asking), js in nodes.items()
                        )
                    )
                for js, replies in zip(nodes.values(), answers, strict=True):
                    for j, answer in zip(js, replies, strict=True):
                        out[j] = answer
            except TimeoutError:
                raise
            except (redis.exceptions.ConnectionError, OSError):
                pass  # a node gone (a failover too): the pipeline learns the layout
        again = [j for j, r in enumerate(out) if isinstance(r, redis.exceptions.AskError)]
        if again:
            handed = await self._handed_over([reads[j] for j in again], deadline)
            for j, reply in zip(again, handed, strict=True):
                out[j] = reply
        return out

    def _master(self, name: str) -> NativeRoundTrip:
        master = self._masters.get(name)
        if master is None:
            host, port = name.rsplit(":", 1)
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                node_url(self.target.url, host, int(port)),
                max_connections=self.target.max_connections,
                timeout=CONNECTION_WAIT,
                **self.target.connection_options(),
            )
            master = self._masters[name] = NativeRoundTrip(redis.asyncio.Redis.from_pool(pool))
        return master

    async def _handed_over(self, reads: Sequence[Read], deadline: float) -> list[Reply]:
        self.handed_over += 1
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError
        return await self.pipeline(reads, left)

    async def aclose(self) -> None:
        masters, self._masters = self._masters, {}
        for master in masters.values():
            await master.pool.disconnect()


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (a cluster's, its options removed) pointed at one node: the same scheme,
    credentials and options."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{credentials}@{address}" if credentials else address
    return urlunsplit(parts._replace(netloc=netloc))


def round_trip_for(client: AsyncClient, target: RedisTarget | None = None) -> RoundTrip:
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        if native_enabled() and target is not None:
            return ClusterRoundTrip(client, target)
        return PipelineRoundTrip(client)
    if native_enabled():
        return NativeRoundTrip(client)
    return PackedRoundTrip(client)
