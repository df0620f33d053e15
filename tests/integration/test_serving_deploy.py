"""docker-compose.yml and the Dockerfile match the real commands (Docker cannot run here).

Each service's command goes through the real `feature-store` argument parser, and the
files the compose file mounts or builds from exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from feature_store import sample
from feature_store.cli import build_parser
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

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
    from feature_store.client import FeatureClient, GrpcFeatureClient

    with ServingProcess(redis_url, args=["--workers", "2"]) as server:
        # started (the harness of tests and benchmarks) once both workers listen
        assert server.grpc_port is not None
        assert (_listeners(server.port), _listeners(server.grpc_port)) == (2, 2)
        with FeatureClient(server.rest_url, timeout=10) as rest:
            for _ in range(4):
                assert rest.get("consumer", [1], features=["float_00"]).rows[0].values == [None]
        with GrpcFeatureClient(server.grpc_target, timeout=10) as grpc_client:
            for _ in range(4):
                result = grpc_client.get("consumer", [1], features=["float_00"])
                assert [s.value for s in result.rows[0].statuses] == ["missing"]


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample of one metric in Prometheus text."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            head, value = line.rsplit(" ", 1)
            out.append((head[len(name) :], float(value)))
    return out


def _total(text: str, name: str) -> float:
    return sum(v for _, v in _samples(text, name))


def test_metrics_of_two_workers_add_up_exactly(redis_url: str) -> None:
    """A scrape of either worker reports the deployment: totals over a known request count."""
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(40))
    with ServingProcess(redis_url, args=["--workers", "2"], ready_path="/readyz") as server:
        n = 40
        for round_ in range(2):  # 40 misses, then the same 40 ids again: hits or misses
            for i in range(n):
                r = httpx.post(  # a new connection each time: the kernel picks a worker
                    f"{server.rest_url}/v1/features/get",
                    json={"entity_type": "consumer", "ids": [i], "features": ["int_0"]},
                )
                assert r.status_code == 200, (round_, r.text)
        deadline = time.monotonic() + 10
        while True:
            text = httpx.get(f"{server.rest_url}/metrics").text
            served = _total(text, "feature_serving_entities_served_total")
            hits = _total(text, "feature_serving_cache_hits_total")
            misses = _total(text, "feature_serving_cache_misses_total")
            if (served == 2 * n and hits + misses == 2 * n) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert served == 2 * n
        assert hits + misses == 2 * n
        assert misses >= n  # the first round missed in every worker
        # sequential requests, one key each: one round trip and one key loaded per miss
        assert _total(text, "feature_serving_cache_round_trips_total") == misses
        assert _total(text, "feature_serving_cache_keys_loaded_total") == misses
        requests = _total(text, "feature_serving_request_seconds_count")
        assert requests == 2 * n
        workers = {labels for labels, _ in _samples(text, "feature_serving_cache_entries")}
        assert len(workers) == 2, workers  # the cache's size per worker, by pid
        assert _total(text, "feature_serving_cache_entries") == misses


def _worker_cpu(parent: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of each worker process of ``parent``, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    out = {}
    for pid in map(int, children):
        if b"spawn_main" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            continue  # multiprocessing's resource tracker, not a worker
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _listeners(port: int) -> int:
    """Listening TCP sockets on ``port`` (one per worker: each binds with SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            count += state == "0A" and int(local.rsplit(":", 1)[1], 16) == port
    return count


def test_two_workers_share_connections_and_cpu_over_rest_and_grpc(redis_url: str) -> None:
    """Per-worker CPU from /proc: both workers serve REST, and both serve gRPC."""
    from feature_store.client import GrpcFeatureClient

    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(sample.GROUP, sample.rows(50))
    args = ["--workers", "2", "--no-cache"]
    with ServingProcess(redis_url, args=args, ready_path="/readyz") as server:
        assert server.process is not None
        assert server.grpc_port is not None
        # ready once both workers answer: a connection made then may reach either
        assert (_listeners(server.port), _listeners(server.grpc_port)) == (2, 2)
        ready = httpx.get(f"{server.rest_url}/readyz", timeout=5).json()
        assert (ready["status"], ready["workers"]) == ("ready", "2 of 2")
        parent = server.process.pid
        body = {"entity_type": "consumer", "ids": list(range(10)), "groups": [sample.GROUP]}
        for api in ("rest", "grpc"):
            before = _worker_cpu(parent)
            assert len(before) == 2
            for _ in range(60):  # a new connection each time: the kernel picks the worker
                if api == "rest":
                    r = httpx.post(f"{server.rest_url}/v1/features/get", json=body)
                    assert r.status_code == 200
                else:
                    with GrpcFeatureClient(server.grpc_target, timeout=10) as client:
                        for _ in range(5):
                            client.get("consumer", list(range(10)), groups=[sample.GROUP])
            after = _worker_cpu(parent)
            used = {pid: after[pid] - before[pid] for pid in before}
            total = sum(used.values())
            assert total > 0, api
            assert all(u >= 0.1 * total for u in used.values()), (api, used)
