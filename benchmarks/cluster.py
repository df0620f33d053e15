"""Redis Cluster in its real forms, measured: a master's failover and a reshard under load,
and the nightly job through a failover.

    python3 benchmarks/cluster.py [--out FILE]

A 3-master, 3-replica cluster on loopback (cluster-node-timeout 1 s), 20,000 entities of
the standard shape:

1. **Serving through a failover**: one `feature-store serve` (L1 off: every lookup reaches
   Redis, the worst case) under 4 closed-loop clients; a master is SIGKILLed after 2 s.
   Reported: how long until the cluster was ok, the window of non-200 answers, their
   count and kind, max latency, wrong values (each answer is checked).
2. **Serving through a reshard**: `redis-cli --cluster reshard` moves 2,000 slots between
   two masters under the same load. Reported: its duration, failed requests, max latency.
3. **The nightly job through a failover**: the Spark job (local[2]) writes the 20,000
   entities twice, once undisturbed and once with a master SIGKILLed when 3,000 keys are
   in; the stall is the difference. Every value is read back after each run.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import random
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import redis
from _results import header, save

from feature_store import sample
from feature_store.embedded import EmbeddedCluster
from feature_store.ingest.generate import ID_COLUMN, write_sample
from feature_store.ingest.job import IngestJob, run_ingest, spark_session
from feature_store.ingest.spec import RetrySpec
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

N = 20_000
SEED = 3


class Load:
    def __init__(self, url: str, expected: dict[int, object]) -> None:
        self.url, self.expected = url, expected
        self.t0 = time.monotonic()
        self.rows: list[tuple[float, int, float]] = []
        self.errors: Counter[str] = Counter()
        self.wrong = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(4)]

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stop.is_set() and time.monotonic() - self.t0 < 120:
                ids = rng.sample(range(N), 10)
                body = {"entity_type": sample.ENTITY, "ids": ids, "features": ["int_0"]}
                start = time.monotonic()
                r = http.post("/v1/features/get", json=body)
                with self.lock:
                    self.rows.append((start - self.t0, r.status_code, time.monotonic() - start))
                    if r.status_code == 200:
                        got = [row["values"][0] for row in r.json()["results"]]
                        self.wrong += got != [self.expected[i] for i in ids]
                    else:
                        self.errors[r.json()["error"]["code"]] += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def summary(self) -> str:
        bad = [t for t, status, _ in self.rows if status != 200]
        window = f"{min(bad):.2f}-{max(bad):.2f} s" if bad else "none"
        return (
            f"{len(self.rows):,} requests; {len(bad)} not 200 "
            f"({', '.join(f'{n} x {c}' for c, n in self.errors.items()) or '-'}) in {window}; "
            f"max latency {max(r[2] for r in self.rows) * 1000:.0f} ms; wrong values {self.wrong}"
        )


def serving_failover(cluster: EmbeddedCluster, expected: dict[int, object]) -> list[str]:
    with (
        ServingProcess(cluster.url, args=["--no-cache"], grpc=False) as server,
        Load(server.rest_url, expected) as load,
    ):
        time.sleep(2.0)
        killed = time.monotonic() - load.t0
        cluster.master_nodes()[0].kill()
        ok = cluster.wait_ok()
        time.sleep(4.0)
    return [
        f"- master SIGKILLed at {killed:.2f} s; the cluster was ok {ok:.2f} s later",
        f"- {load.summary()}",
    ]


def serving_reshard(cluster: EmbeddedCluster, expected: dict[int, object]) -> list[str]:
    masters = cluster.master_nodes()
    ids = []
    for node in masters[:2]:
        with redis.Redis(port=node.port or 0) as c:
            ids.append(c.execute_command("CLUSTER", "MYID").decode())
    with (
        ServingProcess(cluster.url, args=["--no-cache"], grpc=False) as server,
        Load(server.rest_url, expected) as load,
    ):
        time.sleep(1.0)
        t0 = time.monotonic()
        subprocess.run(
            [
                *("redis-cli", "--cluster", "reshard", f"127.0.0.1:{masters[0].port}"),
                *("--cluster-from", ids[0], "--cluster-to", ids[1], "--cluster-slots", "2000"),
                *("--cluster-yes", "--cluster-pipeline", "100"),
            ],
            check=True,
            capture_output=True,
        )
        took = time.monotonic() - t0
        time.sleep(1.0)
    return [f"- 2,000 slots moved in {took:.1f} s under load", f"- {load.summary()}"]


def ingest(tmp: Path, parquet: str, registry: Path, kill: bool) -> tuple[float, int, bool]:
    with EmbeddedCluster(tmp, replicas=1, node_timeout_ms=1000) as cluster:
        if kill:
            victim = cluster.master_nodes()[0]

            def chaos() -> None:
                client = redis.Redis(port=victim.port or 0)
                while client.dbsize() < 1000:  # a third of 3,000 on this master
                    time.sleep(0.005)
                victim.kill()

            threading.Thread(target=chaos, daemon=True).start()
        spark = spark_session("local[2]")
        job = IngestJob(
            registry=registry,
            group=sample.GROUP,
            input=parquet,
            id_column=ID_COLUMN,
            redis_url=cluster.url,
            chunk_size=50,
            retry=RetrySpec(retries=8, base_delay=0.2, max_delay=2.0),
            progress_interval=0,
        )
        t0 = time.monotonic()
        report = run_ingest(spark, job)
        elapsed = time.monotonic() - t0
        live = f"{cluster.master_nodes()[0].url}?cluster=true"
        with FeatureStore.connect(live, sample.registry()) as store:
            rows = store.read(sample.ENTITY, list(range(N)), features=["int_0"]).rows
        complete = all(r.values[0] == sample.features(r.entity_id, SEED)["int_0"] for r in rows)
    return elapsed, report.retries, complete


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    args = parser.parse_args()
    expected = {i: sample.features(i, SEED)["int_0"] for i in range(N)}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (title, measure) in enumerate(
            (
                ("Serving through a master failover", serving_failover),
                ("Serving through a reshard", serving_reshard),
            )
        ):
            with EmbeddedCluster(Path(tmp) / f"serving{i}", replicas=1, node_timeout_ms=1000) as c:
                with FeatureStore.connect(c.url, sample.registry()) as store:
                    store.write(sample.GROUP, sample.rows(N, seed=SEED))
                lines += [f"## {title}", "", *measure(c, expected), ""]
                print("\n".join(lines[-4:]), flush=True)
        registry = Path(tmp) / "features.yaml"
        registry.write_text(sample.registry_text())
        parquet = str(Path(tmp) / "input.parquet")
        spark = spark_session("local[2]")
        write_sample(spark, parquet, N, seed=SEED, partitions=4)
        clean = ingest(Path(tmp) / "clean", parquet, registry, kill=False)
        failed = ingest(Path(tmp) / "failover", parquet, registry, kill=True)
        spark.stop()
    lines += [
        "## The nightly job through a master failover (Spark local[2])",
        "",
        f"- undisturbed: {clean[0]:.1f} s, {clean[1]} chunk retries, every value read back: "
        f"{clean[2]}",
        f"- a master SIGKILLed mid-job: {failed[0]:.1f} s, {failed[1]} chunk retries, every "
        f"value read back: {failed[2]}",
        f"- the failover stalled the job by {failed[0] - clean[0]:.1f} s",
    ]
    head = header(
        f"3 masters + 3 replicas on loopback, cluster-node-timeout 1 s, {N:,} entities of "
        "the standard shape."
    )
    save(args.out, "Redis Cluster: failover and resharding", [*head, "", *lines])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
