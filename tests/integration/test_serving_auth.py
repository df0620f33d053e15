"""Optional API keys: read keys read, admin keys also write and bypass; 401 and 403."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from feature_store import sample
from feature_store.client import FeatureClient, GrpcFeatureClient, ServingAuthError
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

READ, ADMIN = "read-key-0123456789", "admin-key-0123456789"
GET = {"entity_type": sample.ENTITY, "ids": [1], "features": ["float_00"]}
WRITE = {"group": sample.GROUP, "rows": [{"id": 1, "values": {"float_00": 1.0}}]}


@pytest.fixture(scope="module")
def server(redis_server: EmbeddedRedis) -> Iterator[ServingProcess]:
    env = {"FEATURE_SERVING_READ_KEYS": READ, "FEATURE_SERVING_ADMIN_KEYS": ADMIN}
    with ServingProcess(redis_server.url, env=env) as s:
        yield s


def call(
    server: ServingProcess, method: str, path: str, key: str | None, body: object = None
) -> httpx.Response:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    return httpx.request(method, server.rest_url + path, json=body, headers=headers, timeout=5)


@pytest.mark.usefixtures("redis_url")
@pytest.mark.parametrize(
    ("method", "path", "body", "key", "status"),
    [
        ("POST", "/v1/features/get", GET, None, 401),
        ("POST", "/v1/features/get", GET, "wrong-key-0123456789", 401),
        ("POST", "/v1/features/get", GET, READ, 200),
        ("POST", "/v1/features/get", GET, ADMIN, 200),
        ("POST", "/v1/features/get", {**GET, "bypass_cache": True}, READ, 403),
        ("POST", "/v1/features/get", {**GET, "bypass_cache": True}, ADMIN, 200),
        ("POST", "/v1/features/write", WRITE, None, 401),
        ("POST", "/v1/features/write", WRITE, READ, 403),
        ("POST", "/v1/features/write", WRITE, ADMIN, 200),
        ("GET", "/v1/registry", None, None, 401),
        ("GET", "/v1/registry", None, READ, 200),
        # the OpenAPI document names every entity type and feature, as the registry does
        ("GET", "/openapi.json", None, None, 401),
        ("GET", "/openapi.json", None, READ, 200),
        ("GET", "/docs", None, None, 404),  # a page that fetches the document without a key
        ("GET", "/docs", None, READ, 404),
        ("GET", "/healthz", None, None, 200),
        ("GET", "/metrics", None, None, 200),
    ],
)
def test_rest_roles(
    server: ServingProcess, method: str, path: str, body: object, key: str | None, status: int
) -> None:
    r = call(server, method, path, key, body)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    if status == 403:
        assert r.json()["error"]["code"] == "forbidden"


@pytest.mark.usefixtures("redis_url")
def test_a_basic_scheme_is_not_a_bearer_key(server: ServingProcess) -> None:
    r = httpx.post(
        server.rest_url + "/v1/features/get",
        json=GET,
        headers={"authorization": f"Basic {READ}"},
        timeout=5,
    )
    assert r.status_code == 401


@pytest.mark.usefixtures("redis_url")
def test_grpc_roles(server: ServingProcess) -> None:
    with GrpcFeatureClient(server.grpc_target, timeout=5) as anonymous:
        with pytest.raises(ServingAuthError) as err:
            anonymous.get(sample.ENTITY, [1], features=["float_00"])
        assert err.value.status == 401
    with GrpcFeatureClient(server.grpc_target, api_key=READ, timeout=5) as reader:
        assert reader.get(sample.ENTITY, [1], features=["float_00"]).rows
        with pytest.raises(ServingAuthError) as err:
            reader.write(sample.GROUP, [(1, {"float_00": 1.0})])
        assert err.value.status == 403
    with GrpcFeatureClient(server.grpc_target, api_key=ADMIN, timeout=5) as admin:
        assert admin.write(sample.GROUP, [(1, {"float_00": 1.0})]).entities == 1
    with (
        FeatureClient(server.rest_url, api_key=READ, timeout=5) as rest,
        pytest.raises(ServingAuthError),
    ):
        rest.write(sample.GROUP, [(1, {"float_00": 1.0})])
