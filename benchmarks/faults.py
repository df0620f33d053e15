"""Serving under trouble: a hung Redis, and a feature-list memory attack; against a baseline.

    python3 benchmarks/faults.py [--baseline REV] [--hang 5] [--out FILE]

Both scenarios run against `feature-store serve` (one worker, L1 on, default settings) of
this checkout and, with --baseline, of an older revision checked out into a temporary git
worktree, in the same run:

1. **Redis hangs** (SIGSTOP for --hang seconds) under a closed loop of 8 clients, each
   asking for 10 entities not cached yet (each request needs Redis). Reported: req/s
   before and during the hang, p50 and max latency during it, answers by status, times
   the circuit opened, and how soon after SIGCONT an answer is 200 again.
2. **Feature-list attack**: 40 requests whose `features` list is one valid name repeated
   700,000 times (a 7.7 MB body), each a different length. Reported: the worker's RSS
   (from /proc) before and after, and the answers.

The load generator is Python (httpx) here: what is measured is the server's behaviour,
not its per-request cost (benchmarks/serving.py measures that).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from _results import ROOT, header, save, worktree
from cost import rss

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

ENTITIES = 20_000
CLIENTS = 8
GROUPS = [sample.GROUP]


@dataclass
class Window:
    seconds: float
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def _load(url: str, seconds: float, ids: range) -> Window:
    """A closed loop of CLIENTS threads for ``seconds``; bounded in time, loopback only."""
    window = Window(seconds)
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=url, timeout=10) as http:
            while time.monotonic() < stop:
                body = {"entity_type": sample.ENTITY, "ids": rng.sample(ids, 10), "groups": GROUPS}
                t0 = time.perf_counter()
                try:
                    status = str(http.post("/v1/features/get", json=body).status_code)
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    window.latencies.append(time.perf_counter() - t0)
                    window.statuses[status] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return window


def _circuit_opened(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("feature_serving_circuit_opened_total "):
            return float(line.split()[1])
    return 0.0


def _rss_mb(pid: int) -> float:
    return rss(pid) / 2**20


@dataclass
class Outcome:
    label: str
    healthy: Window
    hung: Window
    opened: float
    recovered_s: float
    rss_before: float
    rss_after: float
    attack: Counter[str]


def measure(label: str, redis: EmbeddedRedis, cwd: Path, hang: float) -> Outcome:
    """Both scenarios against the `feature-store serve` of the checkout at ``cwd``."""
    env = {"PYTHONPATH": str(cwd)}  # its package ahead of the installed one
    assert redis.process is not None
    with ServingProcess(redis.url, env=env, grpc=False, ready_path="/readyz", cwd=cwd) as server:
        healthy = _load(server.rest_url, 3.0, range(ENTITIES))
        os.kill(redis.process.pid, signal.SIGSTOP)
        try:  # other ids than before: misses, every request needs Redis
            hung = _load(server.rest_url, hang, range(ENTITIES, 2 * ENTITIES))
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
        t0 = time.monotonic()
        probe = {"entity_type": sample.ENTITY, "ids": [1], "groups": GROUPS}
        while httpx.post(f"{server.rest_url}/v1/features/get", json=probe).status_code != 200:
            if time.monotonic() - t0 > 30:
                break
            time.sleep(0.05)
        recovered = time.monotonic() - t0
        opened = _circuit_opened(server.rest_url)
    with ServingProcess(redis.url, env=env, grpc=False, cwd=cwd) as server:
        assert server.process is not None
        pid = server.process.pid
        before = _rss_mb(pid)
        attack: Counter[str] = Counter()
        with httpx.Client(base_url=server.rest_url, timeout=60) as http:
            for i in range(40):
                body = orjson.dumps(
                    {
                        "entity_type": sample.ENTITY,
                        "ids": [1],
                        "features": ["float_00"] * (700_000 - i),
                    }
                )
                r = http.post(
                    "/v1/features/get", content=body, headers={"content-type": "application/json"}
                )
                attack[str(r.status_code)] += 1
        after = _rss_mb(pid)
    return Outcome(label, healthy, hung, opened, recovered, before, after, attack)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to measure in the same run")
    parser.add_argument("--hang", type=float, default=5.0, help="seconds Redis is stopped")
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    args = parser.parse_args()
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as redis:
        with FeatureStore.connect(redis.url, sample.registry()) as store:
            store.write(sample.GROUP, sample.rows(2 * ENTITIES))
        outcomes.append(measure("this checkout", redis, ROOT, args.hang))
        if args.baseline:
            with worktree(args.baseline, Path(tmp) / "baseline") as tree:
                outcomes.append(measure(f"baseline {args.baseline}", redis, tree, args.hang))
    lines = [
        *header(
            f"One worker, L1 on, {CLIENTS} closed-loop clients, "
            f"batches of 10 random ids over {ENTITIES:,} entities."
        ),
        "",
        f"Redis stopped (SIGSTOP) for {args.hang:g} s:",
        "",
        "| server | req/s healthy | req/s during the hang | p50 ms (hang) | max ms (hang) "
        "| answers during the hang | circuit opened | recovered after SIGCONT |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for o in outcomes:
        answers = ", ".join(f"{n} x {s}" for s, n in o.hung.statuses.most_common())
        lines.append(
            f"| {o.label} | {o.healthy.rate:,.0f} | {o.hung.rate:,.0f} | "
            f"{o.hung.quantile(0.5):.1f} | {max(o.hung.latencies, default=0) * 1000:.0f} | "
            f"{answers} | {o.opened:.0f} | {o.recovered_s:.2f} s |"
        )
    lines += [
        "",
        "Feature-list attack (40 requests, `features` = one name x ~700,000):",
        "",
        "| server | worker RSS before | after | answers |",
        "|---|---:|---:|---|",
    ]
    for o in outcomes:
        answers = ", ".join(f"{n} x {s}" for s, n in o.attack.most_common())
        lines.append(f"| {o.label} | {o.rss_before:.0f} MB | {o.rss_after:.0f} MB | {answers} |")
    if len(outcomes) == 2:
        new, old = outcomes
        lines += [
            "",
            f"- req/s during the hang: {new.hung.rate / max(old.hung.rate, 1e-9):.1f}x the "
            f"baseline's; max latency {max(new.hung.latencies) / max(old.hung.latencies):.2f}x.",
            f"- RSS growth under the attack: {new.rss_after - new.rss_before:.0f} MB against "
            f"{old.rss_after - old.rss_before:.0f} MB.",
        ]
    save(args.out, "Serving under trouble", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
