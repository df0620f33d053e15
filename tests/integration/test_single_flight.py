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


# entity 7 through the front (the form it learned) and through Python's handler (a form
# it has not: the features in another order)
ON_THE_FRONT = {**WHOLE, "ids": [7]}
IN_PYTHON = {"entity_type": ENTITY, "features": ALL[::-1], "ids": [7]}


def _reads_of_two_lookups(redis_url: str, first: dict[str, object], then: dict[str, object]) -> int:
    """Redis's reads for ``first`` and ``then`` of entity 7, ``then`` sent while ``first``'s
    read waits for Redis (paused), once the front has learned the whole group's form."""
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
        threads = [
            threading.Thread(target=_post, args=(server, b, statuses)) for b in (first, then)
        ]
        threads[0].start()
        threading.Event().wait(PAUSE_MS / 4000)  # the first's read is sent, and waits
        threads[1].start()
        for thread in threads:
            thread.join(10)
        assert statuses == [200] * 4
        return _reads(client)


def test_a_front_waits_for_pythons_load_of_a_key_instead_of_reading_it_again(
    redis_url: str,
) -> None:
    # Python's handler loads entity 7; the front's lookup of it waits for that read
    assert _reads_of_two_lookups(redis_url, IN_PYTHON, ON_THE_FRONT) == 1


def test_pythons_load_waits_for_a_fronts_load_of_a_key_instead_of_reading_it_again(
    redis_url: str,
) -> None:
    # the front loads entity 7; Python's handler misses it, and waits for the front's read
    assert _reads_of_two_lookups(redis_url, ON_THE_FRONT, IN_PYTHON) == 1
