"""Window aggregations: what they cost Redis's memory and the server's CPU, how fast the
stream computes them, and how soon an event is servable.

    python3 benchmarks/aggregations.py [--entities 100000] [--seconds 8] [--rate 10000]
        [--backlog 200000] [--out benchmarks/results/aggregations.md]

Everything runs on this machine, on loopback: an embedded Redis, an embedded Kafka broker
(KRaft), `feature-store serve` and `feature-store stream` (Spark local[2]). The group is
docs/aggregations.md's example: count and sum over 1 h, mean, max and min over 1 d, the last
5 stores over 7 d, in tiles of 1 min, lateness 10 min.

1. **Redis bytes per entity** at steady state (tiles older than every window pruned): for
   entities of 2, 10 and 50 events a day over 8 days, MEMORY USAGE of 1,000 keys each,
   against the same six answers stored as a plain group.
2. **Server CPU per entity looked up** (/proc/<pid>/stat over each window, next to Redis's
   own): batches of 10 of --entities, the six aggregated features against a plain group of
   six features holding the same answers, REST (wrk) and gRPC (h2load), the L1 off and on
   (TTL 2 s: several TTLs in each --seconds window; an aggregated entry also ends at its
   next tile boundary).
3. **Events/s from a backlog**: --backlog events (keyed by entity, uniform over
   --entities) drained by the aggregated group's stream, and by a plain group's stream of
   the same records (the newest record per entity written), on one topic: records over the
   sum of the micro-batches' own seconds (the Spark session's start left out).
4. **Event to servable** at --rate events/s over --entities for --seconds x 6: while a
   producer holds the rate, a prober sends one more event for an entity it watches and
   polls `POST /v1/features/get` (L1 on, TTL 300 s: a count it sees sooner came through
   the stream's invalidation notice) until `orders_1h` counts it; p50/p99/max and the
   count past 2 s (the target's bound), and a PNG of the delays over time.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import math
import random
import re
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
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.records import EntityEvents
from feature_store.ingest.spec import RetrySpec
from feature_store.ingest.windows import write_events
from feature_store.ingest.writer import ChunkWriter
from feature_store.kafka import EmbeddedKafka
from feature_store.layout import entity_key
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.registry import FeatureGroup, load_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore
from feature_store.windows import Event, Layout, answer, apply, decode_state

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import header, save
from cost import cpu_seconds, h2load, require_tools, wrk

REGISTRY = sample.activity_registry_text(
    extra_entities="  shopper: {prefix: s, id_type: int, ttl: 30d, join_key: shopper_id}\n",
    extra_groups="""\
  shopper_plain:
    entity: shopper
    features:
      orders: int
      spend: double
      basket_mean: double
      max_spend: double
      min_spend: double
      last_stores: int_list
""",
)
# the same records into a plain group: the newest order per consumer
PLAIN_STREAM = """\
entities:
  consumer: {prefix: o, id_type: int, ttl: 30d, join_key: consumer_id}
feature_groups:
  consumer_orders:
    entity: consumer
    features: {order_total: double, basket_size: int, store_id: int}
"""
AGG, PLAIN = sample.ACTIVITY_GROUP, "shopper_plain"
PROFILES = (2, 10, 50)  # events a day
BOUND_S = 2.0
PROBES = list(range(10_000_000, 10_000_200))
BATCH = re.compile(r"stream: batch \d+: ([\d,]+) records.*; ([\d.]+) s$", re.MULTILINE)


def history(rng: random.Random, per_day: float, now: float) -> list[Event]:
    """An entity's orders over 8 days at ``per_day`` a day, in time order."""
    n = max(1, int(rng.expovariate(1 / (per_day * 8))))
    times = sorted(now - rng.uniform(0, 8 * 86400) for _ in range(n))
    return [
        Event(
            math.floor(t * 1000),
            {
                "order_total": round(rng.uniform(5, 120), 2),
                "basket_size": float(rng.randint(1, 12)),
                "store_id": rng.randint(1, 5000),
            },
        )
        for t in times
    ]


def fill(
    url: str, group: FeatureGroup, ids: range, per_day: float, seed: int
) -> dict[int, list[object]]:
    """Write ``ids``' histories as the backfill writes them; each one's answers now."""
    rng = random.Random(seed)
    now = time.time()
    layout = Layout.of(group)
    writer = ChunkWriter(
        RedisTarget.parse(url), ttl_seconds=30 * 86400, chunk_size=500, retry=RetrySpec()
    )
    answers: dict[int, list[object]] = {}
    try:
        for start in range(ids.start, ids.stop, 5000):
            chunk: EntityEvents = {}
            for i in range(start, min(start + 5000, ids.stop)):
                events = history(rng, per_day, now)
                chunk[entity_key("c", group.entity.id_type, i)] = list(enumerate(events))
                state = decode_state(None, layout)
                apply(state, layout, events)
                answers[i] = answer(state, layout, now).values
            write_events(writer, group, chunk, replace=True)
    finally:
        writer.close()
    return answers


def memory(url: str, prefix: str, ids: range) -> float:
    client = redis.Redis.from_url(url)
    try:
        sizes = [client.memory_usage(f"{prefix}:{i}", samples=0) or 0 for i in ids]
    finally:
        client.close()
    return sum(sizes) / len(sizes)


@dataclass
class CostCell:
    api: str
    l1: str
    group: str
    requests: int
    seconds: float
    p99_ms: float
    errors: int
    server_cpu: float
    redis_cpu: float

    @property
    def server_us(self) -> float:
        return self.server_cpu / max(1, self.requests * 10) * 1e6

    @property
    def redis_us(self) -> float:
        return self.redis_cpu / max(1, self.requests * 10) * 1e6


def cost_cell(
    r: EmbeddedRedis,
    registry: Path,
    api: str,
    l1: bool,
    group: str,
    entities: int,
    seconds: float,
    work: Path,
) -> CostCell:
    entity = "consumer" if group == AGG else "shopper"
    rng = random.Random(1)
    batches = [[rng.randrange(entities) for _ in range(10)] for _ in range(1000)]
    bodies = [
        orjson.dumps({"entity_type": entity, "ids": ids, "groups": [group]}) for ids in batches
    ]
    args = ["--cache-ttl", "2"] if l1 else ["--no-cache"]
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    assert r.process is not None
    with ServingProcess(r.url, registry=registry, args=args, env=env, grpc=api == "grpc") as server:
        assert server.process is not None

        def load(window: float) -> tuple[int, float, int]:
            if api == "rest":
                n, _, p99, bad = wrk(f"{server.rest_url}/v1/features/get", bodies, window, work)
            else:
                request = pb.GetFeaturesRequest(
                    entity_type=entity, int_ids=batches[0], groups=[group]
                )
                n, _, p99, bad = h2load(
                    server.grpc_target, request.SerializeToString(), window, work
                )
            return n, p99, bad

        load(2.0)  # teach the fronts, fill the L1
        s0, r0, t0 = cpu_seconds(server.process.pid), cpu_seconds(r.process.pid), time.monotonic()
        requests, p99, errors = load(seconds)
        elapsed = time.monotonic() - t0
        s1, r1 = cpu_seconds(server.process.pid), cpu_seconds(r.process.pid)
    return CostCell(
        api, "on" if l1 else "off", group, requests, elapsed, p99, errors, s1 - s0, r1 - r0
    )


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 2,
            "queue.buffering.max.messages": 2_000_000,
            "log_level": 2,
        }
    )


def order(entity: int, rng: random.Random, at: float | None = None) -> bytes:
    return orjson.dumps(
        {
            "consumer_id": entity,
            "event_time": time.time() if at is None else at,
            "order_total": round(rng.uniform(5, 120), 2),
            "basket_size": rng.randint(1, 12),
            "store_id": rng.randint(1, 5000),
        }
    )


def stream(
    registry: Path,
    group: str,
    topic: str,
    bootstrap: str,
    url: str,
    work: Path,
    name: str,
    *extra: str,
) -> subprocess.Popen[bytes]:
    log = (work / f"{name}.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "feature_store.cli", "stream",
         "--registry", str(registry), "--group", group, "--topic", topic,
         "--bootstrap-servers", bootstrap, "--checkpoint", str(work / f"{name}-checkpoint"),
         "--redis-url", url, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--quarantine", str(work / f"{name}-quarantine"), "--progress-interval", "5", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def backlog(
    registry: Path, group: str, bootstrap: str, url: str, work: Path, name: str
) -> tuple[int, float]:
    job = stream(registry, group, "backlog", bootstrap, url, work, name, "--available-now")
    if job.wait(timeout=1800) != 0:
        raise SystemExit((work / f"{name}.log").read_text()[-3000:])
    text = (work / f"{name}.log").read_text()
    batches = [(int(n.replace(",", "")), float(s)) for n, s in BATCH.findall(text)]
    return sum(n for n, _ in batches), sum(s for _, s in batches)


@dataclass
class Probe:
    at: float  # seconds since the load started
    delay: float


def latency(
    bootstrap: str, rest: str, rate: int, seconds: float, entities: int
) -> tuple[list[Probe], float]:
    """Hold ``rate`` orders/s while probing: each probe's delay from its event's time to
    ``orders_1h`` counting it through serving."""
    stop = threading.Event()
    produced = [0]

    def load() -> None:
        p, rng = producer(bootstrap), random.Random(rate)
        start = time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - start) * rate) - produced[0]
            for _ in range(max(0, due)):
                entity = rng.randrange(entities)
                p.produce("orders", order(entity, rng), key=str(entity).encode())
                produced[0] += 1
            p.poll(0)
            time.sleep(0.002)
        p.flush(30)

    probes: list[Probe] = []
    probe, rng = producer(bootstrap), random.Random(7)
    thread = threading.Thread(target=load, daemon=True)
    t_start = time.monotonic()
    thread.start()
    with contextlib.ExitStack() as stack, httpx.Client(base_url=rest, timeout=10) as client:
        stack.callback(stop.set)  # the load stops with the probes, also when they fail
        while time.monotonic() - t_start < seconds:
            entity = rng.choice(PROBES)
            body = {"entity_type": "consumer", "ids": [entity], "features": ["orders_1h"]}

            def count(body: dict[str, object] = body) -> int:
                got = client.post("/v1/features/get", json=body).json()["results"][0]["values"][0]
                return int(got or 0)

            before = count()  # what its window holds now (no other event comes for it)
            at, t0 = time.monotonic() - t_start, time.time()
            probe.produce("orders", order(entity, rng, t0), key=str(entity).encode())
            probe.flush(10)
            while True:
                if count() == before + 1:
                    probes.append(Probe(at, time.time() - t0))
                    break
                if time.time() - t0 > 60:
                    raise SystemExit(f"a probe of {entity} was not servable after 60 s")
                time.sleep(0.005)
            time.sleep(0.1)
    stop.set()
    thread.join()
    return probes, produced[0] / seconds


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def plot(path: Path, probes: list[Probe], rate: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot([p.at for p in probes], [p.delay for p in probes], ".", markersize=3)
    ax.axhline(BOUND_S, color="red", linewidth=0.8, label=f"target: p99 <= {BOUND_S:g} s")
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("event to servable, s")
    ax.set_title(f"Window aggregations: event to servable at {rate:,} events/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=8.0, help="per cost cell (8)")
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument("--skip-stream", action="store_true", help="memory and cost only")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fs-aggregations-") as tmp:
        work = Path(tmp)
        registry = work / "features.yaml"
        registry.write_text(REGISTRY)
        group = load_registry(registry).group(AGG)
        with EmbeddedRedis(work / "redis", persistence=False) as r:
            # 1. memory: profiles in their own id ranges; the plain group holds the answers
            mem_rows = []
            for k, per_day in enumerate(PROFILES):
                ids = range(20_000_000 + k * 10_000, 20_000_000 + k * 10_000 + 1000)
                answers = fill(r.url, group, ids, per_day, seed=k)
                with FeatureStore.connect(r.url, load_registry(registry)) as store:
                    store.write(PLAIN, [(i, _plain(v)) for i, v in answers.items()])
                agg, plain = memory(r.url, "c", ids), memory(r.url, "s", ids)
                mem_rows.append((per_day, agg, plain))
                print(
                    f"memory, {per_day} events/day: {agg:,.0f} B/entity, plain {plain:,.0f}",
                    flush=True,
                )

            # 2. cost: --entities of 10 events a day, and the same answers as a plain group
            t0 = time.monotonic()
            answers = fill(r.url, group, range(args.entities), 10, seed=99)
            with FeatureStore.connect(r.url, load_registry(registry)) as store:
                rows = [(i, _plain(v)) for i, v in answers.items()]
                for start in range(0, len(rows), 5000):
                    store.write(PLAIN, rows[start : start + 5000])
            print(f"filled {args.entities:,} entities in {time.monotonic() - t0:.0f} s", flush=True)
            cells = []
            for api in ("rest", "grpc"):
                for l1 in (False, True):
                    for g in (PLAIN, AGG):
                        cell = cost_cell(r, registry, api, l1, g, args.entities, args.seconds, work)
                        cells.append(cell)
                        print(
                            f"{api} L1 {cell.l1} {g}: {cell.requests / cell.seconds:,.0f} req/s, "
                            f"server {cell.server_us:.1f} us/entity, Redis {cell.redis_us:.1f}",
                            flush=True,
                        )
        lines += [
            *header(
                f"Embedded Redis, one `feature-store serve` worker per cell; batches of 10 "
                f"of {args.entities:,} entities (10 events a day each); wrk (REST) and h2load "
                f"(gRPC), 8 connections, {args.seconds:g} s per cell, L1 TTL 2 s."
            ),
            "",
            "## Redis bytes per entity at steady state",
            "",
            "| events a day | aggregated (tiles) | the six answers as a plain group | ratio |",
            "|---:|---:|---:|---:|",
            *(f"| {d} | {a:,.0f} | {p:,.0f} | {a / p:.1f}x |" for d, a, p in mem_rows),
            "",
            "## Server CPU per entity looked up: six aggregated features against six plain",
            "",
            "| API | L1 | plain µs/entity | aggregated µs/entity | aggregated / plain | Redis µs/entity (plain, aggregated) | req/s (plain, aggregated) | errors |",  # noqa: E501
            "|---|---|---:|---:|---:|---|---|---:|",
        ]  # fmt: skip
        for api in ("rest", "grpc"):
            for l1 in ("off", "on"):
                p, a = (
                    next(c for c in cells if (c.api, c.l1, c.group) == (api, l1, g))
                    for g in (PLAIN, AGG)
                )
                lines.append(
                    f"| {api} | {l1} | {p.server_us:.1f} | {a.server_us:.1f} | "
                    f"**{a.server_us / p.server_us:.2f}x** | {p.redis_us:.1f}, {a.redis_us:.1f} | "
                    f"{p.requests / p.seconds:,.0f}, {a.requests / a.seconds:,.0f} | {p.errors + a.errors} |"  # noqa: E501
                )
        if not args.skip_stream:
            lines += stream_sections(args, work, registry)
    save(args.out, "Window aggregations", lines)
    return 0


def stream_sections(args: argparse.Namespace, work: Path, registry: Path) -> list[str]:
    plain_registry = work / "plain.yaml"
    plain_registry.write_text(PLAIN_STREAM)
    with (
        EmbeddedRedis(work / "redis2", persistence=False) as r,
        EmbeddedKafka(work / "kafka") as kafka,
    ):
        # 3. the backlog, drained by each stream in turn
        p, rng = producer(kafka.bootstrap), random.Random(3)
        now = time.time()
        for n in range(args.backlog):
            entity = rng.randrange(args.entities)
            p.produce(
                "backlog", order(entity, rng, now - rng.uniform(0, 600)), key=str(entity).encode()
            )
            if n % 10_000 == 0:
                p.poll(0)
        p.flush(120)
        rates = {}
        for name, reg, group in (
            ("aggregated", registry, AGG),
            ("plain", plain_registry, "consumer_orders"),
        ):
            records, seconds = backlog(reg, group, kafka.bootstrap, r.url, work, name)
            rates[name] = (records, seconds)
            print(f"backlog, {name}: {records:,} records in {seconds:.1f} s of batches", flush=True)

        # 4. event to servable at --rate
        env = {"FEATURE_SERVING_CACHE_TTL": "300", "FEATURE_SERVING_SHADOW_FRACTION": "0"}
        with ServingProcess(r.url, registry=registry, env=env, grpc=False) as server:
            job = stream(
                registry,
                AGG,
                "orders",
                kafka.bootstrap,
                r.url,
                work,
                "live",
                "--trigger-seconds",
                "0",
            )
            try:
                print("warming up the stream (its Spark session starts) ...", flush=True)
                latency(kafka.bootstrap, server.rest_url, 100, 20, args.entities)
                probes, held = latency(
                    kafka.bootstrap, server.rest_url, args.rate, args.latency_seconds, args.entities
                )
            finally:
                job.terminate()
                job.wait(timeout=60)
    delays = [p.delay for p in probes]
    over = sum(1 for d in delays if d > BOUND_S)
    print(
        f"event to servable at {held:,.0f}/s: p50 {pct(delays, 0.5):.3f} s, p99 {pct(delays, 0.99):.3f} s, max {max(delays):.3f} s",  # noqa: E501
        flush=True,
    )
    if args.out:
        plot(args.out.with_suffix(".png"), probes, args.rate)
    (ar, as_), (pr, ps) = rates["aggregated"], rates["plain"]
    return [
        "",
        "## Events/s from a backlog (`feature-store stream`, Spark local[2])",
        "",
        f"{args.backlog:,} orders keyed by consumer, uniform over {args.entities:,}; records over "
        "the sum of the micro-batches' own seconds.",
        "",
        "| stream | records | batch seconds | records/s | against plain |",
        "|---|---:|---:|---:|---:|",
        f"| aggregated (tiles, compare-and-set) | {ar:,} | {as_:.1f} | {ar / as_:,.0f} | {ar / as_ / (pr / ps):.2f}x |",  # noqa: E501
        f"| plain (newest record per entity, guarded write) | {pr:,} | {ps:.1f} | {pr / ps:,.0f} | 1.00x |",  # noqa: E501
        "",
        f"## Event to servable at {args.rate:,} events/s ({held:,.0f} held) over {args.entities:,} consumers",  # noqa: E501
        "",
        "Produced to Kafka -> `orders_1h` counts it through REST (L1 on, TTL 300 s). "
        f"Plot: `{args.out.with_suffix('.png').name if args.out else '-'}`.",
        "",
        "| probes | p50 s | p99 s | max s | past 2 s |",
        "|---:|---:|---:|---:|---:|",
        f"| {len(delays)} | {pct(delays, 0.5):.3f} | **{pct(delays, 0.99):.3f}** | {max(delays):.3f} | {over} |",  # noqa: E501
    ]  # fmt: skip


def _plain(values: list[object]) -> dict[str, object]:
    names = ("orders", "spend", "basket_mean", "max_spend", "min_spend", "last_stores")
    return dict(zip(names, values, strict=True))


if __name__ == "__main__":
    raise SystemExit(main())
