"""The native data plane on a real 3-master Redis Cluster (serving/fronts/reads.py,
native/src/front/redis.rs and slots.rs; serving/l1/roundtrip.py ``ClusterRoundTrip``):

- a key's hash slot as Redis's own ``CLUSTER KEYSLOT`` computes it (random keys, hash tags);
- lookups without the L1 answered by the fronts on their own connections to every master,
  byte for byte as their handlers answer them (``NATIVE_READS=off``) and as the pure-Python
  path answers them (``FEATURE_STORE_NATIVE=off``: redis-py's cluster pipeline), REST and
  gRPC, plain and hash-tagged keys, with an entity whose key holds another type;
- the L1's loads on the cluster grouped by master (no call handed to the pipeline);
- a master that refuses connections: lookups of the other masters' keys still answered by
  the fronts (its breaker is its own), its own keys a fast 503.

Resharding (MOVED, ASK) and a master's failover under load: test_cluster_failover.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import redis
import redis.asyncio
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrape import metric

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedCluster
from feature_store.ingest.spec import RetrySpec
from feature_store.ingest.writer import ChunkWriter
from feature_store.native import native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1.serving_pb2_grpc import FeatureServiceStub
from feature_store.registry import load_registry
from feature_store.serving.l1.roundtrip import ClusterRoundTrip
from feature_store.serving.l1.spec import GroupSpec
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not native_enabled(), reason="the extension is off"),
]

ENV = {
    "FEATURE_SERVING_CACHE": "off",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_SHADOW_FRACTION": "0",
}
AGES = re.compile(rb'"ages":\{[^}]*\}')
LOOKUPS = "feature_serving_front_lookups_total"
N = 300
WRONG_TYPE = 9001
# string ids whose keys carry hash tags ("s:{a}1": the slot of "a"), an empty tag (the
# whole key's slot), a lone brace, and plain ones
TAGGED = ["{a}1", "{a}2", "{b}x", "x{}y", "{", "}{z}", "plain", "{a}3", "q{b}"]
SESSIONS = """
version: 1
entities:
  session:
    prefix: s
    id_type: string
    ttl: 7d
feature_groups:
  session_features:
    entity: session
    features:
      clicks: int
      score: float
"""


def direct(server: ServingProcess, api: str = "rest") -> float:
    return metric(server, f'{LOOKUPS}{{api="{api}",how="read_direct"}}')


def directs_once_drained(server: ServingProcess, at_least: float, api: str = "rest") -> float:
    deadline = time.monotonic() + 5
    while (value := direct(server, api)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def answer(server: ServingProcess, body: dict[str, object]) -> tuple[int, bytes]:
    """The status and the body without its ages (whole seconds: one may turn between two
    answers)."""
    status, content = post(server, body)
    return status, AGES.sub(b"", content)


def post(server: ServingProcess, body: dict[str, object]) -> tuple[int, bytes]:
    r = httpx.post(
        f"{server.rest_url}/v1/features/get",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
        timeout=10,
    )
    return r.status_code, r.content


def grpc_answer(server: ServingProcess, request: pb.GetFeaturesRequest) -> pb.GetFeaturesResponse:
    with grpc.insecure_channel(server.grpc_target) as channel:
        got: pb.GetFeaturesResponse = FeatureServiceStub(channel).GetFeatures(request, timeout=10)
    for row in got.rows:
        row.ages.clear()  # whole seconds: one may turn between two answers
    return got


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=40),
        st.lists(st.sampled_from([b"{", b"}", b"a", b"b", b":", b"\xff", b""]), max_size=12).map(
            b"".join
        ),
    )
)
def test_a_keys_slot_is_the_one_redis_computes(redis_cluster: EmbeddedCluster, key: bytes) -> None:
    from feature_store._native import key_slot

    with redis.Redis(port=redis_cluster.nodes[0].port or 0) as client:
        assert key_slot(key) == client.execute_command("CLUSTER", "KEYSLOT", key)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The standard shape and a string-keyed entity, in one registry file."""
    text = sample.registry_text()
    extra = SESSIONS.split("entities:\n", 1)[1].split("feature_groups:\n", 1)
    text = text.replace("entities:\n", "entities:\n" + extra[0], 1)
    text = text.replace("feature_groups:\n", "feature_groups:\n" + extra[1], 1)
    path = tmp_path_factory.mktemp("registry") / "features.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def servers(
    redis_cluster: EmbeddedCluster, registry: Path
) -> Iterator[tuple[ServingProcess, ServingProcess, ServingProcess]]:
    """The fronts reading on their own connections, the handlers, the pure-Python path."""
    url = redis_cluster.url
    for node in redis_cluster.nodes:
        with redis.Redis(port=node.port or 0) as client:
            client.flushall()
    with FeatureStore.connect(url, load_registry(registry)) as store:
        store.write(sample.GROUP, sample.rows(N))
        store.write(
            "session_features",
            [(sid, {"clicks": i, "score": i / 4}) for i, sid in enumerate(TAGGED)],
        )
    prefix = sample.registry().entities[sample.ENTITY].prefix
    with redis.RedisCluster.from_url(url) as client:
        client.set(f"{prefix}:{WRONG_TYPE}", b"a string, not a hash")
    with (
        ServingProcess(url, registry=registry, env=ENV) as native,
        ServingProcess(
            url, registry=registry, env={**ENV, "FEATURE_SERVING_NATIVE_READS": "off"}
        ) as handlers,
        ServingProcess(url, registry=registry, env={**ENV, "FEATURE_STORE_NATIVE": "off"}) as ref,
    ):
        yield native, handlers, ref


BODIES: list[dict[str, object]] = [
    {"entity_type": sample.ENTITY, "ids": list(range(0, N, 7)), "groups": [sample.GROUP]},
    {"entity_type": sample.ENTITY, "ids": [4, 4, 10_000_000, -5, 11], "groups": [sample.GROUP]},
    {
        "entity_type": sample.ENTITY,
        "ids": [1, 10_000_000, 2, 250],
        "features": ["int_0", "float_03"],
    },
    {"entity_type": sample.ENTITY, "ids": list(range(N)), "features": sample.FLOATS[:30]},
    {"entity_type": "session", "ids": TAGGED, "groups": ["session_features"]},
    {"entity_type": "session", "ids": ["{a}1", "nobody", "{b}x"], "features": ["score"]},
]


def test_the_fronts_read_the_cluster_as_the_handlers_and_the_reference_do(
    servers: tuple[ServingProcess, ServingProcess, ServingProcess],
) -> None:
    native, handlers, ref = servers
    before = direct(native)
    for body in BODIES:
        for _ in range(2):  # the first of a form teaches the front; the second it answers
            got = [answer(server, body) for server in (native, handlers, ref)]
            assert got[0][0] == 200, got[0]
            assert got[0] == got[1] == got[2], body
    # the second of each body was read on the fronts' own connections to the masters
    assert directs_once_drained(native, before + len(BODIES)) >= before + len(BODIES)
    assert direct(handlers) == 0
    # every master's connections, both fronts
    assert metric(native, "feature_serving_front_redis_connections") >= 3 * 2
    # the values are the data's
    status, body = post(native, {"entity_type": "session", "ids": TAGGED, "features": ["clicks"]})
    assert status == 200
    assert [r["values"][0] for r in orjson.loads(body)["results"]] == list(range(len(TAGGED)))


def test_an_entity_whose_key_holds_another_type_is_the_handlers(
    servers: tuple[ServingProcess, ServingProcess, ServingProcess],
) -> None:
    native, handlers, _ = servers
    body = {"entity_type": sample.ENTITY, "ids": [3, WRONG_TYPE, 5], "groups": [sample.GROUP]}
    for _ in range(2):
        got = [answer(server, body) for server in (native, handlers)]
        assert got[0] == got[1]
    results = orjson.loads(post(native, body)[1])["results"]
    assert results[1]["statuses"][0] == "error"
    assert results[0]["statuses"][0] == "present"


def test_the_grpc_front_reads_the_cluster_as_the_method_does(
    servers: tuple[ServingProcess, ServingProcess, ServingProcess],
) -> None:
    native, handlers, ref = servers
    before = direct(native, "grpc")
    for request in (
        pb.GetFeaturesRequest(
            entity_type=sample.ENTITY, int_ids=list(range(0, N, 3)), groups=[sample.GROUP]
        ),
        pb.GetFeaturesRequest(entity_type="session", string_ids=TAGGED, features=["score"]),
    ):
        for _ in range(2):
            got = [grpc_answer(server, request) for server in (native, handlers, ref)]
            assert got[0] == got[1] == got[2]
    assert directs_once_drained(native, before + 2, "grpc") >= before + 2


def test_the_l1s_loads_are_grouped_by_master(
    servers: tuple[ServingProcess, ServingProcess, ServingProcess],
    registry: Path,
    redis_cluster: EmbeddedCluster,
) -> None:
    """With the L1 on, misses load through ClusterRoundTrip: every load one round trip per
    master, none handed to redis-py's pipeline (its calls are counted by the masters: the
    pipeline's HMGET/HGETALL come with no other sign, so the test reads the masters' count
    of reads against the entities asked)."""
    masters = redis_cluster.master_nodes()

    def reads() -> int:
        total = 0
        for node in masters:
            with redis.Redis(port=node.port or 0) as client:
                stats = client.info("commandstats")
            total += sum(
                int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall")
            )
        return total

    env = {**ENV, "FEATURE_SERVING_CACHE": "on", "FEATURE_SERVING_CACHE_TTL": "600"}
    with ServingProcess(redis_cluster.url, registry=registry, env=env) as cached:
        ids = list(range(100, 200))
        r0 = reads()
        first = answer(cached, {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        assert reads() - r0 == len(ids)  # each entity read once, on its master
        again = answer(cached, {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        assert reads() - r0 == len(ids)  # hits
        assert first == again
        native = servers[0]
        assert first == answer(
            native, {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]}
        )


def test_a_master_refusing_connections_keeps_the_others_on_the_fronts(tmp_path: Path) -> None:
    """A master killed in a cluster that has not noticed yet (cluster-node-timeout 60 s):
    its keys' lookups are a fast 503, and lookups of the others' keys stay 200 and are
    still read on the fronts' own connections, although Python's circuit opened."""
    from feature_store._native import key_slot

    with EmbeddedCluster(tmp_path / "cluster", node_timeout_ms=60_000) as cluster:
        with FeatureStore.connect(cluster.url, sample.registry()) as store:
            store.write(sample.GROUP, sample.rows(N))
        victim = cluster.master_nodes()[0]
        with redis.Redis(port=victim.port or 0) as client:
            ranges = [
                (start, end)
                for start, end, *nodes in client.execute_command("CLUSTER", "SLOTS")
                if nodes[0][1] == victim.port
            ]
        prefix = sample.registry().entities[sample.ENTITY].prefix

        def on_victim(i: int) -> bool:
            slot = key_slot(f"{prefix}:{i}".encode())
            return any(start <= slot <= end for start, end in ranges)

        theirs = [i for i in range(N) if on_victim(i)][:10]
        others = [i for i in range(N) if not on_victim(i)][:10]
        assert len(theirs) == len(others) == 10
        with ServingProcess(cluster.url, env=ENV, grpc=False) as server:
            healthy = {"entity_type": sample.ENTITY, "ids": others, "features": ["int_0"]}
            doomed = {"entity_type": sample.ENTITY, "ids": theirs, "features": ["int_0"]}
            expected = [sample.features(i)["int_0"] for i in others]
            for _ in range(3):
                assert answer(server, healthy)[0] == 200
                assert answer(server, doomed)[0] == 200
            victim.kill()
            for _ in range(20):  # enough failures to open Python's circuit
                status, body = answer(server, doomed)
                assert status == 503, body
            before = directs_once_drained(server, 0)
            for _ in range(20):
                status, body = post(server, healthy)
                assert status == 200, body
                assert [r["values"][0] for r in orjson.loads(body)["results"]] == expected
            assert directs_once_drained(server, before + 20) >= before + 20


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
def test_writes_by_master_follow_a_live_reshard(tmp_path: Path) -> None:
    """The nightly job's and the stream's writer (ChunkWriter) sends each master its share
    of a chunk; while 2,000 slots move, chunks that meet MOVED or ASK go again through
    redis-py's pipeline, and every value written reads back."""
    registry = sample.registry()
    group = registry.groups[sample.GROUP]
    with EmbeddedCluster(tmp_path / "cluster") as cluster:
        masters = cluster.master_nodes()
        ids = []
        for node in masters[:2]:
            with redis.Redis(port=node.port or 0) as client:
                ids.append(client.execute_command("CLUSTER", "MYID").decode())
        target = RedisTarget.parse(cluster.url)
        writer = ChunkWriter(
            target, ttl_seconds=3600, chunk_size=200, retry=RetrySpec(retries=5, base_delay=0.1)
        )
        reshard = subprocess.Popen(
            [
                *("redis-cli", "--cluster", "reshard", f"127.0.0.1:{masters[0].port}"),
                *("--cluster-from", ids[0], "--cluster-to", ids[1], "--cluster-slots", "2000"),
                *("--cluster-yes", "--cluster-pipeline", "10"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        rounds = 0
        try:
            while reshard.poll() is None and rounds < 200:  # bounded: about 20 s at most
                rows = [(i, {"int_0": rounds * 10_000 + i}) for i in range(2000)]
                plan = plan_write(group, rows)
                for start in range(0, len(plan.commands), 200):
                    writer.send(plan.commands[start : start + 200])
                rounds += 1
            assert reshard.wait(60) == 0, reshard.stderr.read() if reshard.stderr else ""
            last = rounds - 1
            with FeatureStore.connect(cluster.url, registry) as store:
                got = store.read(sample.ENTITY, list(range(2000)), features=["int_0"]).rows
            assert [r.values[0] for r in got] == [last * 10_000 + i for i in range(2000)]
        finally:
            if reshard.poll() is None:
                reshard.kill()
                reshard.wait()
            if reshard.stderr is not None:
                reshard.stderr.close()
            writer.close()
    assert rounds >= 2
    assert writer.redirected > 0  # the moves were met, and followed


def test_a_hung_master_costs_a_read_its_budget_not_the_connect_timeouts(tmp_path: Path) -> None:
    """A master that stops answering (SIGSTOP) accepts connections but never answers their
    handshake: a read that needs a new connection to it ends at its own deadline (asyncio's
    TimeoutError, which the breaker counts), not after redis-py's connect and handshake
    timeouts (a StoreTimeoutError seconds later, seen as requests past 1 s in the soak)."""
    registry = sample.registry()
    spec = GroupSpec.of(registry.groups[sample.GROUP], registry)
    prefix = registry.entities[sample.ENTITY].prefix
    reads = [(f"{prefix}:{i}".encode(), [spec]) for i in range(30)]  # every master's keys

    async def read_hung(target: RedisTarget, pid: int) -> type[BaseException]:
        client = target.async_client()
        assert isinstance(client, redis.asyncio.RedisCluster)
        round_trip = ClusterRoundTrip(client, target)
        try:
            got = await round_trip(reads, 5.0)  # the layout learnt, the pools made
            assert all(isinstance(r, bytes) for r in got)
            os.kill(pid, signal.SIGSTOP)
            try:
                await round_trip.aclose()  # no connection left: the next read makes them
                await round_trip(reads, 0.3)
            except BaseException as e:
                return type(e)
            finally:
                os.kill(pid, signal.SIGCONT)
                await asyncio.sleep(0.5)  # the cut connect ends; the pools can close it
            return type(None)
        finally:
            await round_trip.aclose()
            await client.aclose()

    with EmbeddedCluster(tmp_path / "cluster") as cluster:
        with FeatureStore.connect(cluster.url, registry) as store:
            store.write(sample.GROUP, sample.rows(30))
        victim = cluster.master_nodes()[0]
        assert victim.process is not None
        target = RedisTarget.parse(cluster.url, connect_timeout=2.0, socket_timeout=2.0)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            raised = runner.run(read_hung(target, victim.process.pid))
    assert raised is TimeoutError


def test_reads_of_a_moving_slot_are_followed_to_its_new_node_without_the_pipeline(
    tmp_path: Path,
) -> None:
    """A slot in migration (ASK) and then moved (MOVED) under a read of every master's keys:
    the redirected read is sent again to the node the reply names (after an ASKING for an
    ASK), not handed to redis-py's pipeline, which sends each redirected command alone; the
    values are those read before the move, and a MOVED has the layout learnt again."""
    registry = sample.registry()
    spec = GroupSpec.of(registry.groups[sample.GROUP], registry)
    prefix = registry.entities[sample.ENTITY].prefix
    keys = [f"{prefix}:{i}".encode() for i in range(40)]
    reads = [(key, [spec]) for key in keys]

    async def read(round_trip: ClusterRoundTrip) -> list[object]:
        return list(await round_trip(reads, 5.0))

    with EmbeddedCluster(tmp_path / "cluster") as cluster:
        with FeatureStore.connect(cluster.url, registry) as store:
            store.write(sample.GROUP, sample.rows(40))
        ids = {}
        for node in cluster.master_nodes():
            with redis.Redis(port=node.port or 0) as c:
                ids[node.port] = c.execute_command("CLUSTER", "MYID").decode()
        with redis.RedisCluster.from_url(cluster.url) as rc:
            slot = rc.keyslot(keys[0])
            source = rc.get_node_from_key(keys[0]).port
        dest = next(port for port in ids if port != source)
        src, dst = redis.Redis(port=source), redis.Redis(port=dest)
        target = RedisTarget.parse(cluster.url)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            client = target.async_client()
            assert isinstance(client, redis.asyncio.RedisCluster)
            round_trip = ClusterRoundTrip(client, target)
            try:
                before = runner.run(read(round_trip))
                assert all(isinstance(r, bytes) for r in before)
                dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
                src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dest])
                src.execute_command("MIGRATE", "127.0.0.1", dest, keys[0], 0, 5000)
                assert runner.run(read(round_trip)) == before  # ASK, followed
                for port in ids:  # the slot is the other node's: MOVED
                    with redis.Redis(port=port) as c:
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dest])
                assert runner.run(read(round_trip)) == before
                assert round_trip.handed_over == 0
                deadline = time.monotonic() + 5
                while client.nodes_manager.slots_cache[slot][0].port != dest:
                    assert time.monotonic() < deadline, "the layout was not learnt again"
                    runner.run(asyncio.sleep(0.05))
                assert runner.run(read(round_trip)) == before
                assert round_trip.handed_over == 0
            finally:
                runner.run(round_trip.aclose())
                runner.run(client.aclose())
                src.close()
                dst.close()
