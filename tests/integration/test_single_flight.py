"""One read per key across everything that loads into the worker's one L1: a native front's
lookup that misses a key Python is loading (a form Python answers, a miss the front handed
over) waits for Python's read instead of making its own (``HitCache.claim``), and a load
of Python's that misses a key a front is loading waits for the front's read
(``PythonLoad.notify``)."""

from __future__ import annotations

import threading

import httpx
import pytest
import redis

from feature_store import sample
from feature_store.native import native_enabled
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

pytestmark = pytest.mark.skipif(not native_enabled(), reason="the extension is off")

GROUP, ENTITY = sample.GROUP, sample.ENTITY
ENV = {
    # Redis is paused below for PAUSE_MS: no read may time out meanwhile
    "FEATURE_SERVING_REDIS_TIMEOUT_MIN": "3",
    "FEATURE_SERVING_REDIS_TIMEOUT_MAX": "3",
    "FEATURE_SERVING_SHADOW_FRACTION": "0",
    "FEATURE_SERVING_WARM_START_KEYS": "0",
    "FEATURE_SERVING_INVALIDATION": "off",
    "FEATURE_SERVING_CACHE_TTL": "60",
}
PAUSE_MS = 800
WHOLE = {"entity_type": ENTITY, "groups": [GROUP]}
ALL = [*sample.FLOATS, *sample.INTS, *sample.INT_LISTS, *sample.EMBEDDINGS]


def _reads(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hgetall"))


def _post(server: ServingProcess, body: dict[str, object], out: list[int]) -> None:
    r = httpx.post(f"{server.rest_url}/v1/features/get", json=body, timeout=10)
    out.append(r.status_code)


def test_a_front_waits_for_pythons_load_of_a_key_instead_of_reading_it_again(
    redis_url: str,
) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    with (
        ServingProcess(redis_url, env=ENV, grpc=False) as server,
        redis.Redis.from_url(redis_url) as client,
    ):
        statuses: list[int] = []
        _post(server, {**WHOLE, "ids": [0]}, statuses)  # Python answers: the front learns it
        _post(server, {**WHOLE, "ids": [0]}, statuses)  # a hit on the front
        client.config_resetstat()
        client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        # a form the front has not learned (the features in another order): Python's
        # handler loads entity 7, and its read waits for Redis
        python = threading.Thread(
            target=_post,
            args=(server, {"entity_type": ENTITY, "features": ALL[::-1], "ids": [7]}, statuses),
        )
        python.start()
        threading.Event().wait(PAUSE_MS / 4000)
        # the learned form, on the front: entity 7 is Python's to load, and the front waits
        front = threading.Thread(target=_post, args=(server, {**WHOLE, "ids": [7]}, statuses))
        front.start()
        python.join(10)
        front.join(10)
        assert statuses == [200] * 4
        assert _reads(client) == 1


def test_pythons_load_waits_for_a_fronts_load_of_a_key_instead_of_reading_it_again(
    redis_url: str,
) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(20))
    with (
        ServingProcess(redis_url, env=ENV, grpc=False) as server,
        redis.Redis.from_url(redis_url) as client,
    ):
        statuses: list[int] = []
        _post(server, {**WHOLE, "ids": [0]}, statuses)  # Python answers: the front learns it
        _post(server, {**WHOLE, "ids": [0]}, statuses)  # a hit on the front
        client.config_resetstat()
        client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        # the learned form, on the front: it loads entity 7, and its read waits for Redis
        front = threading.Thread(target=_post, args=(server, {**WHOLE, "ids": [7]}, statuses))
        front.start()
        threading.Event().wait(PAUSE_MS / 4000)
        # a form the front has not learned: Python's handler misses entity 7, which the
        # front is loading, and waits for that load
        body = {"entity_type": ENTITY, "features": ALL[::-1], "ids": [7]}
        python = threading.Thread(target=_post, args=(server, body, statuses))
        python.start()
        python.join(10)
        front.join(10)
        assert statuses == [200] * 4
        assert _reads(client) == 1
