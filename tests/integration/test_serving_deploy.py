"""docker-compose.yml and the Dockerfile match the real commands (Docker cannot run here).

Each service's command goes through the real `feature-store` argument parser, and the
files the compose file mounts or builds from exist.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

from feature_store.cli import build_parser
from feature_store.serving.process import ServingProcess

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def entrypoint(target: str) -> list[str]:
    stage = DOCKERFILE.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
    match = re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.MULTILINE)
    assert match, f"no ENTRYPOINT in stage {target}"
    parsed: list[str] = yaml.safe_load(match.group(1))
    return parsed


@pytest.mark.parametrize("service", ["serving", "ingest"])
def test_service_commands_parse_with_the_real_cli(service: str) -> None:
    spec = COMPOSE["services"][service]
    argv = entrypoint(spec["build"]["target"]) + [str(a) for a in spec["command"]]
    assert argv[0] == "feature-store"
    args = build_parser().parse_args(argv[1:])
    assert args.command == argv[1]
    assert args.redis_url == "redis://redis:6379/0"


def test_redis_runs_with_persistence_and_the_shipped_config() -> None:
    redis = COMPOSE["services"]["redis"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in redis["volumes"]}
    conf = mounts["/usr/local/etc/redis/redis.conf"]
    text = (ROOT / conf).read_text()
    assert re.search(r"^appendonly yes$", text, re.MULTILINE)
    assert "hash-max-listpack-value" in text
    assert "/usr/local/etc/redis/redis.conf" in redis["command"]
    assert "redis-data:/data" in redis["volumes"]
    assert "redis-data" in COMPOSE["volumes"]


def test_the_nightly_job_is_one_shot() -> None:
    ingest = COMPOSE["services"]["ingest"]
    assert ingest["restart"] == "no"
    assert ingest["profiles"] == ["nightly"]  # not started by `docker compose up`


def test_serve_without_a_redis_url_uses_an_embedded_redis(tmp_path: Path) -> None:
    """`feature-store serve` with no URL starts its own redis-server and serves from it."""
    code = (
        "import sys, httpx, time, subprocess\n"
        "from feature_store.embedded import free_port\n"
        "port = free_port()\n"
        "p = subprocess.Popen([sys.executable, '-m', 'feature_store.cli', 'serve', "
        "'--registry', 'sample', '--no-grpc', '--port', str(port), '--data-dir', sys.argv[1]])\n"
        "try:\n"
        "    for _ in range(300):\n"
        "        try:\n"
        "            r = httpx.get(f'http://127.0.0.1:{port}/readyz', timeout=1)\n"
        "            if r.status_code == 200: break\n"
        "        except httpx.TransportError: pass\n"
        "        time.sleep(0.05)\n"
        "    print(r.json()['redis'])\n"
        "finally:\n"
        "    p.terminate(); p.wait(10)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip().endswith("ok"), out.stderr
    assert (tmp_path / "redis" / "redis.conf").exists()
    # SIGTERM stops the embedded Redis too (uvicorn re-raises the signal after shutdown)
    match = re.search(r"embedded Redis at (redis://127\.0\.0\.1:\d+)", out.stdout)
    assert match, out.stdout
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(match.group(1), socket_connect_timeout=1).ping()


def test_serve_with_two_workers_answers_rest_and_grpc(redis_url: str) -> None:
    from feature_store.serving.client import FeatureClient, GrpcFeatureClient

    with ServingProcess(redis_url, args=["--workers", "2"]) as server:
        with FeatureClient(server.rest_url, timeout=10) as rest:
            for _ in range(4):
                assert rest.get("consumer", [1], features=["float_00"]).rows[0].values == [None]
        with GrpcFeatureClient(server.grpc_target, timeout=10) as grpc_client:
            for _ in range(4):
                result = grpc_client.get("consumer", [1], features=["float_00"])
                assert [s.value for s in result.rows[0].statuses] == ["missing"]
