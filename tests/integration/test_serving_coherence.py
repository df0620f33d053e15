"""The L1 against writes it did not make: batch-write notices, shadow checks, warm starts.

Real `feature-store serve` processes on one real Redis; the writes come from the library
client (and, in tests/integration/test_ingest.py, the Spark job).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis
from scrape import metric

from feature_store import notices, sample
from feature_store.client import FeatureClient
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY
REGISTRY = sample.registry()
LONG_TTL = {"FEATURE_SERVING_CACHE_TTL": "600", "FEATURE_SERVING_SHADOW_FRACTION": "0"}


def _until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.05)


def _summary(server: ServingProcess) -> dict[str, object]:
    doc: dict[str, object] = httpx.get(f"{server.rest_url}/v1/admin/cache", timeout=5).json()
    return doc


def _counter(server: ServingProcess, name: str) -> int:
    counters = _summary(server)["counters"]
    assert isinstance(counters, dict)
    return int(counters[name])


def _int0(client: FeatureClient, ids: list[int]) -> list[object]:
    return [r.values[0] for r in client.get(ENTITY, ids, features=["int_0"]).rows]


def _entity_reads(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


# --- batch writes that bypass the serving API ----------------------------------------------


def test_a_batch_write_reaches_every_instance_without_a_stampede(redis_url: str) -> None:
    n = 3000  # more than notices.KEYS_MAX: announced as a generation, not as keys
    assert n > notices.KEYS_MAX
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(n), event_time=time.time() - 3600)
    env = {**LONG_TTL, "FEATURE_SERVING_REFRESH_RATE": "2000"}
    with (
        ServingProcess(redis_url, env=env, grpc=False) as a,
        ServingProcess(redis_url, env=env, grpc=False) as b,
        FeatureClient(a.rest_url, timeout=10) as ca,
        FeatureClient(b.rest_url, timeout=10) as cb,
    ):
        ids = list(range(n))
        for client in (ca, cb):
            for start in range(0, n, 1000):
                client.get(ENTITY, ids[start : start + 1000], features=["int_0"])
        # the entries the fronts loaded themselves (the first lookup of a form is Python's)
        own = [_summary(server)["front_entries"] for server in (a, b)]
        assert all(isinstance(held, int) and held > 0 for held in own), own
        new = {i: {"int_0": -i - 1} for i in ids}
        with FeatureStore.connect(redis_url, REGISTRY) as store:
            store.write(GROUP, list(new.items()))  # the nightly refresh of every entity
        for client in (ca, cb):
            _until(
                lambda c=client: _int0(c, [0, n // 2, n - 1]) == [-1, -(n // 2) - 1, -n],
                "the hot entries to be refreshed",
            )
        for server, client in ((a, ca), (b, cb)):  # every other entry: the background sweep
            # generation_refreshes counts refreshes as they are sent: the last batch may
            # still be in flight when it reaches n, and an entry being refreshed is served
            # from the cache meanwhile (by design). keys_loaded counts reads that came back:
            # every entry read once at first, then once more by its refresh
            _until(lambda s=server: _counter(s, "keys_loaded") >= 2 * n, "the sweep's end")
            assert _counter(server, "generation_refreshes") == n
            for start in range(0, n, 1000):
                chunk = ids[start : start + 1000]
                assert _int0(client, chunk) == [new[i]["int_0"] for i in chunk]
        for server, held in zip((a, b), own, strict=True):
            generations = _summary(server)["generations"]
            assert isinstance(generations, dict)
            assert list(generations) == [GROUP]
            # nothing was dropped: the refresh went through the background, no new misses
            assert _counter(server, "misses") == n
            # the fronts read their own entries again themselves: none was handed to Python
            assert _summary(server)["front_entries"] == held


def test_a_small_library_write_invalidates_its_keys(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(10))
    with (
        ServingProcess(redis_url, env=LONG_TTL, grpc=False) as server,
        FeatureClient(server.rest_url) as client,
    ):
        assert _int0(client, [3]) == [sample.features(3)["int_0"]]
        with FeatureStore.connect(redis_url, REGISTRY) as store:
            store.write(GROUP, [(3, {"int_0": 31337})])
        _until(lambda: _int0(client, [3]) == [31337], "the written key to be served")
        assert _counter(server, "invalidations") == 1


def test_a_writer_that_cannot_publish_still_writes(redis_url: str) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.client.execute_command("ACL", "SETUSER", "writer", "on", ">writer-pw", "~*")
        store.client.execute_command("ACL", "SETUSER", "writer", "+@all", "-publish")
    url = redis_url.replace("redis://", "redis://writer:writer-pw@")
    try:
        with FeatureStore.connect(url, REGISTRY) as store:
            stats = store.write(GROUP, sample.rows(3))  # PUBLISH is refused: logged only
        assert stats.entities == 3
        with FeatureStore.connect(redis_url, REGISTRY) as store:
            assert store.read(ENTITY, [2], groups=[GROUP]).rows[0].values[0] is not None
    finally:
        redis.Redis.from_url(redis_url).execute_command("ACL", "DELUSER", "writer")


# --- shadow mode -------------------------------------------------------------------------


def test_shadow_checks_count_exactly_the_stale_entries(redis_url: str) -> None:
    n, stale = 50, [3, 8, 13, 21, 34, 40, 49]
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(n))
    env = {
        **LONG_TTL,
        "FEATURE_SERVING_SHADOW_FRACTION": "1",
        "FEATURE_SERVING_SHADOW_MAX_PER_SECOND": "0",  # no bound
        "FEATURE_SERVING_XFETCH_BETA": "0",
        # a front whose read outlasts its timeout hands the lookup to Python, which then
        # holds the entries: on a busy machine the learnt 0.1 s floor is too short for that
        "FEATURE_SERVING_REDIS_TIMEOUT_MIN": "5",
        "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "5",
    }
    with (
        ServingProcess(redis_url, env=env, grpc=False) as server,
        FeatureClient(server.rest_url) as client,
    ):
        ids = list(range(n))
        client.get(ENTITY, [n], features=["int_0"])  # the form, learned from Python's answer
        # the front's own connections are opened after start (every drain tries): until
        # then its misses go to Python, as they did on a busy machine
        deadline = time.monotonic() + 10
        while metric(server, "feature_serving_front_redis_connections") < 1:
            assert time.monotonic() < deadline, "the front opened no connection of its own"
            time.sleep(0.05)
        client.get(ENTITY, ids, features=["int_0"])  # misses: loaded by the front
        assert _summary(server)["front_entries"] == n
        with FeatureStore.connect(redis_url, REGISTRY, notify=False) as store:
            store.write(GROUP, [(i, {"int_0": -5}) for i in stale])  # unannounced
        client.get(ENTITY, ids, features=["int_0"])  # hits, each checked against Redis
        _until(lambda: _counter(server, "shadow_checks") == n, "the shadow checks")
        summary = _summary(server)
        assert summary["shadow"] == {
            "fraction": 1.0,
            "checks": n,
            "mismatches": len(stale),
            "mismatch_rate": len(stale) / n,
        }
        metrics = httpx.get(f"{server.rest_url}/metrics").text
        assert f"feature_serving_shadow_mismatch_age_seconds_count {len(stale)}.0" in metrics
        # the entries the front loaded stay its own: a check looks at them where they are
        assert _summary(server)["front_entries"] == n
        # an entry is checked once per load: hits on the same entries again draw none of
        # them (the front marks each entry it drew), and read nothing
        reads = _entity_reads(redis_url)
        client.get(ENTITY, ids, features=["int_0"])
        time.sleep(0.5)  # what the front drew reaches Python within 0.02 s
        assert _counter(server, "shadow_checks") == n
        assert _counter(server, "shadow_skipped") == 0
        assert _entity_reads(redis_url) == reads


def test_shadow_reads_are_bounded_per_second(redis_url: str) -> None:
    """With every hit drawn and every entry new, the checks read stay within the
    worker's rate (0.1 a second by default, a bucket of one): the rest are skipped."""
    n = 200
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(n))
    env = {**LONG_TTL, "FEATURE_SERVING_SHADOW_FRACTION": "1", "FEATURE_SERVING_XFETCH_BETA": "0"}
    with (
        ServingProcess(redis_url, env=env, grpc=False) as server,
        FeatureClient(server.rest_url) as client,
    ):
        ids = list(range(n))
        client.get(ENTITY, ids, features=["int_0"])  # loads
        started = time.monotonic()
        client.get(ENTITY, ids, features=["int_0"])  # n hits, each drawn
        _until(
            lambda: _counter(server, "shadow_checks") + _counter(server, "shadow_skipped") == n,
            "every draw checked or skipped",
        )
        elapsed = time.monotonic() - started
        checks = _counter(server, "shadow_checks")
    assert 1 <= checks <= 1 + 0.1 * elapsed  # a burst of one, then 0.1 a second


# --- warm start --------------------------------------------------------------------------


def test_a_restarted_instance_starts_with_the_hot_set(redis_url: str, tmp_path: Path) -> None:
    n = 300
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(n))
    env = {**LONG_TTL, "FEATURE_SERVING_WARM_SNAPSHOT_INTERVAL": "0"}
    ids = list(range(n))
    with (
        ServingProcess(redis_url, env=env, grpc=False) as first,
        FeatureClient(first.rest_url) as client,
    ):
        client.get(ENTITY, ids, groups=[GROUP])
    # the snapshot was saved at stop; a new instance loads it before it serves
    with ServingProcess(redis_url, env=env, grpc=False) as second:
        assert _counter(second, "warm_loaded") == n
        reads = _entity_reads(redis_url)
        with FeatureClient(second.rest_url) as client:
            rows = client.get(ENTITY, ids, groups=[GROUP]).rows
        assert all(s.value == "present" for r in rows for s in r.statuses[:40])
        assert _entity_reads(redis_url) == reads  # every one a hit
        assert _counter(second, "misses") == n  # the warm-up's own loads, nothing since
    budget = {**env, "FEATURE_SERVING_WARM_START_KEYS": "100"}
    with ServingProcess(redis_url, env=budget, grpc=False) as third:
        assert _counter(third, "warm_loaded") == 100


def test_a_snapshot_from_another_registry_is_not_used(redis_url: str, tmp_path: Path) -> None:
    with FeatureStore.connect(redis_url, REGISTRY) as store:
        store.write(GROUP, sample.rows(20))
    env = {**LONG_TTL, "FEATURE_SERVING_WARM_SNAPSHOT_INTERVAL": "0"}
    with (
        ServingProcess(redis_url, env=env, grpc=False) as first,
        FeatureClient(first.rest_url) as client,
    ):
        client.get(ENTITY, list(range(20)), groups=[GROUP])
    changed = tmp_path / "features.yaml"  # the same group with one more feature
    changed.write_text(
        sample.registry_text().replace("      int_0: int\n", "      int_0: int\n      extra: int\n")
    )
    log = tmp_path / "serve.log"
    with ServingProcess(
        redis_url, registry=changed, env=env, grpc=False, log_path=log, args=["--log-level", "info"]
    ) as second:
        assert _counter(second, "warm_loaded") == 0
        with FeatureClient(second.rest_url) as client:
            assert _int0(client, [1]) == [sample.features(1)["int_0"]]
    text = log.read_text()
    assert f"the snapshot of group {GROUP} comes from a registry where the group differs" in text
