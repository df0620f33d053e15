"""The native data plane on Redis Cluster, next to one Redis node in the same run.

    python3 benchmarks/cluster_dataplane.py [--entities 20000] [--seconds 12] [--ttl 2]
                                            [--baseline REV] [--no-cells] [--no-tail]
                                            [--no-faults] [--no-nightly]
                                            [--nightly-entities 100000]
                                            [--out FILE]

A 3-master cluster (EmbeddedCluster, no replicas) and one node, each holding the same
``--entities`` entities of the standard shape. One `feature-store serve` worker per cell;
batches of 10 ids x all 50 features, 8 connections: wrk drives REST (1,000 zipfian
batches in turn), h2load drives gRPC (one batch). CPU per entity is read from
/proc/<pid>/stat of the worker and of every master over each window (the masters'
summed), and Redis's reads (HMGET + HGETALL calls) from the masters' own counts. With
the L1 on, its TTL is ``--ttl`` seconds, a fraction of each window (entries expire and
are refreshed inside it).

Paths, each on both stores: "native" (the fronts read on their own connections: one
round trip per master, all at once), "python-reads" (FEATURE_SERVING_NATIVE_READS=off:
every lookup without the L1 answered by its handler, whose reads go to the masters
grouped by slot from Python), "reference" (FEATURE_STORE_NATIVE=off: the pure-Python
path, redis-py's cluster pipeline on a cluster), and with --baseline an older revision
("before": redis-py's cluster pipeline behind the native fronts, as the issue measured).

The nightly job (--no-nightly: none): Spark local[2] writes --nightly-entities entities
into the one node and into the cluster, twice in turn (the second round is reported),
with the time and the Redis CPU (the masters' summed).

Then, on the cluster with the native path (--no-tail: none): REST at 1,000 connections
(wrk, timeout 1 s: its timeouts are the requests past 1 s), L1 off and on, with the
maximum and the count past 1 s. And (--no-faults: none), on a 3-master, 3-replica cluster
(cluster-node-timeout 1 s) under 4 closed-loop clients checking every value (L1 off): a
reshard of 2,000 slots and a master's failover (SIGKILL), with the errors' window and how
long until the fronts read on their own connections again (their `read_direct` count
rising, sampled every 0.1 s).

Targets (issue: the native data plane on Redis Cluster): with the L1 off on the cluster,
server CPU per entity at most 1.5x the masters' summed, REST and gRPC; with it on, at most
3 us per entity; through the reshard and the failover no wrong value, errors only inside
the failover window, and the fronts' path back within seconds.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import itertools
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis as redis_py

from feature_store import sample
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, bars, header, save, worktree
from cluster import Load
from cost import cpu_seconds, h2load, require_tools, wrk, wrk_script
from dataplane import batch_bodies, grpc_request
from rest_front import SLOW, run_wrk

TARGET_OFF_OVER_REDIS = 1.5
TARGET_ON_US = 3.0
BATCH = 10
CONNECTIONS = 8
TAIL_CONNECTIONS = 1000


@dataclass
class Cell(PerEntity):
    store: str  # "one" or "cluster"
    path: str
    api: str
    l1: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu: float
    redis_cpu: float
    redis_reads: int
    batch: int = BATCH
    cluster_calls: int = 0  # CLUSTER commands the masters ran in the window
    connections: int = 0  # connections the masters accepted in the window

    @property
    def ratio(self) -> float:
        return self.server_us / max(1e-9, self.redis_us)


@dataclass
class Store:
    """A store's URL and the Redis processes that serve it (one node, or the masters)."""

    name: str
    url: str
    nodes: list[EmbeddedRedis]

    def cpu(self) -> float:
        return sum(cpu_seconds(n.process.pid) for n in self.nodes if n.process is not None)

    def counts(self) -> tuple[int, int, int]:
        """HMGET + HGETALL calls, CLUSTER calls, connections accepted: the nodes' own counts."""
        reads = cluster = connections = 0
        for node in self.nodes:
            with redis_py.Redis(port=node.port or 0) as client:
                commands = client.info("commandstats")
                connections += int(client.info("stats")["total_connections_received"])
            for name, stat in commands.items():
                calls = int(stat.get("calls", 0))
                if name in ("cmdstat_hmget", "cmdstat_hgetall"):
                    reads += calls
                elif name.startswith("cmdstat_cluster"):
                    cluster += calls
        return reads, cluster, connections  # this call's own connections among them


def load_data(url: str, entities: int) -> None:
    with FeatureStore.connect(url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(entities))


def server_env(path: str) -> dict[str, str]:
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    if path != "before":
        env["FEATURE_STORE_NATIVE"] = "off" if path == "reference" else "on"
        env["FEATURE_SERVING_NATIVE_READS"] = "off" if path == "python-reads" else "on"
    return env


def run_cells(
    store: Store,
    path: str,
    api: str,
    l1: bool,
    args: argparse.Namespace,
    work: Path,
    tree: Path | None = None,
    batch: int = BATCH,
) -> Cell:
    server_args = ["--cache-ttl", f"{args.ttl:g}"] if l1 else ["--no-cache"]
    bodies = batch_bodies(args.entities, batch)
    with ServingProcess(
        store.url, args=server_args, env=server_env(path), grpc=api == "grpc", cwd=tree
    ) as server:
        assert server.process is not None

        def load(connections: int, window: float) -> tuple[int, float, float, int]:
            if api == "rest":
                return wrk(f"{server.rest_url}/v1/features/get", bodies, window, work, connections)
            return h2load(server.grpc_target, grpc_request(bodies[0]), window, work, connections)

        load(CONNECTIONS, 2.0)  # warm-up: connections, the slot map, the L1's first loads
        reads0, cluster0, connections0 = store.counts()
        s0, r0, t0 = cpu_seconds(server.process.pid), store.cpu(), time.monotonic()
        requests, p50, p99, errors = load(CONNECTIONS, args.seconds)
        elapsed = time.monotonic() - t0
        s1, r1 = cpu_seconds(server.process.pid), store.cpu()
        reads1, cluster1, connections1 = store.counts()
        cell = Cell(
            store.name,
            path,
            api,
            "on" if l1 else "off",
            requests,
            elapsed,
            p50,
            p99,
            errors,
            s1 - s0,
            r1 - r0,
            reads1 - reads0,
            batch,
            cluster1 - cluster0,
            connections1 - connections0 - len(store.nodes),  # less the second count's own
        )
    print(
        f"{store.name:7} {path:12} {api:4} L1 {cell.l1:3} b{batch:<3} {cell.rate:8,.0f} req/s  "
        f"p50 {p50:5.2f} ms  p99 {p99:6.2f} ms  server {cell.server_us:6.1f} us/entity  "
        f"Redis {cell.redis_us:5.1f}  errors {errors}",
        flush=True,
    )
    return cell


def tail(store: Store, l1: bool, args: argparse.Namespace, work: Path) -> dict[str, float]:
    server_args = ["--cache-ttl", f"{args.ttl:g}"] if l1 else ["--no-cache"]
    script = wrk_script(work / "tail.lua", batch_bodies(args.entities, BATCH))
    with ServingProcess(store.url, args=server_args, env=server_env("native"), grpc=False) as s:
        assert s.process is not None
        url = f"{s.rest_url}/v1/features/get"
        run_wrk(url, script, 2.0, CONNECTIONS)
        c0, t0 = cpu_seconds(s.process.pid), time.monotonic()
        got = run_wrk(url, script, args.seconds, TAIL_CONNECTIONS)
        got["seconds"] = time.monotonic() - t0
        got["server_us"] = (cpu_seconds(s.process.pid) - c0) / max(1, got["requests"] * BATCH) * 1e6
    print(
        f"tail    REST L1 {'on' if l1 else 'off'} c{TAIL_CONNECTIONS}: "
        f"{got['requests'] / got['seconds']:,.0f} req/s  p99 {got['p99']:.1f} ms  "
        f"max {got['max']:.1f} ms  past {SLOW:g} s {got['slow']:.0f}  errors {got['errors']:.0f}",
        flush=True,
    )
    return got


class Direct:
    """The worker's `read_direct` count (lookups the fronts read on their own connections),
    sampled every 0.1 s: when the fronts read again after a fault."""

    def __init__(self, url: str, t0: float) -> None:
        self.url, self.t0 = url, t0
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        pattern = re.compile(r'feature_serving_front_lookups_total\{[^}]*how="read_direct"\} (\S+)')
        with httpx.Client(timeout=2) as http:
            while not self.stop.wait(0.1):
                with contextlib.suppress(httpx.HTTPError):
                    text = http.get(f"{self.url}/metrics").text
                    count = sum(float(m) for m in pattern.findall(text))
                    self.samples.append((time.monotonic() - self.t0, count))

    def __enter__(self) -> Direct:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def back_after(self, since: float) -> float | None:
        """Seconds from ``since`` until the count rose and kept rising (5 samples)."""
        after = [(t, c) for t, c in self.samples if t >= since]
        for i in range(len(after) - 5):
            if all(after[j + 1][1] > after[j][1] for j in range(i, i + 5)):
                return after[i][0] - since
        return None

    def stalled(self, since: float) -> float:
        """Seconds after ``since`` during which the count did not rise."""
        after = [(t, c) for t, c in self.samples if t >= since]
        return sum(b[0] - a[0] for a, b in itertools.pairwise(after) if b[1] <= a[1])


def metric(url: str, name: str) -> float:
    """A counter of the worker's /metrics, summed over its labels."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def faults(work: Path, entities: int) -> list[str]:
    expected = {i: sample.features(i)["int_0"] for i in range(entities)}
    lines = []
    with EmbeddedCluster(work / "faults-reshard", replicas=1, node_timeout_ms=1000) as c:
        load_data(c.url, entities)
        masters = c.master_nodes()
        ids = []
        for node in masters[:2]:
            with redis_py.Redis(port=node.port or 0) as client:
                ids.append(client.execute_command("CLUSTER", "MYID").decode())
        with (
            ServingProcess(c.url, args=["--no-cache"], env=server_env("native"), grpc=False) as s,
            Load(s.rest_url, expected) as load,
            Direct(s.rest_url, load.t0) as direct,
        ):
            time.sleep(1.0)
            started = time.monotonic() - load.t0
            subprocess_reshard(masters[0].port or 0, ids)
            took = time.monotonic() - load.t0 - started
            time.sleep(2.0)
            redirects = metric(s.rest_url, "feature_serving_cluster_redirects_total")
        lines += [
            "### A reshard of 2,000 slots under load",
            "",
            f"- {took:.1f} s to move them; {load.summary()}",
            f"- the fronts met {redirects:.0f} redirects (MOVED, ASK: each lookup went to "
            "Python, which followed it); their own reads stopped for "
            f"{direct.stalled(started):.1f} s in all (0.1 s samples without a rise)",
            "",
        ]
    with EmbeddedCluster(work / "faults-failover", replicas=1, node_timeout_ms=1000) as c:
        load_data(c.url, entities)
        with (
            ServingProcess(c.url, args=["--no-cache"], env=server_env("native"), grpc=False) as s,
            Load(s.rest_url, expected) as load,
            Direct(s.rest_url, load.t0) as direct,
        ):
            time.sleep(2.0)
            killed = time.monotonic() - load.t0
            c.master_nodes()[0].kill()
            ok = c.wait_ok()
            time.sleep(5.0)
        back = direct.back_after(killed + ok)
        lines += [
            "### A master's failover under load (SIGKILL, cluster-node-timeout 1 s)",
            "",
            f"- killed at {killed:.2f} s; the cluster was ok {ok:.2f} s later",
            f"- {load.summary()}",
            "- the fronts read on their own connections again "
            + (f"{back:.2f} s after the cluster was ok" if back is not None else "NOT within 5 s"),
            "",
        ]
    print("\n".join(lines), flush=True)
    return lines


def subprocess_reshard(port: int, ids: list[str]) -> None:
    subprocess.run(
        [
            *("redis-cli", "--cluster", "reshard", f"127.0.0.1:{port}"),
            *("--cluster-from", ids[0], "--cluster-to", ids[1], "--cluster-slots", "2000"),
            *("--cluster-yes", "--cluster-pipeline", "100"),
        ],
        check=True,
        capture_output=True,
    )


def nightly(stores: list[Store], work: Path, entities: int) -> list[tuple[str, float, float]]:
    """The nightly job into each store, twice in turn (the first warms Spark and the
    Python workers up): (store, seconds, the store's Redis CPU seconds)."""
    from feature_store.ingest.generate import ID_COLUMN, write_sample
    from feature_store.ingest.job import IngestJob, run_ingest, spark_session

    registry = work / "features.yaml"
    registry.write_text(sample.registry_text())
    spark = spark_session("local[2]")
    parquet = str(work / "nightly.parquet")
    write_sample(spark, parquet, entities, partitions=4)
    runs = []
    try:
        for _ in range(2):
            for store in stores:
                job = IngestJob(
                    registry=registry,
                    group=sample.GROUP,
                    input=parquet,
                    id_column=ID_COLUMN,
                    redis_url=store.url,
                    progress_interval=0,
                )
                r0, t0 = store.cpu(), time.monotonic()
                report = run_ingest(spark, job)
                took, cpu = time.monotonic() - t0, store.cpu() - r0
                assert report.retries == 0
                print(
                    f"nightly {store.name:7} {took:5.1f} s  {entities / took:9,.0f} rows/s  "
                    f"Redis {cpu:.2f} s",
                    flush=True,
                )
                runs.append((store.name, took, cpu))
    finally:
        spark.stop()
    return runs


def find(cells: list[Cell], **want: object) -> Cell | None:
    want.setdefault("batch", BATCH)
    for c in cells:
        if all(getattr(c, k) == v for k, v in want.items()):
            return c
    return None


def verdicts(cells: list[Cell]) -> list[str]:
    lines = []
    for api in ("rest", "grpc"):
        off = find(cells, store="cluster", path="native", api=api, l1="off")
        one = find(cells, store="one", path="native", api=api, l1="off")
        on = find(cells, store="cluster", path="native", api=api, l1="on")
        if off is not None:
            ok = off.ratio <= TARGET_OFF_OVER_REDIS
            lines.append(
                f"- {api}, L1 off on the cluster: server {off.server_us:.1f} µs/entity against "
                f"the masters' {off.redis_us:.1f}: **{off.ratio:.2f}x** (target ≤ "
                f"{TARGET_OFF_OVER_REDIS}x) {'met' if ok else 'MISSED'}"
                + (
                    f"; one node in the same run: {one.server_us:.1f} against {one.redis_us:.1f} "
                    f"({one.ratio:.2f}x)"
                    if one is not None
                    else ""
                )
            )
        if on is not None:
            ok = on.server_us <= TARGET_ON_US
            lines.append(
                f"- {api}, L1 on on the cluster: **{on.server_us:.1f} µs/entity** (target ≤ "
                f"{TARGET_ON_US:g}) {'met' if ok else 'MISSED'}"
            )
        for other in ("python-reads", "reference", "before"):
            o = find(cells, store="cluster", path=other, api=api, l1="off")
            if o is not None and off is not None:
                lines.append(
                    f"  - {other} on the cluster, L1 off: {o.server_us:.1f} µs/entity, "
                    f"{o.server_us / off.server_us:.1f}x the native path's"
                )
    return lines


def why_redis_pays_more(cells: list[Cell]) -> list[str]:
    """Redis's CPU per entity on the cluster against one node's at a batch of 10 and at
    about a master's share of one (3), and what else the masters did in the windows."""
    lines = []
    for api in ("rest", "grpc"):
        cluster = find(cells, store="cluster", path="native", api=api, l1="off")
        one = find(cells, store="one", path="native", api=api, l1="off")
        share = find(cells, store="one", path="native", api=api, l1="off", batch=3)
        if cluster is None or one is None or share is None:
            continue
        lines.append(
            f"- {api}: the masters {cluster.redis_us:.1f} µs per entity (summed); one node "
            f"{one.redis_us:.1f} at batches of {BATCH}, {share.redis_us:.1f} at batches of "
            f"{share.batch}; in the cluster's window {cluster.cluster_calls} CLUSTER "
            f"commands and {cluster.connections} connections opened"
        )
    return lines


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [c for c in cells if c.l1 == "off" and c.batch == BATCH]
    labels = [f"{c.store}\n{c.path}\n{c.api}" for c in shown]
    fig, ax = plt.subplots(figsize=(max(7, len(shown) * 0.8), 4))
    bars(
        ax,
        labels,
        {"server": [c.server_us for c in shown], "Redis (summed)": [c.redis_us for c in shown]},
        title="L1 off, batch 10, 8 connections: one node and a 3-master cluster",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    parser.add_argument("--baseline", help="a git revision to measure in the same run")
    parser.add_argument("--no-cells", action="store_true", help="no steady-state cells")
    parser.add_argument("--no-tail", action="store_true")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--no-nightly", action="store_true", help="no nightly-job cells")
    parser.add_argument("--nightly-entities", type=int, default=100_000)
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    args = parser.parse_args()
    require_tools("wrk", "h2load", "redis-cli")
    cells: list[Cell] = []
    tails: dict[str, dict[str, float]] = {}
    fault_lines: list[str] = []
    nightly_runs: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        # no AOF on either: the cluster's nodes have none (EmbeddedCluster)
        one = stack.enter_context(EmbeddedRedis(work / "one", persistence=False))
        cluster = stack.enter_context(EmbeddedCluster(work / "cluster"))
        stores = [
            Store("one", one.url, [one]),
            Store("cluster", cluster.url, cluster.master_nodes()),
        ]
        for store in stores:
            load_data(store.url, args.entities)
        tree = None
        if args.baseline:
            tree = stack.enter_context(worktree(args.baseline, work / "before"))
        if not args.no_cells:
            # one node at about a master's share of a batch of 10: Redis's cost per entity
            # at the pipeline size each master sees on the cluster
            for api in ("rest", "grpc"):
                cells.append(run_cells(stores[0], "native", api, False, args, work, batch=3))
        for store in [] if args.no_cells else stores:
            for path in ("native", "python-reads", "reference", *(["before"] if tree else [])):
                for api in ("rest", "grpc"):
                    l1s = (False, True) if path == "native" else (False,)
                    for l1 in l1s:
                        cwd = tree if path == "before" else None
                        cells.append(run_cells(store, path, api, l1, args, work, cwd))
        if not args.no_tail:
            for l1 in (False, True):
                tails["on" if l1 else "off"] = tail(stores[1], l1, args, work)
        if not args.no_nightly:
            nightly_runs = nightly(stores, work, args.nightly_entities)
    if not args.no_faults:
        with tempfile.TemporaryDirectory() as tmp:
            fault_lines = faults(Path(tmp), args.entities)
    lines = header(
        f"One worker; a 3-master Redis Cluster (no replicas) and one Redis node, "
        f"{args.entities:,} entities of the standard shape each; batches of {BATCH} x all 50 "
        f"features at {CONNECTIONS} connections, wrk (REST) and h2load (gRPC); "
        f"{args.seconds:g} s per cell, L1 TTL {args.ttl:g} s"
        + (f"; before = {args.baseline}." if args.baseline else ".")
    )
    lines += ["", "## Targets", "", *verdicts(cells)]
    if why := why_redis_pays_more(cells):
        lines += [
            "",
            "## Why Redis pays more per entity on the cluster",
            "",
            "Each master gets about a third of a batch: the same commands in smaller "
            "pipelines. One node at batches of 3 shows what that costs Redis alone; the "
            "masters' CLUSTER commands and new connections in the window show what else "
            "there was.",
            "",
            *why,
        ]
    if tails:
        lines += [
            "",
            f"## REST at {TAIL_CONNECTIONS:,} connections on the cluster (native path)",
            "",
            "| L1 | req/s | p50 ms | p99 ms | max ms | past 1 s | errors | server µs/entity |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for l1, got in tails.items():
            lines.append(
                f"| {l1} | {got['requests'] / got['seconds']:,.0f} | {got['p50']:.1f} | "
                f"{got['p99']:.1f} | {got['max']:.1f} | {got['slow']:.0f} | {got['errors']:.0f} "
                f"| {got['server_us']:.1f} |"
            )
    if nightly_runs:
        lines += [
            "",
            f"## The nightly job (Spark local[2], {args.nightly_entities:,} entities, chunks "
            "of 500, each store written twice in turn; the second round counts)",
            "",
            "| store | seconds | rows/s | Redis CPU s (masters summed) |",
            "|---|---:|---:|---:|",
        ]
        last = {name: (secs, cpu) for name, secs, cpu in nightly_runs}  # the second round's
        for name, (secs, cpu) in last.items():
            lines.append(
                f"| {name} | {secs:.1f} | {args.nightly_entities / secs:,.0f} | {cpu:.2f} |"
            )
        if {"one", "cluster"} <= last.keys():
            lines.append("")
            lines.append(
                f"The cluster took **{last['cluster'][0] / last['one'][0]:.2f}x** the one "
                "node's time."
            )
    if fault_lines:
        lines += ["", "## Faults (3 masters + 3 replicas, L1 off, every value checked)", ""]
        lines += fault_lines
    lines += [
        "",
        "## Every cell",
        "",
        "| store | path | API | L1 | batch | req/s | p50 ms | p99 ms | errors | server µs/entity "
        "| Redis µs/entity | server/Redis | Redis reads per entity | CLUSTER calls "
        "| connections opened |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.store} | {c.path} | {c.api} | {c.l1} | {c.batch} | {c.rate:,.0f} | "
            f"{c.p50_ms:.2f} | {c.p99_ms:.2f} | {c.errors} | {c.server_us:.1f} | "
            f"{c.redis_us:.1f} | {f'{c.ratio:.2f}' if c.l1 == 'off' else '-'} | "
            f"{c.redis_reads / max(1, c.requests * c.batch):.2f} | {c.cluster_calls} | "
            f"{c.connections} |"
        )
    save(args.out, "The native data plane on Redis Cluster", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
