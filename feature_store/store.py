"""The store client: batch reads and writes of features, sync and asyncio.

Both clients hand the same command lists (``feature_store.batch``) to a pipeline; only the
``_run`` methods differ. Against Redis Cluster, redis-py's cluster pipeline splits the
commands by node and sends each node its share in one round trip.

    store = FeatureStore.connect("redis://127.0.0.1:6379", load_registry("features.yaml"))
    result = store.read("consumer", [1, 2, 3], groups=["consumer_features"])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Generic, TypeVar

from redis.exceptions import NoScriptError

from feature_store import notices
from feature_store.batch import (
    BatchResult,
    Command,
    EntityId,
    RawReply,
    ReadPlan,
    WritePlan,
    WriteRow,
    WriteStats,
    decode_read,
    plan_read,
    plan_write,
)
from feature_store.connection import (
    AsyncClient,
    RedisTarget,
    SyncClient,
    close_client,
    read_replies,
    translated_errors,
)
from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.errors import StoreError
from feature_store.layout import max_encoded_size, with_script
from feature_store.registry import FeatureGroup, Registry
from feature_store.sending import raised, send_async, send_durable
from feature_store.settings import target_from_env

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 500  # entities per write pipeline: ~50k fields, a few MB on the wire

C = TypeVar("C")


def _chunks(rows: Iterable[WriteRow], size: int) -> Iterable[list[WriteRow]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def listpack_value_needed(registry: Registry) -> int:
    """The ``hash-max-listpack-value`` that keeps every bounded value of the registry compact."""
    sizes = [max_encoded_size(f.type, f.dim) for g in registry.groups.values() for f in g.features]
    return max([64, *(s for s in sizes if s is not None)])


def read_plans(
    client: SyncClient, plans: Sequence[ReadPlan], now: float | None = None
) -> list[BatchResult]:
    """Every plan's commands in one pipelined round trip, each plan's replies decoded."""
    with translated_errors():
        pipe = client.pipeline(transaction=False)
        for plan in plans:
            for cmd in plan.commands():
                pipe.execute_command(*cmd)
        replies = pipe.execute(raise_on_error=False)
    out, at = [], 0
    for plan in plans:
        mine = replies[at : at + len(plan.keys)]
        at += len(plan.keys)
        out.append(decode_read(plan, plan.align(read_replies(plan.keys, mine)), now))
    return out


class _Write:
    """The logic of one write, for both clients (they only run the plans): one default
    event time for every chunk, the plans chunk by chunk, the totals from Redis's replies,
    and the notice for serving."""

    def __init__(
        self,
        group: FeatureGroup,
        rows: Iterable[WriteRow],
        chunk_size: int,
        event_time: object,
        origin: str | None,
    ) -> None:
        self.group, self.rows, self.chunk_size = group, rows, chunk_size
        self.now = time.time()  # also the event time of rows without one (plan_write)
        self.event_time = event_time
        self.origin = origin  # None: tell no one
        self.total = WriteStats()
        self.keys: list[bytes] = []  # up to one more than a keys notice carries

    def plans(self) -> Iterator[WritePlan]:
        for chunk in _chunks(self.rows, self.chunk_size):
            plan = plan_write(self.group, chunk, event_time=self.event_time, now=self.now)
            self.keys += plan.keys[: notices.KEYS_MAX + 1 - len(self.keys)]
            yield plan

    def ran(self, plan: WritePlan, replies: Sequence[object]) -> None:
        self.total += plan.outcome(replies)

    def notice(self) -> bytes | None:
        """What serving instances are told: the keys, or the group's generation if many."""
        if self.origin is None or not self.keys:
            return None
        return notices.write_message(self.origin, self.group.name, self.keys, time.time())


class _Base(Generic[C]):
    def __init__(
        self,
        registry: Registry,
        client: C,
        *,
        max_entities: int | None = None,
        notify: bool = True,
        durability: Durability = ASYNCHRONOUS,
    ) -> None:
        self.registry = registry
        self.client = client
        self.max_entities = max_entities
        # replicas each write waits for (feature_store.durability): FEATURE_STORE_WRITE_
        # DURABILITY, or the RedisTarget's
        self.durability = durability
        # tell serving instances about writes (feature_store.notices), so that their caches
        # do not serve the old values until their TTL
        self.notify = notify
        self.origin = notices.new_origin()

    def plan(
        self,
        entity: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
    ) -> ReadPlan:
        return plan_read(
            self.registry, entity, ids, features, groups, max_entities=self.max_entities
        )

    def _writing(
        self, group: str, rows: Iterable[WriteRow], chunk_size: int, event_time: object
    ) -> _Write:
        origin = self.origin if self.notify else None
        return _Write(self.registry.group(group), rows, chunk_size, event_time, origin)

    @staticmethod
    def _notice_failed(error: Exception) -> None:
        # the write stands; serving instances catch up within their cache TTL
        log.warning("could not tell serving instances about a write: %s", error)

    def _check_listpack(self, configured: Mapping[bytes | str, bytes | str]) -> None:
        needed = listpack_value_needed(self.registry)
        for value in configured.values():
            if int(value) < needed:
                log.warning(
                    "Redis hash-max-listpack-value is %s but this registry's values need %d: "
                    "entity hashes will use the hashtable encoding, about 3x the memory. "
                    "Set it as in feature_store/redis.conf.",
                    int(value),
                    needed,
                )


class FeatureStore(_Base[SyncClient]):
    """Blocking client, for Spark executors, scripts and tests."""

    @classmethod
    def connect(
        cls, url: str | RedisTarget, registry: Registry, *, notify: bool = True
    ) -> FeatureStore:
        """``notify``: tell serving instances about writes (``feature_store.notices``)."""
        target = url if isinstance(url, RedisTarget) else target_from_env(url)
        return cls(registry, target.sync_client(), notify=notify, durability=target.durability)

    def _pipeline(self, commands: list[Command]) -> list[object]:
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        return pipe.execute()  # raises the first error: a cluster client learns from it

    def _run(self, commands: list[Command]) -> list[object]:
        """Each command's reply; sent again with the write script's text if Redis lost it
        (a restart, SCRIPT FLUSH, a promoted replica). With write durability, each master's
        share confirmed by its replicas (NotDurableError if not)."""
        with translated_errors():
            if self.durability.asked:
                return raised(send_durable(self.client, commands, self.durability))
            try:
                return self._pipeline(commands)
            except NoScriptError:  # idempotent: the whole chunk again, with the script
                return self._pipeline([with_script(c) for c in commands])

    def read(
        self,
        entity: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
    ) -> BatchResult:
        return read_plans(self.client, [self.plan(entity, ids, features, groups)])[0]

    def write(
        self,
        group: str,
        rows: Iterable[WriteRow],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        event_time: object = None,
    ) -> WriteStats:
        """Write rows of one group, in pipelines of ``chunk_size`` entities; then tell
        serving instances (``notify``), also when a chunk failed after others were sent.

        A row is ``(id, values)`` or ``(id, values, event_time)``; ``event_time`` (unix
        seconds, an RFC 3339 string or an aware datetime) is for rows without their own,
        default now. A row older than what Redis holds for its entity's group changes
        nothing and is counted in ``WriteStats.skipped``."""
        write = self._writing(group, rows, chunk_size, event_time)
        try:
            for plan in write.plans():
                write.ran(plan, self._run(plan.commands))
        finally:
            message = write.notice()
            if message is not None:
                try:
                    with translated_errors():
                        self.client.publish(notices.CHANNEL, message)
                except StoreError as e:
                    self._notice_failed(e)
        return write.total

    def announce(self, group: str, ended_at: float) -> bool:
        """Tell serving instances that ``group`` was written in bulk until ``ended_at``
        (unix seconds; the Spark job does, at its end); False, logged, if the message could
        not be sent."""
        self.registry.group(group)
        message = notices.generation_message(self.origin, group, ended_at)
        try:
            with translated_errors():
                self.client.publish(notices.CHANNEL, message)
        except StoreError as e:
            self._notice_failed(e)
            return False
        return True

    def ping(self) -> bool:
        with translated_errors():
            return bool(self.client.ping())

    def check_server(self) -> None:
        """Warn if the server's listpack limit would bloat this registry's hashes."""
        with translated_errors():
            cfg = self.client.config_get("hash-max-listpack-value")
        self._check_listpack(_flatten_config(cfg))

    def close(self) -> None:
        close_client(self.client)

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFeatureStore(_Base[AsyncClient]):
    """asyncio client, for the serving path."""

    @classmethod
    def connect(
        cls, url: str | RedisTarget, registry: Registry, *, notify: bool = True
    ) -> AsyncFeatureStore:
        target = url if isinstance(url, RedisTarget) else target_from_env(url)
        return cls(registry, target.async_client(), notify=notify, durability=target.durability)

    async def _pipeline(self, commands: list[Command]) -> list[object]:
        pipe = self.client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        return await pipe.execute()

    async def _run(self, commands: list[Command]) -> list[object]:
        """As ``FeatureStore._run``."""
        with translated_errors():
            if self.durability.asked:
                return raised(await send_async(self.client, commands, self.durability))
            try:
                return await self._pipeline(commands)
            except NoScriptError:
                return await self._pipeline([with_script(c) for c in commands])

    async def run_plan(self, plan: ReadPlan) -> list[RawReply]:
        """A plan's raw values, aligned with ``plan.fields``: for callers that decode later.
        A key of another type than a hash gives its ``EntityDataError`` in its place."""
        with translated_errors():
            pipe = self.client.pipeline(transaction=False)
            for cmd in plan.commands():
                pipe.execute_command(*cmd)
            replies = await pipe.execute(raise_on_error=False)
        return plan.align(read_replies(plan.keys, replies))

    async def read(
        self,
        entity: str,
        ids: Sequence[EntityId],
        features: Iterable[str] = (),
        groups: Iterable[str] = (),
    ) -> BatchResult:
        plan = self.plan(entity, ids, features, groups)
        return decode_read(plan, await self.run_plan(plan))

    async def write(
        self,
        group: str,
        rows: Iterable[WriteRow],
        *,
        chunk_size: int = DEFAULT_CHUNK,
        event_time: object = None,
    ) -> WriteStats:
        """As ``FeatureStore.write``."""
        write = self._writing(group, rows, chunk_size, event_time)
        try:
            for plan in write.plans():
                write.ran(plan, await self._run(plan.commands))
        finally:
            message = write.notice()
            if message is not None:
                try:
                    with translated_errors():
                        await self.client.publish(notices.CHANNEL, message)
                except StoreError as e:
                    self._notice_failed(e)
        return write.total

    async def ping(self) -> bool:
        with translated_errors():
            return bool(await self.client.ping())

    async def check_server(self) -> None:
        with translated_errors():
            cfg = await self.client.config_get("hash-max-listpack-value")
        self._check_listpack(_flatten_config(cfg))

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncFeatureStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _flatten_config(cfg: object) -> dict[bytes | str, bytes | str]:
    """CONFIG GET's reply as name -> value; a cluster client answers per node."""
    if not isinstance(cfg, dict):
        return {}
    out: dict[bytes | str, bytes | str] = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update({f"{k}:{kk!r}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


__all__ = ["AsyncFeatureStore", "FeatureStore", "listpack_value_needed"]
