"""Serving against a real 3-master Redis Cluster: reads route per node, writes invalidate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
import uvloop

from feature_store import sample
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedCluster
from feature_store.errors import StoreTimeoutError
from feature_store.serving.config import ServingSettings
from feature_store.serving.l1 import roundtrip
from feature_store.serving.l1.roundtrip import ClusterRoundTrip, PipelineRoundTrip, Read, Reply
from feature_store.serving.l1.spec import GroupSpec
from feature_store.serving.runtime import ServingRuntime
from feature_store.store import FeatureStore

pytestmark = pytest.mark.cluster


async def test_lookups_and_push_writes_on_a_cluster(cluster_url: str) -> None:
    registry = sample.registry()
    with FeatureStore.connect(cluster_url, registry) as store:
        store.write(sample.GROUP, sample.rows(200))
    rt = ServingRuntime(registry, RedisTarget.parse(cluster_url), ServingSettings())
    await rt.start()
    try:
        assert isinstance(rt.reader.round_trip, ClusterRoundTrip)
        ids = list(range(0, 200, 7))  # keys spread over the three masters' slots
        lookup = await rt.service.lookup(sample.ENTITY, ids, ["int_1", "float_03"])
        got = [r[0].entry.values for r in lookup.entries]
        names = [f.name for f in registry.groups[sample.GROUP].features]
        i1, f3 = names.index("int_1"), names.index("float_03")
        codec = registry.groups[sample.GROUP].features[f3].codec  # float32: as stored
        assert [(v[i1], v[f3]) for v in got if v is not None] == [
            (
                sample.features(i)["int_1"],
                codec.decode(codec.encode(sample.features(i)["float_03"])),
            )
            for i in ids
        ]
        await rt.service.write(sample.GROUP, [(7, {"int_1": 1})])
        again = await rt.service.lookup(sample.ENTITY, [7], ["int_1"])
        values = again.entries[0][0].entry.values
        assert values is not None
        assert values[i1] == 1
    finally:
        await rt.stop()


def test_a_read_on_connections_closed_under_the_client_is_sent_again(cluster_url: str) -> None:
    """Connections whose transports closed under redis-py's cluster client (it still holds
    them as connected) make uvloop raise RuntimeError on the next write: the round trip is
    sent again on fresh connections and answers, as after any connection error (seen
    during a reshard under load as a 503, "the read failed: RuntimeError")."""
    registry = sample.registry()
    with FeatureStore.connect(cluster_url, registry) as store:
        store.write(sample.GROUP, sample.rows(30))
    reads = _reads(30)

    async def read_twice() -> tuple[list[Reply], list[Reply], int]:
        client = RedisTarget.parse(cluster_url).async_client()
        assert isinstance(client, redis.asyncio.RedisCluster)
        try:
            round_trip = PipelineRoundTrip(client)
            first = await round_trip(reads, 5.0)
            closed = 0
            for node in client.get_nodes():
                for conn in node._free:
                    if conn.is_connected:
                        conn._writer.transport.close()
                        closed += 1
            await asyncio.sleep(0)  # the transports close
            return first, await round_trip(reads, 5.0), closed
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        first, again, closed = runner.run(read_twice())
    assert closed >= 3  # one connection per master at least
    assert all(isinstance(r, list) and r[0] is not None for r in first)
    assert again == first


def _reads(n: int) -> list[Read]:
    registry = sample.registry()
    spec = GroupSpec.of(registry.groups[sample.GROUP], registry)
    prefix = registry.entities[sample.ENTITY].prefix
    return [(f"{prefix}:{i}".encode(), [spec]) for i in range(n)]


def test_a_layout_refresh_cut_with_its_read_finishes_for_the_next_read(
    redis_cluster: EmbeddedCluster, cluster_url: str
) -> None:
    """After a node dies, redis-py learns the cluster's layout again (CLUSTER SLOTS, then
    COMMAND) at the next command. A read cut while it waits must not take the refresh
    down with it: on a loaded host every refresh outlived its read's budget, each read
    started it over, and serving stayed down after a failover until the load stopped."""
    reads = _reads(30)
    nodes = [redis.Redis.from_url(node.url) for node in redis_cluster.nodes]

    def refreshes() -> int:  # CLUSTER SLOTS asked, over all the nodes
        stats = (node.info("commandstats") for node in nodes)
        return sum(s.get("cmdstat_cluster|slots", {}).get("calls", 0) for s in stats)

    async def cut_then_read() -> tuple[int, int, int]:
        client = RedisTarget.parse(cluster_url).async_client()
        assert isinstance(client, redis.asyncio.RedisCluster)
        try:
            round_trip = PipelineRoundTrip(client)
            await round_trip(reads, 5.0)
            await client.aclose()  # as after a connection error: the layout is forgotten
            before = refreshes()
            with pytest.raises(TimeoutError):  # cut while the layout is being learnt
                await asyncio.wait_for(round_trip(reads, 5.0), 0.0001)
            for _ in range(100):  # the refresh goes on without the read (at most 5 s)
                await asyncio.sleep(0.05)
                if not client._initialize:
                    break
            learnt = refreshes()
            await round_trip(reads, 5.0)
            return before, learnt, refreshes()
        finally:
            await client.aclose()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            before, learnt, after = runner.run(cut_then_read())
    finally:
        for node in nodes:
            node.close()
    assert learnt == before + 1  # the cut read's refresh went on to the end
    assert after == learnt  # and the next read did not have to start it over


@pytest.fixture
def slow_layout(monkeypatch: pytest.MonkeyPatch) -> float:
    """Learning a cluster's layout takes 0.5 s longer, as on a loaded host (the seconds)."""
    delay = 0.5
    learn = redis.asyncio.cluster.NodesManager.initialize

    async def slowly(self: redis.asyncio.cluster.NodesManager, *args: Any, **kw: Any) -> None:
        await asyncio.sleep(delay)
        await learn(self, *args, **kw)

    monkeypatch.setattr(redis.asyncio.cluster.NodesManager, "initialize", slowly)
    return delay


def _read_after_a_forgotten_layout(
    url: str, answer_within: float
) -> tuple[list[Reply], list[Reply]]:
    """30 entities read with 5 s to answer, then again with ``answer_within`` after the
    client forgot the cluster's layout."""
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(30))

    async def run() -> tuple[list[Reply], list[Reply]]:
        client = RedisTarget.parse(url).async_client()
        assert isinstance(client, redis.asyncio.RedisCluster)
        try:
            round_trip = PipelineRoundTrip(client)
            first = await round_trip(_reads(30), 5.0)
            await client.aclose()  # as after a connection error: the layout is forgotten
            return first, await round_trip(_reads(30), answer_within)
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())


def test_a_read_is_not_cut_by_the_time_the_layout_takes_to_learn(
    cluster_url: str, slow_layout: float
) -> None:
    """The first read after a failover learns the new layout. With the circuit open it is
    the one probe that decides whether Redis is back: cut because learning took longer
    than its budget, it reopened the circuit for twice as long, with the cluster fine."""
    first, again = _read_after_a_forgotten_layout(cluster_url, slow_layout / 2)
    assert all(isinstance(r, list) and r[0] is not None for r in first)
    assert again == first


def test_a_layout_that_is_not_learnt_in_time_fails_the_read_and_says_so(
    cluster_url: str, slow_layout: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roundtrip, "LAYOUT_WAIT", slow_layout / 5)
    with pytest.raises(StoreTimeoutError, match="layout was not learnt within"):
        _read_after_a_forgotten_layout(cluster_url, 5.0)
