"""The L1 around restarts and nightly writes: warm start, and a batch write's switch-over.

    python3 benchmarks/coherence.py [--entities 100000] [--seconds 10] [--out FILE]

1. **Restart under load, with and without warm start.** One `feature-store serve` (one
   worker, L1 on) under a closed loop of 8 clients (batches of 10 zipfian ids, all 50
   features) for --seconds; then it is stopped (it saves its hot keys) and a new one started
   on the same Redis, with warm start on, or off (`WARM_START_KEYS=0`). Reported for the
   first --seconds of the new instance: Redis entity reads per second (INFO commandstats,
   sampled every second), p50/p99, errors, and how long the new instance took to be ready.
2. **The nightly Spark job while two instances serve.** Both instances cached under load;
   the Spark job (local[2]) rewrites every entity with new values and announces the
   group's generation at its end. Reported: seconds from the end of the job until each
   instance answers the new values for a probe of hot and cold ids, and the Redis read
   rate per second after the job, against the rate before it; per instance, its entries
   and those of them the native fronts hold alone (``front_entries``: no Python object)
   before the job and --seconds after it (its background sweep reads every cached entry
   again), and its worker's CPU and RSS over that window.

The load generator is Python: it measures the servers' behaviour, not their CPU cost
(benchmarks/serving.py does that). A PNG plot of the reads per second goes next to --out.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from _results import header, line_plot, save
from cost import cpu_seconds, rss

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.generate import ID_COLUMN, write_sample
from feature_store.ingest.job import IngestJob, run_ingest, spark_session
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

CLIENTS = 8
BATCH = 10
NIGHTLY_SEED = 99  # tonight's values differ from yesterday's (seed 0)
BASE_ENV = {"FEATURE_SERVING_CACHE_TTL": "600", "FEATURE_SERVING_SHADOW_FRACTION": "0"}


def entity_reads(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    reads_per_second: list[int] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


class Load:
    """A closed loop of CLIENTS threads against one server, bounded by ``stop()``."""

    def __init__(self, url: str, zipf: sample.Zipf, run: Run) -> None:
        self.url, self.zipf, self.run = url, zipf, run
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stopping.is_set():
                with self.lock:
                    ids = self.zipf.sample(BATCH)
                body = {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]}
                t0 = time.perf_counter()
                try:
                    ok = http.post("/v1/features/get", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with self.lock:
                    self.run.latencies.append(time.perf_counter() - t0)
                    self.run.errors += not ok

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join()


def sample_reads(client: redis.Redis, seconds: float, run: Run) -> None:
    before = entity_reads(client)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        now = entity_reads(client)
        run.reads_per_second.append(now - before)
        before = now


def restart(url: str, entities: int, seconds: float, warm: bool) -> tuple[Run, float]:
    env = {**BASE_ENV, "FEATURE_SERVING_WARM_START_KEYS": "50000" if warm else "0"}
    zipf = sample.Zipf(entities, seed=3)
    with ServingProcess(url, env=env, grpc=False) as first, Load(first.rest_url, zipf, Run()):
        time.sleep(seconds)
    t0 = time.monotonic()
    run = Run()
    with ServingProcess(url, env=env, grpc=False, ready_path="/readyz") as second:
        ready = time.monotonic() - t0
        with redis.Redis.from_url(url) as client, Load(second.rest_url, zipf, run):
            sample_reads(client, seconds, run)
    return run, ready


@dataclass
class Held:
    """What an instance's L1 held (``GET /v1/admin/cache``) and its worker's CPU and RSS."""

    entries: int
    front_entries: int
    generation_refreshes: int
    cpu: float  # seconds, since the worker started
    rss: int  # bytes

    @classmethod
    def of(cls, server: ServingProcess) -> Held:
        assert server.process is not None
        pid = server.process.pid
        doc = httpx.get(f"{server.rest_url}/v1/admin/cache", timeout=5).json()
        return cls(
            int(doc["entries"]),
            int(doc["front_entries"]),
            int(doc["counters"].get("generation_refreshes", 0)),
            cpu_seconds(pid),
            rss(pid),
        )


def nightly(
    url: str, entities: int, seconds: float, job: IngestJob
) -> tuple[list[float], Run, int, float, list[tuple[Held, Held]]]:
    """Seconds from the end of the Spark job until each instance answers its values;
    Redis reads/s before the job and after it; the job's own seconds; what each instance
    held before the job and ``seconds`` after it."""
    zipf = sample.Zipf(entities, seed=5)
    spark = spark_session("local[2]")  # started before the load, not timed
    run = Run()
    with (
        ServingProcess(url, env=BASE_ENV, grpc=False) as a,
        ServingProcess(url, env=BASE_ENV, grpc=False) as b,
        Load(a.rest_url, zipf, Run()),
        Load(b.rest_url, zipf, Run()),
        redis.Redis.from_url(url) as client,
    ):
        time.sleep(seconds)  # both caches warm
        sample_reads(client, 3, run)
        before = len(run.reads_per_second)
        held = [Held.of(server) for server in (a, b)]
        t0 = time.monotonic()
        report = run_ingest(spark, job)  # the nightly job; it announces its generation at its end
        done = time.monotonic()
        assert report.entities_written == entities, report.summary()
        sampler = threading.Thread(target=sample_reads, args=(client, seconds, run))
        sampler.start()
        probe = [zipf.order[0], zipf.order[entities // 2], zipf.order[-1]]
        want = [sample.features(i, NIGHTLY_SEED)["int_0"] for i in probe]
        switched = []
        for server in (a, b):
            with httpx.Client(base_url=server.rest_url, timeout=10) as http:
                while True:
                    body = {"entity_type": sample.ENTITY, "ids": probe, "features": ["int_0"]}
                    rows = http.post("/v1/features/get", json=body).json()["results"]
                    if [r["values"][0] for r in rows] == want or time.monotonic() - done > 60:
                        break
                    time.sleep(0.01)
            switched.append(time.monotonic() - done)
        sampler.join()
        after = [Held.of(server) for server in (a, b)]
    spark.stop()
    return switched, run, before, done - t0, list(zip(held, after, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, help="markdown results; PNG plots beside it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        with FeatureStore.connect(server.url, sample.registry(), notify=False) as store:
            store.write(sample.GROUP, sample.rows(args.entities))
        cold, cold_ready = restart(server.url, args.entities, args.seconds, warm=False)
        warm, warm_ready = restart(server.url, args.entities, args.seconds, warm=True)
        registry = Path(tmp) / "features.yaml"
        registry.write_text(sample.registry_text())
        parquet = str(Path(tmp) / "tonight.parquet")
        spark = spark_session("local[2]")
        write_sample(spark, parquet, args.entities, seed=NIGHTLY_SEED, partitions=4)
        spark.stop()
        job = IngestJob(
            registry=registry,
            group=sample.GROUP,
            input=parquet,
            id_column=ID_COLUMN,
            redis_url=server.url,
            progress_interval=0,
        )
        switched, around, before, job_seconds, held = nightly(
            server.url, args.entities, args.seconds, job
        )
    lines = [
        *header(
            f"{args.entities:,} entities of the standard shape; {CLIENTS} closed-loop "
            f"clients per instance, batches of {BATCH} zipfian ids x 50."
        ),
        "",
        f"## Restart under load: the first {args.seconds:g} s of the new instance",
        "",
        "| warm start | ready after | Redis reads, first second | reads/s, mean | p50 ms "
        "| p99 ms | errors | requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, run, ready in (("off", cold, cold_ready), ("on", warm, warm_ready)):
        series = run.reads_per_second
        lines.append(
            f"| {label} | {ready:.2f} s | {series[0]:,} | {sum(series) / len(series):,.0f} | "
            f"{run.quantile(0.5):.1f} | {run.quantile(0.99):.1f} | {run.errors} | "
            f"{len(run.latencies):,} |"
        )
    ratio = sum(cold.reads_per_second) / max(sum(warm.reads_per_second), 1)
    lines += [
        "",
        f"- Redis reads in those {args.seconds:g} s: {ratio:.1f}x fewer with warm start; "
        f"p99 {warm.quantile(0.99) / max(cold.quantile(0.99), 1e-9):.2f}x.",
        "",
        "## The nightly Spark job while two instances serve",
        "",
        f"- The job (local[2]) rewrote all {args.entities:,} entities in {job_seconds:.1f} s.",
        f"- Until each instance answered the new values: "
        f"{', '.join(f'{s:.2f} s' for s in switched)} after the job ended.",
        f"- Redis entity reads per second before the job: "
        f"{', '.join(str(r) for r in around.reads_per_second[:before])}; after it: "
        f"{', '.join(str(r) for r in around.reads_per_second[before:])}.",
        "",
        f"Each instance's L1 before the job and {args.seconds:g} s after its end (its sweep "
        "reads every cached entry again at `refresh_rate`), and its worker's CPU and RSS "
        "from before the job to then (the job's own seconds included):",
        "",
        "| instance | entries before | of them the fronts' own | entries after | of them the "
        "fronts' own | generation refreshes | worker CPU s | worker RSS MB, before / after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {h0.entries:,} | {h0.front_entries:,} | {h1.entries:,} | "
            f"{h1.front_entries:,} | {h1.generation_refreshes - h0.generation_refreshes:,} | "
            f"{h1.cpu - h0.cpu:.2f} | {h0.rss / 1e6:.0f} / {h1.rss / 1e6:.0f} |"
            for name, (h0, h1) in zip("AB", held, strict=True)
        ),
    ]
    save(args.out, "The L1 around restarts and nightly writes", lines)
    if args.out:
        reads = "Redis entity reads / s"
        line_plot(
            args.out.with_name(args.out.stem + "-restart.png"),
            {"warm start off": cold.reads_per_second, "warm start on": warm.reads_per_second},
            "Redis reads after a restart under load",
            "second",
            reads,
        )
        line_plot(
            args.out.with_name(args.out.stem + "-nightly.png"),
            {"two instances": around.reads_per_second},
            f"Redis reads before and after the nightly job (after it from second {before + 1})",
            "second",
            reads,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
