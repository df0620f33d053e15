"""Acknowledged push writes lost when a master dies behind its replica, and what waiting
for the replica costs: `serve` without and with `--write-durability replicas=1`.

    python3 benchmarks/durability.py [--steady 8] [--concurrency 8] [--batch 100] [--out FILE]

Both settings run the same procedure in the same run, each on a fresh Redis Cluster of 3
masters and 3 replicas on loopback (cluster-node-timeout 2 s) behind one `feature-store
serve` worker (L1 off, REST), written by ``--concurrency`` clients in this process, each
write ``--batch`` entities of the standard shape, every entity written once (so a write
is either in Redis afterwards or lost):

1. **Steady** (``--steady`` seconds, no fault): writes/s, entities/s, latency, and CPU
   µs per entity written of the worker and of the three masters (/proc/<pid>/stat).
2. **The master dies behind its replica**: one master's replica is paused (SIGSTOP) and
   its replication link cut (``CLIENT KILL TYPE replica`` on the master: a partition of
   the replica, in effect), for ``PAUSE`` seconds while writes go on; then the master is
   SIGKILLed and the replica resumed: it is promoted holding what had reached it. Redis's
   replication is asynchronous: without durability, what the master acknowledged after
   the cut is gone. The killed node is then started again (it rejoins as the new
   master's replica) and the writes go on to the end.
   Afterwards every acknowledged write's entities are read back from the cluster: an
   entity without its value is an **acknowledged write lost**.

The link is cut because a paused replica alone is not a partitioned one: the master's
stream waits in the sockets' buffers (several MB) and is applied when the replica resumes;
a first version of this benchmark, without the cut, lost 1,756 acknowledged entities in one
run and none in the next.

Load generator and server share the machine's two cores: writes/s compare the two
settings in this run, not a server's capacity.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import asyncio
import itertools
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from _results import header, save
from cost import cpu_seconds

from feature_store import sample
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

SETTINGS = {"asynchronous": "", "replicas=1": "replicas=1,timeout=500"}
PAUSE = 3.0  # seconds the replica is paused before its master is killed
AFTER = 15.0  # seconds of writes after the kill (failover, the node back, writes again)
FEATURES = sample.features(1)  # every entity's values but int_0 (made once: the load is light)


def value(entity: int) -> int:
    return entity * 7 + 1


@dataclass
class Writes:
    """Every write's (start, end, status, first id) since ``t0``; ids are consecutive."""

    batch: int
    t0: float = field(default_factory=time.monotonic)
    log: list[tuple[float, float, str, int]] = field(default_factory=list)

    def acked_ids(self) -> list[int]:
        return [
            i for _, _, s, first in self.log if s == "200" for i in range(first, first + self.batch)
        ]

    def between(self, a: float, b: float) -> list[tuple[float, float, str, int]]:
        return [w for w in self.log if a <= w[0] < b]


async def write_for(
    url: str, seconds: float, clients: int, ids: itertools.count[int], w: Writes
) -> None:
    """``clients`` writers, each one write at a time, for ``seconds``."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=clients)) as http:

        async def one() -> None:
            while time.monotonic() < deadline:
                first = next(ids) * w.batch
                rows = [
                    {"id": i, "values": {**FEATURES, "int_0": value(i)}}
                    for i in range(first, first + w.batch)
                ]
                start = time.monotonic()
                try:
                    r = await http.post(
                        f"{url}/v1/features/write", json={"group": sample.GROUP, "rows": rows}
                    )
                    status = str(r.status_code)
                    if r.status_code == 503:
                        status += " " + r.json()["error"]["code"]
                except httpx.HTTPError as e:
                    status = type(e).__name__
                w.log.append((start - w.t0, time.monotonic() - w.t0, status, first))

        await asyncio.gather(*(one() for _ in range(clients)))


def steady_window(
    server: ServingProcess,
    masters: list[EmbeddedRedis],
    seconds: float,
    clients: int,
    ids: itertools.count[int],
    batch: int,
) -> dict[str, float]:
    """One window of writes without a fault: its figures."""
    assert server.process is not None
    pids = [server.process.pid, *(m.process.pid for m in masters if m.process)]
    w = Writes(batch)
    cpu0 = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    asyncio.run(write_for(server.rest_url, seconds, clients, ids, w))
    took = time.monotonic() - t0
    cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
    ok = [x for x in w.log if x[2] == "200"]
    lat = sorted(e - s for s, e, _, _ in ok) or [math.nan]
    entities = max(1, len(ok) * batch)
    return {
        "writes_per_s": len(ok) / took,
        "entities_per_s": entities / took,
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000,
        "max_ms": lat[-1] * 1000,
        "failed": len(w.log) - len(ok),
        "server_us_per_entity": cpu[0] / entities * 1e6,
        "redis_us_per_entity": sum(cpu[1:]) / entities * 1e6,
    }


def run_steady(
    tmp: Path, rounds: int, seconds: float, clients: int, batch: int
) -> dict[str, dict[str, float]]:
    """Both settings on one cluster, a deployment each, windows alternated (``rounds`` of
    each): per setting, the median of each figure over its windows."""
    out: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    ids = itertools.count()
    with EmbeddedCluster(tmp / "steady", replicas=1, node_timeout_ms=2000) as cluster:
        servers: dict[str, ServingProcess] = {}
        try:
            for name, durability in SETTINGS.items():
                args = ["--no-cache", "--no-grpc", "--log-level", "warning"]
                args += ["--write-durability", durability] if durability else []
                servers[name] = ServingProcess(
                    cluster.url, args=args, grpc=False, log_path=tmp / f"steady-{name}.log"
                ).start()
            masters = cluster.master_nodes()
            for server in servers.values():  # warm-up
                asyncio.run(write_for(server.rest_url, 1.0, clients, ids, Writes(batch)))
            for _ in range(rounds):
                for name, server in servers.items():
                    out[name].append(steady_window(server, masters, seconds, clients, ids, batch))
        finally:
            for server in servers.values():
                server.stop()
    return {
        name: {k: statistics.median(w[k] for w in windows) for k in windows[0]}
        for name, windows in out.items()
    }


def run_fault(name: str, durability: str, tmp: Path, clients: int, batch: int) -> dict[str, object]:
    """A fresh cluster; a master killed after its replica was paused; acked writes lost."""
    ids = itertools.count()
    with EmbeddedCluster(tmp / name, replicas=1, node_timeout_ms=2000) as cluster:
        args = ["--no-cache", "--no-grpc", "--log-level", "warning"]
        args += ["--write-durability", durability] if durability else []
        with ServingProcess(
            cluster.url, args=args, grpc=False, log_path=tmp / f"{name}.log"
        ) as server:
            asyncio.run(write_for(server.rest_url, 1.0, clients, ids, Writes(batch)))  # warm-up
            victim = next(m for m in cluster.master_nodes() if m is not cluster.nodes[0])
            replica = cluster.replica_of(victim.port)  # (the URL's node stays up)
            assert replica.process is not None
            f = Writes(batch)
            events: dict[str, float] = {}

            def fault() -> None:
                time.sleep(1.0)
                events["paused"] = time.monotonic() - f.t0
                os.kill(replica.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                # the replication link cut: what the master writes from now on never
                # reaches the replica (what was in the sockets' buffers still does)
                with redis.Redis(port=victim.port) as r:
                    r.client_kill_filter(_type="replica")
                time.sleep(PAUSE)
                victim.kill()
                os.kill(replica.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
                events["killed"] = time.monotonic() - f.t0
                cluster.wait_ok()
                events["ok"] = time.monotonic() - f.t0
                victim.restart()
                victim.wait_replica()
                events["rejoined"] = time.monotonic() - f.t0

            chaos = threading.Thread(target=fault)
            chaos.start()
            asyncio.run(write_for(server.rest_url, 1.0 + PAUSE + AFTER, clients, ids, f))
            chaos.join()
        # read back from the cluster as it is now, every node up again
        acked = f.acked_ids()
        stored: list[object] = []
        with FeatureStore.connect(cluster.url, sample.registry()) as store:
            for i in range(0, len(acked), 500):
                part = acked[i : i + 500]
                stored += [
                    r.values[0] for r in store.read(sample.ENTITY, part, features=["int_0"]).rows
                ]
    lost = [i for i, v in zip(acked, stored, strict=True) if v != value(i)]
    window = f.between(events["paused"], events["killed"])
    after_kill = [x for x in f.log if x[0] >= events["killed"] and x[2] == "200"]
    statuses: dict[str, int] = {}
    for x in f.log:
        statuses[x[2]] = statuses.get(x[2], 0) + 1
    return {
        "events_s": {k: round(v, 2) for k, v in events.items()},
        "writes": len(f.log),
        "statuses": statuses,
        "acked_while_replica_paused": sum(1 for x in window if x[2] == "200"),
        "refused_while_replica_paused": sum(1 for x in window if x[2] != "200"),
        "acked_entities": len(acked),
        "acked_entities_lost": len(lost),
        "acked_writes_lost": len({i // batch for i in lost}),
        "first_ack_after_kill_s": (
            round(min(x[1] for x in after_kill) - events["killed"], 2) if after_kill else None
        ),
    }


def markdown(
    steady: dict[str, dict[str, float]],
    faults: dict[str, dict[str, object]],
    clients: int,
    batch: int,
    rounds: int,
    seconds: float,
) -> list[str]:
    base = steady["asynchronous"]
    lines = [
        "## Steady writes (no fault)",
        "",
        f"{clients} clients, one write of {batch} entities at a time each; both deployments "
        f"on one cluster, {rounds} windows of {seconds:.0f} s each, alternated: the median "
        "of each figure.",
        "",
        "| write durability | writes/s | entities/s | vs asynchronous | p50 ms | p99 ms | max ms "
        "| failed | server µs/entity | Redis µs/entity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in steady.items():
        lines.append(
            f"| {name} | {s['writes_per_s']:.1f} | {s['entities_per_s']:,.0f} "
            f"| {s['entities_per_s'] / base['entities_per_s']:.2f}x "
            f"| {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {s['max_ms']:.1f} | {s['failed']:.0f} "
            f"| {s['server_us_per_entity']:.1f} | {s['redis_us_per_entity']:.1f} |"
        )
    lines += [
        "",
        f"## A master killed {PAUSE:.0f} s after its replica's link was cut",
        "",
        "| write durability | writes | acked while the link was cut | refused meanwhile "
        "| acked entities | **acked entities lost** | acked writes lost "
        "| first ack after the kill (s) | outcomes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, f in faults.items():
        outcomes = ", ".join(f"{k}: {n}" for k, n in sorted(f["statuses"].items()))
        lines.append(
            f"| {name} | {f['writes']} | {f['acked_while_replica_paused']} "
            f"| {f['refused_while_replica_paused']} | {f['acked_entities']:,} "
            f"| **{f['acked_entities_lost']:,}** | {f['acked_writes_lost']} "
            f"| {f['first_ack_after_kill_s']} | {outcomes} |"
        )
    lines += [
        "",
        "Times of the fault (s from the start of its writes): "
        + "; ".join(f"{name}: {f['events_s']}" for name, f in faults.items()),
        "",
        "A write refused (503 `not_durable`) was applied by its master but not confirmed by "
        "the replica: the client was told it may be lost, and sending it again is safe. "
        "With `replicas=1`, writes to the shard whose replica was cut off wait for WAIT's "
        "timeout (500 ms) and are refused; after the failover they are refused until the "
        "killed node is back as the new master's replica.",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady", type=float, default=8.0, help="seconds of steady writes")
    parser.add_argument("--rounds", type=int, default=3, help="steady windows per setting")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100, help="entities per write")
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("steady ...", flush=True)
        steady = run_steady(Path(tmp), args.rounds, args.steady, args.concurrency, args.batch)
        faults = {}
        for name, durability in SETTINGS.items():
            print(f"fault, {name} ...", flush=True)
            faults[name] = run_fault(name, durability, Path(tmp), args.concurrency, args.batch)
    lines = markdown(steady, faults, args.concurrency, args.batch, args.rounds, args.steady)
    head = header(
        "A Redis Cluster of 3 masters + 3 replicas on loopback (node timeout 2 s), fresh for "
        "each setting; one `serve` worker, L1 off, REST push writes of the standard shape."
    )
    save(
        args.out,
        "Write durability: acknowledged writes lost across a failover",
        [*head, "", *lines],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
