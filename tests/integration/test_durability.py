"""Writes confirmed by replicas (``--write-durability``): acknowledged only once WAIT says
enough replicas hold them, a 503 ``not_durable`` (gRPC UNAVAILABLE) otherwise, retried by
the jobs; on one node and on a 3+3 Redis Cluster, with a replica paused (SIGSTOP) to make
WAIT fall short. The loss they prevent (an acknowledged write gone after a failover) is
the soak's (benchmarks/soak.py, tests/integration/test_soak.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.client import GrpcFeatureClient, ServingUnavailableError
from feature_store.connection import RedisOptions, RedisTarget
from feature_store.durability import Durability
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.errors import NotDurableError, StoreUnavailableError
from feature_store.ingest.spec import RetrySpec
from feature_store.ingest.writer import ChunkWriter
from feature_store.layout import entity_key
from feature_store.serving.process import ServingProcess
from feature_store.store import AsyncFeatureStore, FeatureStore

pytestmark = pytest.mark.cluster

GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()
DURABLE = "replicas=1,timeout=200"


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    # a node timeout far longer than any pause here: a paused replica is never failed over
    with EmbeddedCluster(
        tmp_path_factory.mktemp("durable"), replicas=1, node_timeout_ms=30_000
    ) as cluster:
        yield cluster


def replica_of(cluster: EmbeddedCluster, key: bytes) -> EmbeddedRedis:
    """The replica of the master that owns ``key``'s slot."""
    with redis.Redis(port=cluster.nodes[0].port) as r:
        slot = r.cluster("keyslot", key)
        master_port = next(m[1] for s, e, m, *_ in r.cluster("slots") if s <= slot <= e)
    return cluster.replica_of(master_port)


@contextmanager
def paused(node: EmbeddedRedis) -> Iterator[None]:
    assert node.process is not None
    os.kill(node.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(node.process.pid, signal.SIGCONT)


def key_of(entity: int) -> bytes:
    e = REGISTRY.entities[ENTITY]
    return entity_key(e.prefix, e.id_type, entity)


def body(entity: int, value: int) -> dict[str, object]:
    return {"group": GROUP, "rows": [{"id": entity, "values": {"int_0": value}}]}


def served(url: str, entity: int) -> object:
    r = httpx.post(
        f"{url}/v1/features/get",
        json={"entity_type": ENTITY, "ids": [entity], "features": ["int_0"]},
        timeout=5,
    )
    return r.json()["results"][0]["values"][0]


def test_push_writes_wait_for_a_replica_and_fail_when_none_confirms(
    replicated: EmbeddedCluster, tmp_path: Path
) -> None:
    args = ["--no-cache", "--write-durability", DURABLE]
    with ServingProcess(replicated.url, args=args, log_path=tmp_path / "serve.log") as server:
        ok = httpx.post(f"{server.rest_url}/v1/features/write", json=body(7, 70), timeout=5)
        assert ok.status_code == 200, ok.text
        assert served(server.rest_url, 7) == 70
        replica = replica_of(replicated, key_of(7))
        # an entity whose master's replica stays up (found before the pause: ROLE on a
        # paused node hangs)
        other = next(i for i in range(100) if replica_of(replicated, key_of(i)) is not replica)
        with paused(replica):
            t0 = time.monotonic()
            r = httpx.post(f"{server.rest_url}/v1/features/write", json=body(7, 71), timeout=5)
            took = time.monotonic() - t0
            assert r.status_code == 503, r.text
            problem = r.json()["error"]
            assert problem["code"] == "not_durable"
            assert "confirmed by 0 of 1 replica(s) within 200 ms" in problem["message"]
            assert took < 2.0  # WAIT's timeout, not a hang
            # gRPC says the same, as UNAVAILABLE (a client retries it)
            with (
                GrpcFeatureClient(server.grpc_target, timeout=5) as grpc_client,
                pytest.raises(ServingUnavailableError, match="not durable"),
            ):
                grpc_client.write(GROUP, [(7, {"int_0": 72})])
            # a master whose replica is fine takes writes meanwhile: only its share waits
            fine = httpx.post(
                f"{server.rest_url}/v1/features/write", json=body(other, 5), timeout=5
            )
            assert fine.status_code == 200, fine.text
        # the replica back: the same write goes through (writes are idempotent)
        again = httpx.post(f"{server.rest_url}/v1/features/write", json=body(7, 73), timeout=5)
        assert again.status_code == 200, again.text
        assert served(server.rest_url, 7) == 73


def test_jobs_retry_a_chunk_that_no_replica_confirmed(replicated: EmbeddedCluster) -> None:
    rows = [(i, {**sample.features(i), "int_0": 1000 + i}) for i in range(200)]
    target = RedisOptions(socket_timeout=2.0, durability=Durability(1, 100)).target(replicated.url)
    commands = plan_write(REGISTRY.groups[GROUP], rows).commands
    # replicas there: written and confirmed
    writer = ChunkWriter(
        target, ttl_seconds=3600, chunk_size=100, retry=RetrySpec(retries=2, base_delay=0.05)
    )
    try:
        assert len(writer.send(commands)) == len(commands)
        assert writer.counters.retries == 0
        # more replicas asked than the cluster has: every attempt falls short, then a clear
        # failure naming the shortfall, never a success
        short = ChunkWriter(
            RedisOptions(socket_timeout=2.0, durability=Durability(2, 50)).target(replicated.url),
            ttl_seconds=3600,
            chunk_size=100,
            retry=RetrySpec(retries=2, base_delay=0.05),
        )
        with pytest.raises(StoreUnavailableError, match=r"confirmed by 1 of 2 replica") as e:
            short.send(commands)
        assert isinstance(e.value.__cause__, NotDurableError)
        assert short.counters.retries == 1 + 2  # every attempt fell short, each counted
        short.close()
    finally:
        writer.close()


def test_one_node_without_a_replica_refuses_a_durable_write(redis_url: str, tmp_path: Path) -> None:
    with ServingProcess(
        redis_url,
        args=["--no-grpc", "--write-durability", "replicas=1,timeout=50"],
        grpc=False,
        log_path=tmp_path / "serve.log",
    ) as server:
        r = httpx.post(f"{server.rest_url}/v1/features/write", json=body(3, 30), timeout=5)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "not_durable"
        assert "confirmed by 0 of 1" in r.json()["error"]["message"]
    # the default (asynchronous) takes it
    with ServingProcess(
        redis_url, args=["--no-grpc"], grpc=False, log_path=tmp_path / "serve2.log"
    ) as server:
        r = httpx.post(f"{server.rest_url}/v1/features/write", json=body(3, 31), timeout=5)
        assert r.status_code == 200, r.text


def test_the_library_waits_for_replicas_on_a_cluster_and_on_one_node(
    replicated: EmbeddedCluster, redis_url: str
) -> None:
    rows = [(i, {"int_0": 500 + i}) for i in range(50)]

    def durable(url: str, replicas: int) -> RedisTarget:
        return RedisOptions(socket_timeout=2.0, durability=Durability(replicas, 100)).target(url)

    with FeatureStore.connect(durable(replicated.url, 1), REGISTRY) as store:
        assert store.write(GROUP, rows).entities == 50
        assert store.read(ENTITY, [7], features=["int_0"]).rows[0].values == [507]
    for url in (replicated.url, redis_url):  # 2 replicas asked of 1; 1 asked of none
        replicas = 2 if url == replicated.url else 1
        with (
            FeatureStore.connect(durable(url, replicas), REGISTRY) as store,
            pytest.raises(NotDurableError, match=f"of {replicas} replica"),
        ):
            store.write(GROUP, rows)

    async def asynchronous() -> None:
        store = AsyncFeatureStore.connect(durable(replicated.url, 1), REGISTRY)
        try:
            assert (await store.write(GROUP, rows)).entities == 50
        finally:
            await store.close()
        store = AsyncFeatureStore.connect(durable(redis_url, 1), REGISTRY)
        try:
            with pytest.raises(NotDurableError, match="confirmed by 0 of 1"):
                await store.write(GROUP, rows)
        finally:
            await store.close()

    asyncio.run(asynchronous())
