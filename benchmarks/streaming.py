"""Streaming benchmark: Kafka to servable, the stream's ceiling, and the guard's cost.

    python3 benchmarks/streaming.py

Everything runs on this machine, on loopback: an embedded Redis, an embedded Kafka broker
(KRaft), one serving worker with the L1 on (TTL 300 s: a value it shows sooner came from an
invalidation notice, not from an expiry), and ``feature-store stream`` on Spark local[2]
(micro-batches back to back). Events carry 5 int features of the standard shape's entities.

1. Event to servable, at 1,000 and 10,000 events/s (each for --seconds): a producer holds
   the rate while a prober, several times a second, sends one more event for an entity
   the serving cache holds and polls ``POST /v1/features/get`` until the new value shows;
   p50/p99/max of those delays, and the counts past 1 s and past 2 s (the target's bound).
2. The highest sustained rate: --backlog events produced at once (keyed by entity id, as
   production topics are), timed from the first produced to the last written (from the
   job's progress lines), three times: every event a distinct entity (each one a write:
   nothing to reduce), entities drawn uniformly from --entities (a backlog of 3x as many
   events repeats most), and from a zipfian draw (a = 1.2: hot entities repeat, as real
   activity does). Against
   two ceilings measured in the same run on the same rows: the guarded-write ceiling
   (their EVALSHAs of the ordering guard, pre-encoded, sent by one redis-py client in
   pipelines of 500) and the raw pipelined HSET ceiling (the same rows' HSETs).
3. The guard's cost on the nightly job: ``feature-store ingest`` of --ingest-entities x 50
   with the guard and with ``--no-ordering``, alternately, twice each; values/s.
4. Feast 0.67's push path, if Feast is installed: ``write_to_online_store`` of the same
   events into its Redis online store, in frames of 1,000; events/s.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import redis
from confluent_kafka import Producer

from feature_store import sample
from feature_store.batch import plan_write
from feature_store.embedded import EmbeddedRedis
from feature_store.kafka import EmbeddedKafka
from feature_store.layout import WRITE_SCRIPT, unguarded
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, header, save

FEATURES = sample.INTS  # 5 int features per event
PROBE_IDS = list(range(1_000_000, 1_000_200))  # entities the prober moves, cached first
BOUND_S = 2.0
BATCH_LINE = re.compile(r"stream: batch \d+: ([\d,]+) records")
DRAWS = ("distinct", "uniform", "zipfian")


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 2,
            "queue.buffering.max.messages": 2_000_000,
            "log_level": 2,  # critical only: no reconnect chatter when the broker stops
        }
    )


def draw(n: int, entities: int, kind: str) -> list[int]:
    """``n`` entity ids: each once (shuffled), uniform, or zipfian (rank 1 the hottest)
    folded into ``entities``."""
    import numpy as np

    rng = np.random.default_rng(7)
    if kind == "distinct":
        return [int(x) for x in rng.permutation(n)]
    if kind == "uniform":
        return [int(x) for x in rng.integers(0, entities, n)]
    return [int(x) % entities for x in rng.zipf(1.2, n)]


def event(entity_id: int, seq: int) -> bytes:
    values = {name: seq + i for i, name in enumerate(FEATURES)}
    return orjson.dumps({"consumer_id": entity_id, "event_time": time.time(), **values})


@dataclass
class LatencyCell:
    rate: int
    produced: int
    achieved: float  # events/s the producer held
    delays: list[float]

    def describe(self) -> str:
        return (
            f"p50 {self.pct(0.5):.3f} s, p99 {self.pct(0.99):.3f} s, "
            f"max {max(self.delays):.3f} s ({len(self.delays)} probes)"
        )

    def pct(self, q: float) -> float:
        ordered = sorted(self.delays)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_cell(
    bootstrap: str,
    topic: str,
    rest: str,
    rate: int,
    seconds: float,
    entities: int,
    seq0: int,
    give_up: float = 30.0,
) -> LatencyCell:
    """Hold ``rate`` events/s for ``seconds`` while probing event-to-servable delays."""
    stop = threading.Event()
    produced = [0]

    def load() -> None:
        p = producer(bootstrap)
        rng = random.Random(rate)
        start = time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - start) * rate) - produced[0]
            for _ in range(max(0, due)):
                p.produce(topic, event(rng.randrange(entities), seq0 + produced[0]))
                produced[0] += 1
            p.poll(0)
            time.sleep(0.002)
        p.flush(30)

    thread = threading.Thread(target=load)
    delays: list[float] = []
    probe = producer(bootstrap)
    t_end = time.monotonic() + seconds
    thread.start()
    with httpx.Client(base_url=rest, timeout=10) as client:
        seq = seq0 + 10**8
        while time.monotonic() < t_end:
            entity = random.choice(PROBE_IDS)
            seq += 1
            t0 = time.perf_counter()
            probe.produce(topic, event(entity, seq))
            probe.flush(10)
            body = {"entity_type": sample.ENTITY, "ids": [entity], "features": ["int_0"]}
            while True:
                values = client.post("/v1/features/get", json=body).json()["results"][0]["values"]
                if values[0] == seq:
                    delays.append(time.perf_counter() - t0)
                    break
                if time.perf_counter() - t0 > give_up:
                    raise SystemExit(f"event {seq} was not servable after {give_up:.0f} s")
                time.sleep(0.002)
            time.sleep(0.05)
    stop.set()
    thread.join()
    return LatencyCell(rate, produced[0], produced[0] / seconds, delays)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every process under it, from /proc: the
    stream's Python driver, Spark's JVM and its Python workers."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0.0))[1]
        todo += children.get(p, [])
    return total


def backlog_rate(
    bootstrap: str, topic: str, log: Path, ids: list[int], seq0: int, job_pid: int
) -> tuple[float, float]:
    """Events/s from the first produced to the last written, for ``ids``' events at once;
    and events per CPU second of the stream job's processes (records/s per core)."""
    n = len(ids)
    before = written_records(log)
    cpu0 = tree_cpu_seconds(job_pid)
    p = producer(bootstrap)
    t0 = time.perf_counter()
    for i, entity_id in enumerate(ids):
        p.produce(topic, event(entity_id, seq0 + i), key=str(entity_id).encode())
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)
    deadline = time.monotonic() + 600
    while written_records(log) - before < n:
        if time.monotonic() > deadline:
            raise SystemExit("the stream did not write the backlog in 10 minutes")
        time.sleep(0.05)
    rate = n / (time.perf_counter() - t0)
    return rate, n / max(1e-9, tree_cpu_seconds(job_pid) - cpu0)


def written_records(log: Path) -> int:
    return sum(int(m.group(1).replace(",", "")) for m in BATCH_LINE.finditer(log.read_text()))


def ceiling(url: str, ids: list[int], guarded: bool) -> float:
    """The same events as guarded writes (EVALSHA) or HSETs, encoded outside the clock,
    in pipelines of 500 from one client."""
    group = sample.registry().group(sample.GROUP)
    now = time.time()
    rows = [
        (entity_id, {name: i + k for k, name in enumerate(FEATURES)}, now + i * 1e-6)
        for i, entity_id in enumerate(ids)
    ]
    n = len(rows)
    client = redis.Redis.from_url(url)
    client.script_load(WRITE_SCRIPT)
    elapsed = 0.0
    for start in range(0, n, 500):
        plan = plan_write(group, rows[start : start + 500])
        if guarded:
            commands = list(plan.commands)
        else:
            commands = [h for c in plan.commands for h in unguarded(c) if h[0] == "HSET"]
        t0 = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        pipe.execute()
        elapsed += time.perf_counter() - t0
    client.close()
    return n / elapsed


def ingest_rates(work: Path, entities: int) -> dict[str, list[float]]:
    cli = [sys.executable, "-m", "feature_store.cli"]
    data = work / "ingest.parquet"
    registry = work / "features.yaml"
    subprocess.run(
        [*cli, "generate", "--output", str(data), "--entities", str(entities),
         "--registry-out", str(registry), "--master", "local[2]"],
        check=True, capture_output=True,
    )  # fmt: skip
    rates: dict[str, list[float]] = {"guarded": [], "--no-ordering": []}
    for mode in ["guarded", "--no-ordering"] * 2:
        with EmbeddedRedis(work / f"ingest-redis-{time.monotonic_ns()}", persistence=False) as r:
            report = work / "report.json"
            extra = [] if mode == "guarded" else ["--no-ordering"]
            subprocess.run(
                [*cli, "ingest", "--registry", str(registry), "--group", sample.GROUP,
                 "--input", str(data), "--id-column", "consumer_id", "--redis-url", r.url,
                 "--master", "local[2]", "--report", str(report), "--progress-interval", "0",
                 *extra],
                check=True, capture_output=True,
            )  # fmt: skip
            rates[mode].append(json.loads(report.read_text())["values_per_second"])
        print(f"  ingest {mode}: {rates[mode][-1]:,.0f} values/s", flush=True)
    return rates


def feast_push_rate(work: Path, n: int, entities: int) -> float | None:
    try:
        import feast
        import pandas as pd
    except ImportError:
        return None
    with EmbeddedRedis(work / "feast-redis", persistence=False) as r:
        address = r.url.split("//")[1].split("/")[0]
        repo = sample.feast_repo(
            work / "feast_repo", f'  type: redis\n  connection_string: "{address}"'
        )
        feast_bin = str(Path(sys.executable).parent / "feast")
        subprocess.run([feast_bin, "apply"], cwd=repo, check=True, capture_output=True)
        store = feast.FeatureStore(repo_path=str(repo))
        # its push path takes whole rows only (every feature of the view): the sample's
        names = sample.FLOATS + sample.INTS + sample.INT_LISTS + sample.EMBEDDINGS
        rows = list(sample.rows(1000))
        frames = []
        for start in range(0, n, 1000):
            frames.append(
                pd.DataFrame(
                    {
                        "consumer_id": [i + start % entities for i, _ in rows],
                        **{f: [v[f] for _, v in rows] for f in names},
                        "event_timestamp": [pd.Timestamp.now(tz="UTC")] * len(rows),
                    }
                )
            )
        t0 = time.perf_counter()
        for frame in frames:
            store.write_to_online_store(sample.GROUP, frame)
        return n / (time.perf_counter() - t0)


def plot(path: Path, cells: list[LatencyCell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for cell in cells:
        ordered = sorted(cell.delays)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))],
                label=f"{cell.rate:,} events/s")  # fmt: skip
    ax.axvline(BOUND_S, color="grey", linestyle=":", label="2 s")
    ax.set_xlabel("event produced to servable through REST, L1 on (s)")
    ax.set_ylabel("fraction of probes")
    ax.set_title("feature-store stream: event to servable")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="per latency cell (30)")
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--ingest-entities", type=int, default=200_000)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results"
    with tempfile.TemporaryDirectory(prefix="fs-streaming-") as tmp:
        work = Path(tmp)
        registry = work / "features.yaml"
        registry.write_text(sample.registry_text())
        with (
            EmbeddedRedis(work / "redis", persistence=False) as r,
            EmbeddedKafka(work / "kafka") as kafka,
            ServingProcess(
                r.url, registry=registry, grpc=False,
                env={"FEATURE_SERVING_CACHE_TTL": "300", "FEATURE_SERVING_SHADOW_FRACTION": "0"},
            ) as server,
        ):  # fmt: skip
            log = work / "stream.log"
            with log.open("w") as out:
                job = subprocess.Popen(
                    [sys.executable, "-m", "feature_store.cli", "stream",
                     "--registry", str(registry), "--group", sample.GROUP, "--topic", "events",
                     "--bootstrap-servers", kafka.bootstrap,
                     "--checkpoint", str(work / "checkpoint"), "--redis-url", r.url,
                     "--master", "local[2]", "--trigger-seconds", "0",
                     "--conf", "spark.ui.enabled=false", "--progress-interval", "5"],
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            try:
                with httpx.Client(base_url=server.rest_url, timeout=10) as client:
                    body = {"entity_type": sample.ENTITY, "ids": PROBE_IDS, "features": ["int_0"]}
                    client.post("/v1/features/get", json=body).raise_for_status()  # cached
                print("warming up the stream (its Spark session starts) ...", flush=True)
                latency_cell(kafka.bootstrap, "events", server.rest_url, 100, 20, 1000, 0, 300)
                cells = []
                for i, rate in enumerate((1_000, 10_000)):
                    cell = latency_cell(
                        kafka.bootstrap, "events", server.rest_url, rate, args.seconds,
                        args.entities, (i + 1) * 10**7,
                    )  # fmt: skip
                    cells.append(cell)
                    print(f"  {rate:,}/s: {cell.describe()}", flush=True)
                sustained: dict[str, float] = {}
                per_core: dict[str, float] = {}
                for k, kind in enumerate(DRAWS):
                    ids = draw(args.backlog, args.entities, kind)
                    sustained[kind], per_core[kind] = backlog_rate(
                        kafka.bootstrap, "events", log, ids, (k + 5) * 10**7, job.pid
                    )
                    print(
                        f"  sustained, {kind}: {sustained[kind]:,.0f} events/s, "
                        f"{per_core[kind]:,.0f} per CPU second of the job",
                        flush=True,
                    )
            finally:
                job.terminate()
                job.wait(timeout=60)
            ceilings: dict[tuple[str, bool], float] = {}
            for kind in DRAWS:
                ids = draw(args.backlog, args.entities, kind)
                for guarded in (True, False):
                    ceilings[kind, guarded] = ceiling(r.url, ids, guarded)
                    name = "guarded" if guarded else "HSET"
                    print(f"  {name} ceiling, {kind}: {ceilings[kind, guarded]:,.0f}/s", flush=True)
            repeats = {
                kind: 1 - len(set(draw(args.backlog, args.entities, kind))) / args.backlog
                for kind in DRAWS
            }
        rates = ingest_rates(work, args.ingest_entities)
        feast_rate = feast_push_rate(work, min(args.backlog, 50_000), args.entities)
    guarded = statistics.median(rates["guarded"])
    plain = statistics.median(rates["--no-ordering"])
    lines = header(
        f"One serving worker (L1 TTL 300 s), `feature-store stream` on Spark local[2] "
        f"(micro-batches back to back), embedded Redis and Kafka 4.1 (KRaft) on loopback; "
        f"events of 5 int features over {args.entities:,} entities, {args.seconds:.0f} s per "
        f"latency cell."
    )
    lines += [
        "",
        "## Event to servable (produced to Kafka -> read back through REST, L1 on)",
        "",
        "| rate held | probes | p50 s | p99 s | max s | past 1 s | past 2 s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        past = sum(d > BOUND_S for d in c.delays)
        past_1s = sum(d > 1.0 for d in c.delays)
        lines.append(
            f"| {c.achieved:,.0f}/s | {len(c.delays)} | {c.pct(0.5):.3f} | {c.pct(0.99):.3f} "
            f"| {max(c.delays):.3f} | {past_1s} | {past} |"
        )
    lines += [
        "",
        f"## Throughput: a backlog of {args.backlog:,} events keyed by entity (first produced "
        "to last written)",
        "",
        "| draw of entities | repeats | `feature-store stream` events/s | events per CPU "
        "second of the job | guarded-write ceiling (EVALSHA) | stream / guarded | HSET "
        "ceiling | stream / HSET |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in DRAWS:
        rate, guarded_c, hset_c = sustained[kind], ceilings[kind, True], ceilings[kind, False]
        lines.append(
            f"| {kind} over {args.backlog if kind == 'distinct' else args.entities:,} "
            f"| {repeats[kind]:.0%} | {rate:,.0f} "
            f"| {per_core[kind]:,.0f} | {guarded_c:,.0f} | {rate / guarded_c:.2f}x "
            f"| {hset_c:,.0f} | {rate / hset_c:.2f}x |"
        )
    lines += [
        "",
        "Events per CPU second: the stream job's processes (its Python driver, Spark's JVM, "
        "its Python workers) from /proc over the backlog, i.e. records/s per core of the "
        "job alone (Redis, Kafka and the producer share the machine's other cycles).",
        "",
        "Repeats: the share of events whose entity came earlier in the backlog. The ceilings "
        "write every event; the stream writes the newest event of each entity per "
        "micro-batch and counts the rest as superseded.",
    ]
    if feast_rate is not None:
        uniform_c = ceilings["distinct", False]
        lines += [
            "",
            f"Feast 0.67 `write_to_online_store` into its Redis, frames of 1,000 (all 50 "
            f"features per row: its push path takes no partial rows): {feast_rate:,.0f} "
            f"events/s, {feast_rate / uniform_c:.2f}x the distinct entities' HSET ceiling.",
        ]
    lines += [
        "",
        f"## The ordering guard on the nightly job ({args.ingest_entities:,} entities x 50, "
        "Spark local[2], alternate runs)",
        "",
        "| mode | values/s (runs) | median |",
        "|---|---|---:|",
        f"| guarded (default) | {', '.join(f'{v:,.0f}' for v in rates['guarded'])} "
        f"| {guarded:,.0f} |",
        f"| `--no-ordering` | {', '.join(f'{v:,.0f}' for v in rates['--no-ordering'])} "
        f"| {plain:,.0f} |",
        "",
        f"Guarded / unguarded: {guarded / plain:.2f}x.",
        "",
        "![event to servable](streaming.png)",
    ]
    if not args.no_save:
        plot(results / "streaming.png", cells)
    save(None if args.no_save else results / "streaming.md", "Streaming", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
