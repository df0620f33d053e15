"""``feature-store stream`` against a real Kafka broker (KRaft, embedded), real Spark and
real Redis: out-of-order and duplicated events end in "newest event wins", bad records are
quarantined with their reasons, a SIGKILLed job resumes from its checkpoint with nothing
lost, a broker restart is ridden out, and a serving cache shows streamed values at once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
import redis
from confluent_kafka import Producer

from feature_store import sample
from feature_store.client import FeatureClient
from feature_store.embedded import EmbeddedRedis
from feature_store.kafka import EmbeddedKafka
from feature_store.layout import entity_key
from feature_store.registry import Registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.spark

GROUP = sample.GROUP
T0 = 1_760_000_000.0


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


def _produce(
    bootstrap: str,
    topic: str,
    records: list[bytes],
    keys: list[bytes] | None = None,
    timestamps_ms: list[int] | None = None,
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
            "log_level": 2,
        }
    )
    for i, record in enumerate(records):
        extra: dict[str, object] = {}
        if keys is not None:
            extra["key"] = keys[i]
        if timestamps_ms is not None:
            extra["timestamp"] = timestamps_ms[i]
        producer.produce(topic, record, **extra)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "records were not delivered"


def _event(entity_id: object, event_time: object, **values: object) -> bytes:
    return orjson.dumps({"consumer_id": entity_id, "event_time": event_time, **values})


def _stream(
    registry_file: Path, redis_url: str, bootstrap: str, topic: str, tmp: Path, *extra: str
) -> subprocess.Popen[str]:
    args = [
        sys.executable,
        "-m",
        "feature_store.cli",
        "stream",
        "--registry",
        str(registry_file),
        "--group",
        GROUP,
        "--topic",
        topic,
        "--bootstrap-servers",
        bootstrap,
        "--checkpoint",
        str(tmp / "checkpoint"),
        "--quarantine",
        str(tmp / "quarantine"),
        "--redis-url",
        redis_url,
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--progress-interval",
        "2",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _drain(
    registry_file: Path, redis_url: str, bootstrap: str, topic: str, tmp: Path, *extra: str
) -> str:
    process = _stream(registry_file, redis_url, bootstrap, topic, tmp, "--available-now", *extra)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-4000:]
    return out


def _values(redis_url: str, registry: Registry, ids: list[int]) -> list[object]:
    with FeatureStore.connect(redis_url, registry, notify=False) as store:
        result = store.read(sample.ENTITY, ids, features=["int_0"])
    return [r.values[0] for r in result.rows]


def _stored_times(redis_url: str, registry: Registry, ids: list[int]) -> list[bytes | None]:
    entity = registry.group(GROUP).entity
    field = registry.group(GROUP).freshness_field
    with redis.Redis.from_url(redis_url) as client:
        return [client.hget(entity_key(entity.prefix, entity.id_type, i), field) for i in ids]


def test_newest_event_wins_and_bad_records_are_quarantined(
    kafka: EmbeddedKafka, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """2,000 events of 200 entities, shuffled, a third of them delivered twice, and five
    bad records: each entity ends with its newest event; the bad ones are quarantined."""
    registry = sample.registry()
    rng = random.Random(3)
    events = [
        (i, T0 + step + rng.random() / 2, step * 1000 + i) for i in range(200) for step in range(10)
    ]
    records = [_event(i, t, int_0=v) for i, t, v in events]
    records += rng.sample(records, len(records) // 3)  # at least once: redelivered
    rng.shuffle(records)
    bad = [
        b"not json",
        orjson.dumps({"event_time": T0, "int_0": 1}),  # no id
        _event(1, T0 + 50, int_0="many"),  # not an int
        _event(1, T0 + 50, int_0=1, colour="red"),  # no such feature
        _event(1, time.time() + 86400, int_0=1),  # a day ahead
    ]
    _produce(kafka.bootstrap, "events-a", records + bad)

    out = _drain(registry_file, redis_url, kafka.bootstrap, "events-a", tmp_path)
    assert "stream: batch 0:" in out

    ids = list(range(200))
    assert _values(redis_url, registry, ids) == [9000 + i for i in ids]
    newest = {i: t for i, t, _ in events}  # steps ascend: the last one per id is the newest
    times = _stored_times(redis_url, registry, ids)
    assert all(abs(float(t or 0) - newest[i]) < 0.001 for i, t in zip(ids, times, strict=True))
    quarantined = pq.read_table(tmp_path / "quarantine").to_pylist()
    assert sorted(r["_stream_reason"] for r in quarantined) == [
        "invalid_event_time",
        "invalid_value",
        "malformed_record",
        "null_id",
        "unknown_field",
    ]
    assert all(r["offset"] is not None for r in quarantined)


@pytest.mark.timeout(600)  # two Spark start-ups and a broker restart on a shared machine
def test_killed_job_resumes_from_its_checkpoint_and_serving_sees_values_at_once(
    kafka: EmbeddedKafka,
    registry_file: Path,
    redis_server: EmbeddedRedis,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """A running job: a serving cache (TTL 300 s) shows streamed values within seconds;
    the broker is SIGKILLed and restarted under it, Redis is stopped for 3 s under it; then
    the job itself is SIGKILLed and a new one drains the topic from the checkpoint: every
    entity ends with its newest event."""
    registry = sample.registry()
    ids = list(range(500, 700))
    env = {"FEATURE_SERVING_CACHE_TTL": "300", "FEATURE_SERVING_SHADOW_FRACTION": "0"}
    with (
        ServingProcess(redis_url, registry=registry_file, env=env, grpc=False) as server,
        FeatureClient(server.rest_url, timeout=10) as client,
    ):
        assert {r.values[0] for r in client.get(sample.ENTITY, ids[:10], ["int_0"]).rows} == {
            None
        }  # cached as missing, for 300 s
        job = _stream(registry_file, redis_url, kafka.bootstrap, "events-b", tmp_path)
        try:
            _produce(kafka.bootstrap, "events-b", [_event(i, T0 + 1, int_0=1) for i in ids])
            deadline = time.monotonic() + 120  # the job's Spark session starts first
            while _seen(client, ids[:10]) != [1] * 10:
                assert job.poll() is None, job.stdout.read() if job.stdout else ""
                assert time.monotonic() < deadline, "serving never showed the streamed values"
                time.sleep(0.2)
            # the stream's notices carry their write time: the group's freshness gauge
            text = httpx.get(f"{server.rest_url}/metrics", timeout=10).text
            gauge = "feature_serving_group_batch_written_seconds{group=" + f'"{GROUP}"' + "}"
            (line,) = [ln for ln in text.splitlines() if ln.startswith(gauge)]
            assert time.time() - 120 < float(line.split()[-1]) <= time.time() + 1

            kafka.kill()  # the broker crashes and comes back on its port
            kafka.start()
            _produce(kafka.bootstrap, "events-b", [_event(i, T0 + 2, int_0=2) for i in ids])
            deadline = time.monotonic() + 120
            while _seen(client, ids[:10]) != [2] * 10:
                assert job.poll() is None, job.stdout.read() if job.stdout else ""
                assert time.monotonic() < deadline, "the job did not ride out the restart"
                time.sleep(0.2)

            # Redis goes away for 3 s while events come in: the job's writes retry
            redis_server.stop()
            _produce(kafka.bootstrap, "events-b", [_event(i, T0 + 2.1, int_0=21) for i in ids])
            time.sleep(3)
            redis_server.start()
            deadline = time.monotonic() + 120
            while _values(redis_url, registry, ids) != [21] * len(ids):
                assert job.poll() is None, job.stdout.read() if job.stdout else ""
                assert time.monotonic() < deadline, "the job did not ride out Redis's restart"
                time.sleep(0.2)

            # more events, and the job killed while they come in
            waves = [[_event(i, T0 + 3 + w, int_0=3 + w) for i in ids] for w in range(10)]
            for wave in waves[:5]:
                _produce(kafka.bootstrap, "events-b", wave)
            job.send_signal(signal.SIGKILL)
        finally:
            if job.poll() is None:
                job.kill()
            job.wait(timeout=30)
            if job.stdout is not None:
                job.stdout.close()
        for wave in waves[5:]:
            _produce(
                kafka.bootstrap, "events-b", wave + [_event(i, T0 + 2.5, int_0=-1) for i in ids]
            )
        _drain(registry_file, redis_url, kafka.bootstrap, "events-b", tmp_path)
        assert _values(redis_url, registry, ids) == [12] * len(ids)  # the newest wave, 3 + 9
        deadline = time.monotonic() + 30
        while _seen(client, ids[:10]) != [12] * 10:
            assert time.monotonic() < deadline, "serving kept the old values"
            time.sleep(0.2)


def _seen(client: FeatureClient, ids: list[int]) -> list[object]:
    return [r.values[0] for r in client.get(sample.ENTITY, ids, ["int_0"]).rows]


def test_an_unknown_group_stops_the_job_at_start(
    kafka: EmbeddedKafka, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    job = _stream(registry_file, redis_url, kafka.bootstrap, "t", tmp_path, "--group", "nope")
    out, _ = job.communicate(timeout=120)
    assert job.returncode != 0
    assert "unknown feature group 'nope'" in out


AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "demo",
    "fields": [
        {"name": "orders", "type": "long"},
        {"name": "float_00", "type": ["null", "float"], "default": None},
    ],
}


def test_avro_records_keyed_by_entity_with_kafka_s_timestamps(
    kafka: EmbeddedKafka, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """Avro values (fastavro's encoding) with the id in the key (int64) and the event time
    in Kafka's timestamp, a field renamed by --map: each entity ends with its newest
    record; a value that is not Avro and a key that is no int64 are quarantined."""
    import io

    import fastavro

    schema = fastavro.parse_schema(AVRO_SCHEMA)

    def avro(orders: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, {"orders": orders, "float_00": 0.5})
        return out.getvalue()

    rng = random.Random(5)
    events = [(i, step) for i in range(100) for step in range(3)]
    rng.shuffle(events)
    records = [avro(1000 * step + i) for i, step in events]
    keys = [i.to_bytes(8, "big") for i, _ in events]
    stamps = [int((T0 + step) * 1000) for _, step in events]
    records += [b"\x02\x09", avro(5)]  # a union's branch -5; a key of 3 bytes
    keys += [(7).to_bytes(8, "big"), b"abc"]
    stamps += [int(T0 * 1000), int(T0 * 1000)]
    _produce(kafka.bootstrap, "avro-a", records, keys=keys, timestamps_ms=stamps)
    (tmp_path / "order.avsc").write_text(orjson.dumps(AVRO_SCHEMA).decode())
    args = ["--format", "avro", "--avro-schema", str(tmp_path / "order.avsc"), "--id-from-key"]
    args += ["--key-format", "int64", "--event-time-from", "kafka", "--map", "orders=int_0"]
    _drain(registry_file, redis_url, kafka.bootstrap, "avro-a", tmp_path, *args)

    ids = list(range(100))
    registry = sample.registry()
    assert _values(redis_url, registry, ids) == [2000 + i for i in ids]
    times = _stored_times(redis_url, registry, ids)
    assert all(abs(float(t or 0) - (T0 + 2)) < 0.001 for t in times)
    quarantined = pq.read_table(tmp_path / "quarantine").to_pylist()
    assert sorted(r["_stream_reason"] for r in quarantined) == ["invalid_id", "malformed_record"]


def test_avro_in_confluent_frames(
    kafka: EmbeddedKafka, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """Avro values as Confluent's Schema Registry serializer frames them (magic byte 0, a
    4-byte schema id, the record): read with --confluent-framing; an Avro null removes
    the value; an unframed value is quarantined."""
    import io

    import fastavro

    schema = fastavro.parse_schema(AVRO_SCHEMA)

    def framed(orders: int) -> bytes:
        out = io.BytesIO(b"\x00" + (42).to_bytes(4, "big"))
        out.seek(5)
        fastavro.schemaless_writer(out, schema, {"orders": orders, "float_00": None})
        return out.getvalue()

    records = [framed(i) for i in range(20)] + [framed(5)[5:]]
    keys = [str(3000 + i).encode() for i in range(21)]
    with FeatureStore.connect(redis_url, sample.registry(), notify=False) as store:
        store.write(GROUP, [(3000 + i, {"float_00": 1.5}, T0) for i in range(20)])
    _produce(kafka.bootstrap, "avro-framed", records, keys=keys)
    (tmp_path / "order.avsc").write_text(orjson.dumps(AVRO_SCHEMA).decode())
    args = ["--format", "avro", "--avro-schema", str(tmp_path / "order.avsc")]
    args += ["--confluent-framing", "--id-from-key", "--event-time-from", "kafka"]
    args += ["--map", "orders=int_0"]
    _drain(registry_file, redis_url, kafka.bootstrap, "avro-framed", tmp_path, *args)
    ids = [3000 + i for i in range(20)]
    assert _values(redis_url, sample.registry(), ids) == list(range(20))
    with FeatureStore.connect(redis_url, sample.registry(), notify=False) as store:
        floats = store.read(sample.ENTITY, ids, features=["float_00"]).rows
    assert {r.values[0] for r in floats} == {None}  # an Avro null removes the value
    quarantined = pq.read_table(tmp_path / "quarantine").to_pylist()
    assert [(r["_stream_reason"], r["offset"] is not None) for r in quarantined] == [
        ("malformed_record", True)
    ]


PROTO = """
syntax = "proto3";
package demo;
import "google/protobuf/timestamp.proto";
message Order {
  int64 consumer_id = 1;
  google.protobuf.Timestamp event_time = 2;
  int64 int_0 = 3;
  optional float float_00 = 4;
}
"""


def test_protobuf_records_and_a_replayed_batch_quarantines_once(
    kafka: EmbeddedKafka, registry_file: Path, redis_url: str, tmp_path: Path
) -> None:
    """Protobuf values from a .proto, written by the protobuf runtime: newest wins, a bad
    message is quarantined; then the last micro-batch is replayed (its commit removed, as
    after a crash between the write and Spark's commit): the same values, the bad records
    quarantined once, not twice."""
    from feature_store.ingest.cli_stream import proto_descriptor as _proto_descriptor
    from feature_store.ingest.records import proto_message_class

    (tmp_path / "order.proto").write_text(PROTO)
    order = proto_message_class(_proto_descriptor(tmp_path / "order.proto"), "demo.Order")

    def message(i: int, step: int) -> bytes:
        m = order(consumer_id=i, int_0=100 * step + i)
        m.event_time.FromNanoseconds(int((T0 + step) * 1e9))
        return bytes(m.SerializeToString())

    records = [message(i, step) for step in (2, 0, 1) for i in range(50)] + [b"\xff\xff"]
    _produce(kafka.bootstrap, "proto-a", records)
    args = ["--format", "protobuf", "--proto-descriptor", str(tmp_path / "order.proto")]
    args += ["--proto-message", "demo.Order"]
    _drain(registry_file, redis_url, kafka.bootstrap, "proto-a", tmp_path, *args)
    registry = sample.registry()
    assert _values(redis_url, registry, list(range(50))) == [200 + i for i in range(50)]
    first = pq.read_table(tmp_path / "quarantine").to_pylist()
    assert [r["_stream_reason"] for r in first] == ["malformed_record"]

    commits = sorted(
        (tmp_path / "checkpoint" / "commits").glob("[0-9]*"), key=lambda p: int(p.name)
    )
    commits[-1].unlink()  # the last batch written, not committed
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    out = _drain(registry_file, redis_url, kafka.bootstrap, "proto-a", tmp_path, *args)
    assert f"stream: batch {commits[-1].name}:" in out  # replayed
    assert pq.read_table(tmp_path / "quarantine").to_pylist() == first
    assert _values(redis_url, registry, list(range(50))) == [200 + i for i in range(50)]
