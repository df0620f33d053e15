"""The writers' notices: a write of keys carries its time, which serving reports as the
group's last write; a malformed time makes the message malformed, not a wrong gauge."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from feature_store import notices
from feature_store.kafka import KafkaError, connector_conf


def test_a_write_of_keys_carries_its_time() -> None:
    message = notices.write_message("o", "g", [b"c:1", b"c:2"], 1_760_000_000.1234)
    doc = notices.parse(message)
    assert doc == {"origin": "o", "group": "g", "keys": ["c:1", "c:2"], "written": 1760000000.123}
    many = notices.write_message("o", "g", [b"k"] * (notices.KEYS_MAX + 1), 1_760_000_000.0)
    assert notices.parse(many) == {"origin": "o", "group": "g", "generation": 1760000000.0}


@pytest.mark.parametrize("written", ["soon", -1, 2**41, True])
def test_a_bad_write_time_is_a_malformed_message(written: object) -> None:
    data = orjson.dumps({"origin": "o", "group": "g", "keys": ["c:1"], "written": written})
    assert notices.parse(data) is None


def test_a_message_without_a_time_is_still_read() -> None:
    assert notices.parse(notices.keys_message("o", "g", [b"c:1"])) is not None


def test_the_users_own_connector_replaces_the_fetched_jars(tmp_path: Path) -> None:
    """`--conf spark.jars.packages=...spark-sql-kafka...` needs no fetched jars."""
    packages = {"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"}
    assert connector_conf(packages) == {}
    empty = tmp_path
    with pytest.raises(KafkaError, match="fetch-jars"):
        connector_conf({}, empty)
    (empty / "spark").mkdir()
    jar = empty / "spark" / "spark-sql-kafka-0-10_2.13-4.2.0.jar"
    jar.write_bytes(b"")
    assert connector_conf({}, empty) == {"spark.jars": str(jar)}
