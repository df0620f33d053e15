"""The Go and Java clients (clients/go, clients/java), built and run against a real server.

Each client's command line, ``feature-get``, looks up a batch over gRPC and prints a JSON
line per entity; its values must equal what the REST API answers for the same lookup,
for every feature type, for NaN and infinities, for missing entities and string ids. The
server runs with read keys: the clients send theirs, and without one are refused.

The Go client's load generator, ``feature-load`` (the benchmarks' gRPC load), must count
what the server answered: its calls equal the server's own count of gRPC lookups.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from scrape import metric

from feature_store import EmbeddedRedis, FeatureStore, parse_registry
from feature_store.client import TlsConfig
from feature_store.serving.process import ServingProcess

ROOT = Path(__file__).resolve().parents[2]
KEY = "reader-key-1"
REGISTRY = """
version: 1
entities:
  consumer: {prefix: c, id_type: int, ttl: 7d}
  store: {prefix: s, id_type: string, ttl: 7d}
feature_groups:
  consumer_features:
    entity: consumer
    features:
      avg_order_value: float
      orders_7d: int
      is_active: bool
      favourite_cuisine: string
      rating_precise: double
      cuisine_embedding: embedding(4)
      recent_stores: int_list
      prep_times: {type: float_list, description: "minutes, last 10 orders"}
  store_features:
    entity: store
    features:
      rating: float
      name: string
"""
CONSUMERS = [
    (
        1,
        {
            "avg_order_value": 23.5,
            "orders_7d": 12,
            "is_active": True,
            "favourite_cuisine": 'thai \u00e9"quoted"',
            "rating_precise": 4.123456789012345,
            "cuisine_embedding": [0.1, -0.25, 1e-7, 3.5e12],
            "recent_stores": [5, 900000000000, -3],
            "prep_times": [12.5, 7.25],
        },
    ),
    (
        2,
        {
            "avg_order_value": math.nan,
            "orders_7d": -(2**63),
            "is_active": False,
            "favourite_cuisine": "",
            "rating_precise": math.inf,
            "cuisine_embedding": [math.nan, math.inf, -math.inf, 0.0],
            "recent_stores": [],
            "prep_times": [-math.inf],
        },
    ),
    (3, {"avg_order_value": 0.1, "orders_7d": None, "rating_precise": -0.0}),
]
STORES = [("s-1", {"rating": 4.5, "name": "north"}), ("s-\u00fc", {"rating": 1e-3})]


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed: run ./scripts/setup.sh"
    return found


def _go_build(command: str, into: Path) -> Path:
    """The Go client's ``cmd/<command>``, built into ``into``."""
    binary = into / command
    build = subprocess.run(
        [_tool("go"), "build", "-o", str(binary), f"./cmd/{command}"],
        cwd=ROOT / "clients" / "go",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    return binary


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_go_build("feature-get", tmp_path_factory.mktemp("go")))


@pytest.fixture(scope="module")
def java_client() -> str:
    build = subprocess.run(
        [_tool("mvn"), "-B", "-q", "package"],
        cwd=ROOT / "clients" / "java",
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return str(ROOT / "clients" / "java" / "target" / "feature-get.jar")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, redis_server: object
) -> Iterator[ServingProcess]:
    url = redis_server.url  # type: ignore[attr-defined]
    path = tmp_path_factory.mktemp("clients") / "features.yaml"
    path.write_text(REGISTRY)
    registry = parse_registry(REGISTRY)
    with FeatureStore.connect(url, registry, notify=False) as store:
        store.client.flushall()
        store.write("consumer_features", CONSUMERS)
        store.write("store_features", STORES)
    env = {"FEATURE_SERVING_READ_KEYS": KEY}
    with ServingProcess(url, registry=path, env=env) as served:
        yield served


CLIENTS = ["go", "java"]


def _command(client: str, request: pytest.FixtureRequest) -> list[str]:
    """The client's feature-get, built once per module."""
    if client == "go":
        return [request.getfixturevalue("go_client")]
    return [_tool("java"), "-jar", request.getfixturevalue("java_client")]


def _feature_get(client: str, request: pytest.FixtureRequest, *args: str) -> list[str]:
    run = subprocess.run(
        [*_command(client, request), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def _rest(server: ServingProcess, body: dict[str, object]) -> list[dict[str, object]]:
    answer = httpx.post(
        f"{server.rest_url}/v1/features/get",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    data = orjson.loads(answer.content)
    return [
        {
            "id": r["id"],
            "values": dict(zip(data["features"], r["values"], strict=True)),
            "statuses": dict(zip(data["features"], r["statuses"], strict=True)),
        }
        for r in data["results"]
    ]


# (feature-get's arguments after -addr and -key, the same lookup's REST body)
LOOKUPS = {
    "a group of every type, NaN and infinities, a missing entity": (
        ["-entity-type", "consumer", "-group", "consumer_features", "-ids", "1,2,3,4"],
        {"entity_type": "consumer", "ids": [1, 2, 3, 4], "groups": ["consumer_features"]},
    ),
    "features by name, string ids": (
        [
            *("-entity-type", "store", "-features", "name,store_features:rating"),
            *("-ids", "s-1,s-\u00fc,s-9", "-string-ids"),
        ],
        {"entity_type": "store", "ids": ["s-1", "s-\u00fc", "s-9"], "features": ["name", "rating"]},
    ),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_feature_get_prints_what_rest_answers(
    client: str, lookup: str, server: ServingProcess, request: pytest.FixtureRequest
) -> None:
    args, body = LOOKUPS[lookup]
    lines = _feature_get(client, request, "-addr", server.grpc_target, "-key", KEY, *args)
    expected = _rest(server, body)
    assert [orjson.loads(line) for line in lines] == expected


def test_the_lookups_hold_the_cases_they_name(server: ServingProcess) -> None:
    expected = _rest(
        server, LOOKUPS["a group of every type, NaN and infinities, a missing entity"][1]
    )
    assert expected[1]["values"]["avg_order_value"] == "NaN"
    assert expected[1]["values"]["rating_precise"] == "Infinity"
    assert expected[3]["statuses"]["orders_7d"] == "missing"


@pytest.mark.parametrize("client", CLIENTS)
def test_without_a_key_the_client_is_refused_and_says_why(
    client: str, server: ServingProcess, request: pytest.FixtureRequest
) -> None:
    args = ["-addr", server.grpc_target, "-entity-type", "consumer", "-group", "x", "-ids", "1"]
    run = subprocess.run(
        [*_command(client, request), *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1
    assert "UNAUTHENTICATED" in run.stderr.upper()
    assert not run.stdout


@pytest.mark.parametrize("client", CLIENTS)
def test_a_bad_request_is_named(
    client: str, server: ServingProcess, request: pytest.FixtureRequest
) -> None:
    args = ["-addr", server.grpc_target, "-key", KEY, "-entity-type", "consumer"]
    run = subprocess.run(
        [*_command(client, request), *args, "-features", "no_such_feature", "-ids", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert "no_such_feature" in run.stderr
    assert "INVALID" in run.stderr.upper()


def test_feature_load_counts_what_the_server_answered(
    server: ServingProcess, tmp_path: Path
) -> None:
    binary = _go_build("feature-load", tmp_path)
    batches = tmp_path / "batches.txt"
    batches.write_text("1,2,3\n4\n2,2,9\n")
    answered = 'feature_serving_request_seconds_count{api="grpc",method="get",code="200"}'
    before = metric(server, answered, default=0.0)
    args = ["-addr", server.grpc_target, "-entity-type", "consumer", "-group", "consumer_features"]
    run = subprocess.run(
        [str(binary), *args, "-key", KEY, "-batches", str(batches), "-c", "2", "-d", "1s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    done = orjson.loads(run.stdout)
    assert done["requests"] > 10, done
    assert done["errors"] == 0, done
    assert 0 < done["p50_ms"] <= done["p99_ms"] <= done["max_ms"], done
    deadline = time.monotonic() + 10  # the fronts' counts reach the metrics every 20 ms
    while metric(server, answered, default=0.0) - before < done["requests"]:
        assert time.monotonic() < deadline, "the server counted fewer lookups than were sent"
        time.sleep(0.05)
    assert metric(server, answered) - before == done["requests"]
    # without the key every call fails, and is counted as an error
    refused = subprocess.run(
        [str(binary), *args, "-batches", str(batches), "-c", "1", "-d", "0.3s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 0, refused.stderr
    assert orjson.loads(refused.stdout)["requests"] == 0
    assert orjson.loads(refused.stdout)["errors"] > 0


@pytest.fixture(scope="module")
def tls_server(
    redis_server: EmbeddedRedis, pki: Path, server: ServingProcess
) -> Iterator[ServingProcess]:
    """The same data served with mutual TLS: a client certificate the test CA signed."""
    del server  # its data is this one's
    args = [
        *("--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")),
        *("--tls-client-ca", str(pki / "ca.pem")),
    ]
    path = pki / "features.yaml"
    path.write_text(REGISTRY)
    tls = TlsConfig(
        ca=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key")
    )
    with ServingProcess(redis_server.url, registry=path, args=args, tls=tls) as served:
        yield served


@pytest.mark.parametrize("client", CLIENTS)
def test_mutual_tls_with_a_certificate_and_refused_without(
    client: str, tls_server: ServingProcess, pki: Path, request: pytest.FixtureRequest
) -> None:
    lookup = ["-addr", f"localhost:{tls_server.grpc_port}", "-entity-type", "consumer"]
    lookup += ["-group", "consumer_features", "-ids", "1,4"]
    ca = ["-tls-ca", str(pki / "ca.pem")]
    mine = ["-tls-cert", str(pki / "client.pem"), "-tls-key", str(pki / "client.key")]
    lines = _feature_get(client, request, *lookup, *ca, *mine)
    body = {"entity_type": "consumer", "ids": [1, 4], "groups": ["consumer_features"]}
    assert [orjson.loads(line) for line in lines] == _rest(server_of(request), body)
    for refused in (ca, []):  # no client certificate; plaintext
        run = subprocess.run(
            [*_command(client, request), *lookup, *refused],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 1, run.stdout
        # the handshake fails (grpc-java reads a TLS server's bytes as a broken HTTP/2
        # stream: INTERNAL); nothing is answered
        assert any(code in run.stderr.upper() for code in ("UNAVAILABLE", "INTERNAL")), run.stderr
        assert not run.stdout


def server_of(request: pytest.FixtureRequest) -> ServingProcess:
    """The plaintext server: REST's answers to compare with (its data is the TLS one's)."""
    served: ServingProcess = request.getfixturevalue("server")
    return served
