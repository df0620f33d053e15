"""Write commands sent to Redis as packed round trips, per master on a cluster, and, when
asked (``feature_store.durability``), confirmed by replicas with ``WAIT``.

WAIT speaks for the connection it is sent on (everything that connection wrote before
it), so each master's share of a write and its WAIT go on one connection: one round trip
on one node, one per master on Redis Cluster (redis-py's cluster client's slot map and its
nodes' pools), every share written before any reply is read. The senders read every
reply, an error reply (MOVED, ASK, NOSCRIPT, WRONGTYPE) in its command's place, so that a
connection stays in step; the callers decide what an error reply means:

- the Spark job's ``ChunkWriter`` (``feature_store.ingest.writer``) retries the whole
  chunk with backoff: its commands are idempotent (the ordering guard);
- the library (``FeatureStore.write``) sends a durable write again, up to
  ``DURABLE_ATTEMPTS``, after a slot moved or a master's connection failed, the cluster's
  layout learnt again; a write not confirmed raises ``NotDurableError``. So do the serving
  API's push writes (``feature_store.serving.writer``), durable or not (``send_async``),
  never after a timeout.

redis-py's pipeline, which the library uses when no durability is asked, checks and packs
every argument in Python; packing with hiredis costs a fraction of it on calls of ~100
arguments, and redis-py's cluster pipeline cannot put a WAIT on the connection that wrote
a master's share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions

from feature_store.batch import Command
from feature_store.connection import AsyncClient, SyncClient, missing_script
from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.errors import StoreUnavailableError
from feature_store.layout import with_script

DURABLE_ATTEMPTS = 3  # a durable write whose slot moved or whose master went, sent again
REDIRECTED = (redis.exceptions.MovedError, redis.exceptions.AskError)
# a write that timed out is not sent again (the builtin one is an OSError too)
TIMEOUTS = (redis.exceptions.TimeoutError, TimeoutError)


def scripts_resent(
    send: Callable[[list[Command]], list[object]], commands: list[Command]
) -> list[object]:
    """``send(commands)``'s replies, the commands Redis answered NOSCRIPT sent again with
    the script's text."""
    replies = send(commands)
    if missing := missing_script(replies):
        again = send([with_script(commands[i]) for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    return replies


def raised(replies: list[object]) -> list[object]:
    """The replies, or the first error reply raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def key_of(command: Command) -> bytes | str | int:
    """The key a write command is about: the guard's (EVALSHA/EVAL sha|script 1 key ...),
    or a plain command's first argument."""
    return command[3] if command[0] in ("EVALSHA", "EVAL") else command[1]


def send_by_master(
    client: redis.RedisCluster, commands: list[Command], durability: Durability = ASYNCHRONOUS
) -> list[object]:
    """``send_packed`` on a cluster: each master's share of ``commands`` (by the slot of
    each one's key, as the client knows the slots) on one of its pooled connections, every
    share written before any reply is read. Every reply is read, an error reply (MOVED,
    ASK, NOSCRIPT among them) in its command's place; then each master's WAIT is checked
    (``durability``)."""
    import hiredis  # present: HIREDIS_AVAILABLE

    pack = hiredis.pack_command
    manager = client.nodes_manager
    shares: dict[str, tuple[redis.cluster.ClusterNode, list[int]]] = {}
    for i, command in enumerate(commands):
        node = manager.get_node_from_slot(client.keyslot(key_of(command)))  # type: ignore[no-untyped-call]
        shares.setdefault(node.name, (node, []))[1].append(i)
    replies: list[object] = [None] * len(commands)
    waited: list[tuple[str, object]] = []
    wait = pack(durability.command) if durability.asked else b""  # type: ignore[arg-type]
    held: list[tuple[redis.ConnectionPool, redis.Connection, list[int]]] = []
    try:
        for node, share in shares.values():
            pool = client.get_redis_connection(node).connection_pool
            conn = pool.get_connection()
            held.append((pool, conn, share))
            payload = b"".join([pack(commands[i]) for i in share])  # type: ignore[arg-type]
            conn.send_packed_command([payload + wait], check_health=False)  # type: ignore[no-untyped-call]
        for (_, conn, share), node_name in zip(held, shares, strict=True):
            for i in share:
                replies[i] = reply_of(conn)
            if wait:
                waited.append((node_name, reply_of(conn)))
    except BaseException:
        for _, conn, _ in held:
            conn.disconnect()  # type: ignore[no-untyped-call]  # a half-read reply stream
        raise
    finally:
        for pool, conn, _ in held:
            pool.release(conn)
    for node_name, reply in waited:
        durability.check(reply, f"master {node_name}")
    return replies


def reply_of(conn: redis.Connection) -> object:
    """The next reply on ``conn``, an error reply as its exception."""
    try:
        return conn.read_response()
    except redis.exceptions.ResponseError as e:
        return e


def send_packed(
    client: redis.Redis, commands: list[Command], durability: Durability = ASYNCHRONOUS
) -> list[object]:
    """One pipeline round trip on one pooled connection, packed by hiredis.

    What redis-py's ``Pipeline`` does for a non-transactional pipeline (send every packed
    command, then read every reply), without its per-argument Python checks, which cost
    more than the packing itself for calls of ~100 arguments. Every reply is read, an
    error reply in its command's place, so the connection stays in step.
    """
    import hiredis  # present: HIREDIS_AVAILABLE

    pack = hiredis.pack_command
    payload = b"".join([pack(cmd) for cmd in commands])  # type: ignore[arg-type]
    if durability.asked:
        payload += pack(durability.command)  # type: ignore[arg-type]
    pool = client.connection_pool
    conn = pool.get_connection()
    replies: list[object] = []
    try:
        conn.send_packed_command([payload], check_health=False)  # type: ignore[no-untyped-call]
        replies = [reply_of(conn) for _ in commands]
        waited = reply_of(conn) if durability.asked else None
    except BaseException:
        conn.disconnect()  # type: ignore[no-untyped-call]  # a half-read reply stream
        raise
    finally:
        pool.release(conn)
    if durability.asked:
        durability.check(waited, "the master")
    return replies


def redirected(replies: Sequence[object]) -> bool:
    """Whether a reply says a slot moved (MOVED, ASK: a reshard, a failover)."""
    return any(isinstance(r, REDIRECTED) for r in replies)


def _layout_changed() -> StoreUnavailableError:
    return StoreUnavailableError(
        f"a write could not be sent to the cluster's masters in {DURABLE_ATTEMPTS} "
        "attempts (slots moved, or a master failed): send it again"
    )


def send_durable(
    client: SyncClient, commands: list[Command], durability: Durability
) -> list[object]:
    """``commands`` confirmed by ``durability.replicas`` replicas (NotDurableError if not);
    their replies, the write script's text sent where Redis lost it. On a cluster a slot
    that moved or a master gone makes the client learn the layout and the write go again."""
    if isinstance(client, redis.Redis):
        return scripts_resent(lambda c: send_packed(client, c, durability), commands)
    for attempt in range(DURABLE_ATTEMPTS):
        if attempt:
            time.sleep(0.05 * attempt)
            client.nodes_manager.initialize()
        try:
            replies = scripts_resent(lambda c: send_by_master(client, c, durability), commands)
        except (redis.exceptions.ConnectionError, OSError):
            continue
        if not redirected(replies):
            return replies
    raise _layout_changed()


async def send_async(
    client: AsyncClient, commands: list[Command], durability: Durability = ASYNCHRONOUS
) -> list[object]:
    """``send_durable`` on an asyncio client, and without durability (``ASYNCHRONOUS``: no
    WAIT) the serving API's push writes. A connection that fails sends the write again
    (on one node once: a pooled connection dead since a restart; on a cluster with the
    layout learnt again, up to ``DURABLE_ATTEMPTS``); a timeout does not: a Redis that
    hangs, or a partition that drops its replies, would cost the caller one timeout per
    attempt (redis-py's cluster pipeline, which these writes used before, retried a timed
    out write after closing every connection of the client: 2.25 s for a 1 s timeout)."""
    if not isinstance(client, redis.asyncio.cluster.RedisCluster):
        one = client
        return await _scripts_resent_async(lambda c: _one_node_async(one, c, durability), commands)
    for attempt in range(DURABLE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(0.05 * attempt)
        if client._initialize:  # redis-py's flag: the layout is to be learnt
            await client.initialize()
        try:
            replies = await _scripts_resent_async(
                lambda c: _by_master_async(client, c, durability), commands
            )
        except TIMEOUTS:
            raise
        except (redis.exceptions.ConnectionError, OSError):
            replies = None
        if replies is not None and not redirected(replies):
            return replies
        client._initialize = True  # a master gone or a slot moved: learn the layout
    raise _layout_changed()


async def _scripts_resent_async(
    send: Callable[[list[Command]], Awaitable[list[object]]], commands: list[Command]
) -> list[object]:
    """``scripts_resent`` for an async ``send``."""
    replies = await send(commands)
    if missing := missing_script(replies):
        again = await send([with_script(commands[i]) for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    return replies


async def _one_node_async(
    client: redis.asyncio.Redis, commands: list[Command], durability: Durability
) -> list[object]:
    """``commands`` (and a WAIT, if asked) on one pooled connection, once more on a fresh
    one if that connection fails (not if it times out)."""
    pool = client.connection_pool
    for attempt in (0, 1):
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            return await _exchange_async(conn, commands, durability, "the master")
        except TIMEOUTS:
            raise
        except (redis.exceptions.ConnectionError, OSError):
            if attempt:
                raise
        finally:
            await pool.release(conn)
    raise AssertionError("unreachable")


async def _by_master_async(
    client: redis.asyncio.cluster.RedisCluster, commands: list[Command], durability: Durability
) -> list[object]:
    """Each master's share of ``commands`` and its WAIT on one of its connections, all at
    once; the replies in the commands' order."""
    shares: dict[str, tuple[redis.asyncio.cluster.ClusterNode, list[int]]] = {}
    for i, command in enumerate(commands):
        node = client.get_node_from_key(key_of(command))  # type: ignore[arg-type]
        if node is None:  # a slot no known master owns: learn the layout again
            raise redis.exceptions.ConnectionError("a slot without a known master")
        shares.setdefault(node.name, (node, []))[1].append(i)
    answers = await asyncio.gather(
        *(
            _share_async(node, [commands[i] for i in share], durability)
            for node, share in shares.values()
        )
    )
    replies: list[object] = [None] * len(commands)
    for (_, share), got in zip(shares.values(), answers, strict=True):
        for i, reply in zip(share, got, strict=True):
            replies[i] = reply
    return replies


async def _share_async(
    node: redis.asyncio.cluster.ClusterNode, commands: list[Command], durability: Durability
) -> list[object]:
    conn = node.acquire_connection()
    try:
        return await _exchange_async(conn, commands, durability, f"master {node.name}")
    finally:
        node.release(conn)


async def _exchange_async(
    conn: redis.asyncio.Connection, commands: list[Command], durability: Durability, where: str
) -> list[object]:
    """Every command's reply on ``conn``, an error reply in its place; then the WAIT's,
    checked, where durability is asked."""
    sent = [*commands, durability.command] if durability.asked else commands
    try:
        await conn.send_packed_command(conn.pack_commands(sent), check_health=False)
        replies = [await _reply_async(conn) for _ in commands]
        waited = await _reply_async(conn) if durability.asked else None
    except BaseException:
        await conn.disconnect()  # a half-read reply stream
        raise
    if durability.asked:
        durability.check(waited, where)
    return replies


async def _reply_async(conn: redis.asyncio.Connection) -> object:
    try:
        return await conn.read_response()
    except redis.exceptions.ResponseError as e:
        return e
