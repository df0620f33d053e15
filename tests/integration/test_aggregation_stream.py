"""Window aggregations from a real Kafka topic (KRaft, embedded) through ``feature-store
stream`` (real Spark) into a real Redis, and from a history through ``feature-store
ingest``: out-of-order, duplicated, late and bad records; the job SIGKILLed mid-run and
resumed on its checkpoint; the topic replayed from the start on a new checkpoint; a
backfill of the same events. Every entity's answers equal the reference's."""

from __future__ import annotations

import itertools
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feature_store import sample
from feature_store.batch import Status
from feature_store.connection import RedisTarget
from feature_store.embedded import EmbeddedRedis
from feature_store.ingest.job import IngestJob, run_ingest, spark_session
from feature_store.kafka import EmbeddedKafka
from feature_store.registry import Function, load_registry
from feature_store.store import FeatureStore, read_plans
from feature_store.windows import Event, reference_answer

pytestmark = pytest.mark.spark

GROUP, FEATURES = sample.ACTIVITY_GROUP, sample.ACTIVITY_FEATURES
READ = ("order_total", "basket_size", "store_id")  # the fields the aggregates read


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def _registry(tmp: Path, prefix: str) -> Path:
    path = tmp / f"features-{prefix}.yaml"
    path.write_text(sample.activity_registry_text(prefix))
    return path


class Topic:
    """Records produced, and each one's entity, event and place (partition, offset) as
    the broker acknowledged it: the reference's input."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.name = name
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2, "acks": "all"}
        )
        self.placed: list[tuple[int, dict[str, object], int, int]] = []  # in ack order

    def send(self, records: list[tuple[int, dict[str, object]]], raw: list[bytes] = ()) -> None:  # type: ignore[assignment]
        for entity, doc in records:

            def placed(
                err: object, msg: object, entity: int = entity, doc: dict[str, object] = doc
            ) -> None:
                assert err is None, err
                self.placed.append((entity, doc, msg.partition(), msg.offset()))  # type: ignore[attr-defined]

            body = orjson.dumps({"consumer_id": entity, **doc})
            self.producer.produce(self.name, body, key=str(entity).encode(), on_delivery=placed)
            self.producer.poll(0)
        for body in raw:
            self.producer.produce(self.name, body, key=b"bad")
        assert self.producer.flush(60) == 0

    def history(self) -> dict[int, list[Event]]:
        """Each entity's events in the order its partition holds them."""
        out: dict[int, list[Event]] = {}
        for entity, doc, partition, offset in sorted(self.placed, key=lambda p: (p[2], p[3])):
            values = {k: v for k, v in doc.items() if k in READ and v is not None}
            event = Event(round(doc["event_time"] * 1000), values, partition, offset)  # type: ignore[operator,arg-type]
            out.setdefault(entity, []).append(event)
        return out


def _events(
    rng: random.Random, ids: list[int], now: float, n: int
) -> list[tuple[int, dict[str, object]]]:
    """Events over the last 8 days, out of order; some duplicated; some an hour older than
    the entity's events before them (past the lateness, unless none came before)."""
    out: list[tuple[int, dict[str, object]]] = []
    for _ in range(n):
        entity = rng.choice(ids)
        back = rng.choice(
            [rng.uniform(0, 900), rng.uniform(0, 3 * 3600), rng.uniform(0, 8 * 86400)]
        )
        doc: dict[str, object] = {
            "event_time": round(now - back, 3),
            "order_total": round(rng.uniform(1, 300), 2) if rng.random() < 0.9 else None,
            "basket_size": rng.randint(1, 12),
            "store_id": rng.randint(1, 50),
            "channel": "app",  # a field no aggregate reads: ignored
        }
        out.append((entity, doc))
        if rng.random() < 0.05:
            out.append((entity, dict(doc)))  # produced twice: two events
    return out


def _answers(redis_url: str, registry: Path, ids: list[int], at: float) -> list[list[object]]:
    with FeatureStore.connect(redis_url, load_registry(registry)) as store:
        # answered at the time given: the stream's, the backfill's and the reference's
        # answers are compared at one instant
        plan = store.plan("consumer", ids, FEATURES)
        (result,) = read_plans(store.client, [plan], now=at)
    rows = []
    for row in result.rows:
        assert all(s is not Status.ERROR for s in row.statuses), row
        rows.append(list(row.values))
    return rows


def _equal(got: list[list[object]], want: list[list[object]]) -> None:
    functions = [
        Function.COUNT,
        Function.SUM,
        Function.MEAN,
        Function.MAX,
        Function.MIN,
        Function.LAST_N,
    ]
    for g_row, w_row in zip(got, want, strict=True):
        for g, w, f in zip(g_row, w_row, functions, strict=True):
            if f in (Function.SUM, Function.MEAN) and g is not None and w is not None:
                assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9), (g_row, w_row)  # type: ignore[arg-type]
            else:
                assert g == w, (g_row, w_row)


def _stream(
    registry: Path,
    redis_url: str,
    bootstrap: str,
    topic: str,
    tmp: Path,
    checkpoint: str,
    *extra: str,
) -> subprocess.Popen[str]:
    args = [
        sys.executable, "-m", "feature_store.cli", "stream",
        "--registry", str(registry), "--group", GROUP, "--topic", topic,
        "--bootstrap-servers", bootstrap, "--checkpoint", str(tmp / checkpoint),
        "--quarantine", str(tmp / f"quarantine-{checkpoint}"), "--redis-url", redis_url,
        "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "--max-records-per-batch", "700", "--progress-interval", "2", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _drain(*args: object) -> str:
    process = _stream(*args, "--available-now")  # type: ignore[arg-type]
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-4000:]
    return out


def test_stream_killed_resumed_and_replayed_equals_the_reference(
    kafka: EmbeddedKafka, redis_server: EmbeddedRedis, redis_url: str, tmp_path: Path
) -> None:
    registry = _registry(tmp_path, "sa")
    rng = random.Random(45)
    ids = list(range(1, 301))
    now = time.time()
    topic = Topic(kafka.bootstrap, "orders-a")
    bad = [b"{not json", orjson.dumps({"consumer_id": 5, "event_time": now, "order_total": "x"})]
    topic.send(_events(rng, ids, now, 2500), bad)
    job = _stream(registry, redis_url, kafka.bootstrap, topic.name, tmp_path, "cp")
    try:
        # killed once some micro-batches are written and others not
        deadline = time.monotonic() + 180
        seen = ""
        while "batch 1:" not in seen:
            assert job.poll() is None, seen[-3000:]
            assert job.stdout is not None
            assert time.monotonic() < deadline, seen[-3000:]
            seen += job.stdout.readline()
        topic.send(_events(rng, ids, now, 1500))
        job.send_signal(signal.SIGKILL)
    finally:
        if job.poll() is None:
            job.kill()
        job.wait(timeout=30)
        if job.stdout is not None:
            job.stdout.close()
    topic.send(_events(rng, ids, now, 1000))
    out = _drain(registry, redis_url, kafka.bootstrap, topic.name, tmp_path, "cp")
    history = topic.history()
    at = time.time()
    group = load_registry(registry).group(GROUP)
    assert group.aggregation is not None
    want = [reference_answer(group.aggregation, history.get(i, []), at) for i in ids]
    _equal(_answers(redis_url, registry, ids, at), want)

    # the late records are quarantined as too_late, the bad ones with their reasons
    quarantined = pq.read_table(tmp_path / "quarantine-cp").to_pylist()
    reasons = sorted(r["_stream_reason"] for r in quarantined)
    assert reasons.count("malformed_record") == 1
    assert reasons.count("invalid_value") == 1
    late = _late(group.aggregation.lateness_seconds, history)
    assert late > 0
    assert reasons.count("too_late") == late

    # the topic replayed from its start on a new checkpoint: every event applied before
    out = _drain(
        registry,
        redis_url,
        kafka.bootstrap,
        topic.name,
        tmp_path,
        "cp2",
        "--starting-offsets",
        "earliest",
    )
    counted = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) events counted", out)]
    assert counted, out[-3000:]
    assert set(counted) == {0}, out[-3000:]
    replayed = sum(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) replayed", out))
    assert replayed == sum(len(events) for events in history.values())  # the late ones too
    _equal(_answers(redis_url, registry, ids, at), want)

    # a backfill of the events the stream counted, into other keys: the same answers
    backfill = _registry(tmp_path, "sb")
    rows = [
        {"consumer_id": i, "event_time": e.time_ms / 1000, **dict(e.values)}
        for i, events in history.items()
        for e in _counted(group.aggregation.lateness_seconds, events)
    ]
    rng.shuffle(rows)
    path = tmp_path / "history.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    spark = spark_session(
        "local[2]", {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "3"}
    )
    report = run_ingest(spark, IngestJob(backfill, GROUP, str(path), "consumer_id", redis_url))
    assert report.bad_rows == 0
    assert report.values_written == len(rows)
    _equal(_answers(redis_url, backfill, ids, at), want)
    # run again: it replaces the tiles, it does not add to them
    run_ingest(spark, IngestJob(backfill, GROUP, str(path), "consumer_id", redis_url))
    _equal(_answers(redis_url, backfill, ids, at), want)


def _counted(lateness: int, events: list[Event]) -> list[Event]:
    newest: int | None = None
    out = []
    for e in events:
        if newest is not None and e.time_ms < newest - lateness * 1000:
            continue
        out.append(e)
        newest = e.time_ms if newest is None else max(newest, e.time_ms)
    return out


def _late(lateness: int, history: dict[int, list[Event]]) -> int:
    return sum(len(events) - len(_counted(lateness, events)) for events in history.values())


def test_a_batch_whose_quarantine_fails_is_replayed_with_every_late_record(
    kafka: EmbeddedKafka, redis_server: EmbeddedRedis, redis_url: str, tmp_path: Path
) -> None:
    """The first run cannot write its quarantine (a file stands where the directory's
    parent goes) and stops at its first batch with a late record. Run again on the same
    checkpoint, the batch is replayed: its late records must still be found and
    quarantined, so none of its events may have been counted before they were."""
    registry = _registry(tmp_path, "sq")
    rng = random.Random(46)
    ids = list(range(1, 101))
    now = time.time()
    topic = Topic(kafka.bootstrap, "orders-q")
    topic.send(_events(rng, ids, now, 1200))
    history = topic.history()
    group = load_registry(registry).group(GROUP)
    assert group.aggregation is not None
    late = _late(group.aggregation.lateness_seconds, history)
    assert late > 0
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory")
    quarantine = ("--quarantine", str(blocked / "quarantine"))
    args = (registry, redis_url, kafka.bootstrap, topic.name, tmp_path, "cpq", *quarantine)
    first = _stream(*args, "--available-now")
    out, _ = first.communicate(timeout=300)
    assert first.returncode != 0, out[-3000:]
    blocked.unlink()
    _drain(*args)
    quarantined = pq.read_table(blocked / "quarantine").to_pylist()
    assert sorted(r["_stream_reason"] for r in quarantined) == ["too_late"] * late
    at = time.time()
    want = [reference_answer(group.aggregation, history.get(i, []), at) for i in ids]
    _equal(_answers(redis_url, registry, ids, at), want)


_ENTITIES = itertools.count(1)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_two_writers_of_one_entity_lose_no_event(redis_url: str, data: st.DataObject) -> None:
    """Events of one entity from two partitions written at once by two writers: the
    compare-and-set makes the loser read again, so every event is counted once."""
    import threading

    from feature_store.ingest.spec import RetrySpec
    from feature_store.ingest.windows import write_events
    from feature_store.ingest.writer import ChunkWriter
    from feature_store.layout import entity_key
    from feature_store.registry import parse_registry

    group = parse_registry(sample.activity_registry_text("tw")).group(GROUP)
    key = entity_key("tw", group.entity.id_type, next(_ENTITIES))  # a new one per example
    now = time.time()
    counts = data.draw(st.tuples(st.integers(1, 40), st.integers(1, 40)))
    errors: list[BaseException] = []

    def write(partition: int, n: int) -> None:
        writer = ChunkWriter(
            RedisTarget.parse(redis_url), ttl_seconds=60, chunk_size=1, retry=RetrySpec()
        )
        try:
            for offset in range(n):  # one call per event: as many compare-and-sets
                event = Event(
                    math.floor(now * 1000) - offset, {"order_total": 1.0}, partition, offset
                )
                write_events(writer, group, {key: [(0, event)]})
        except BaseException as e:
            errors.append(e)
        finally:
            writer.close()

    threads = [
        threading.Thread(target=write, args=(p, n)) for p, n in zip((0, 1), counts, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with FeatureStore.connect(
        redis_url, parse_registry(sample.activity_registry_text("tw"))
    ) as store:
        row = store.read("consumer", [int(key.split(b":")[1])], ["orders_1h", "spend_1h"]).rows[0]
    assert row.values == [sum(counts), float(sum(counts))]
