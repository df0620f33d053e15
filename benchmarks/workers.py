"""`serve --workers 2` against one worker, each given the same CPU per worker: does the
server scale with the CPU it is given?

    python3 benchmarks/workers.py [--share 0.4] [--rounds 3] [--seconds 12] [--out FILE]

On a machine with two cores the load generator needs one of them, so two workers on two
whole cores cannot be measured against one worker on one. Instead the server (its parent
and every worker) runs in a cgroup with a CPU quota: ``--share`` cores for one worker,
twice that for two. wrk, h2load and Redis run outside it, on what is left. The quota, not
the load generator, is then what bounds the server: the results show how much of the CPU
it was given each server used, and how many quota periods it was throttled in. If the
workers shared a lock, a socket or a pool that serialises them, two would do less than
twice what one does.

Cells (one worker, then two, in each round; the order of the cases is the same each round):
REST hits (L1 on, TTL 2 s, so entries expire and refresh inside each window), REST with the
L1 off (every entity read from Redis), and gRPC hits; batches of 10 of the standard shape's
50 features over 100,000 entities, zipfian, 32 connections (the kernel spreads them over
the workers' SO_REUSEPORT sockets).

Target (issue: a lookup costs what Redis pays for it): 2 workers >= 1.7x one.

Needs a writable cgroup CPU controller: root, or a delegated cgroup (v1 `cpu` or v2 with
`cpu` in `cgroup.subtree_control`).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
import native_hits
from _results import header, save
from cost import cpu_seconds, require_tools
from native_hits import tree_cpu
from rest_front import SLOW
from serving import add_data_dir, ensure_data

CONNECTIONS = 32
CASES = (("rest", "on"), ("rest", "off"), ("grpc", "on"))  # (API, L1)
TARGET = 1.7
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


class CpuQuota:
    """A cgroup whose processes share ``cores`` of CPU time (a CFS quota per ``period_us``).

    cgroup v1's `cpu` controller where it is mounted, else v2's. Processes moved in stay
    until they exit; the group is removed on close (any process left is moved back first).
    """

    def __init__(self, cores: float, period_us: int) -> None:
        name = f"feature-store-bench-{os.getpid()}"
        quota = max(1000, int(cores * period_us))
        if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
            self.parent = CGROUP_V1
            self.path = CGROUP_V1 / name
            writes = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
        elif "cpu" in _read(CGROUP_V2 / "cgroup.subtree_control").split():
            self.parent = CGROUP_V2
            self.path = CGROUP_V2 / name
            writes = {"cpu.max": f"{quota} {period_us}"}
        else:
            raise SystemExit(
                "no writable cgroup CPU controller: run as root, or in a cgroup with the cpu "
                "controller delegated (v1 /sys/fs/cgroup/cpu, or v2 with cpu in "
                "cgroup.subtree_control)"
            )
        try:
            self.path.mkdir()
            for file, value in writes.items():
                (self.path / file).write_text(value)
        except OSError as exc:
            raise SystemExit(f"cannot set a CPU quota at {self.path}: {exc}") from exc

    def add_tree(self, pid: int) -> None:
        """``pid`` and all its descendants (the workers of `serve --workers N`)."""
        for each in _tree(pid):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                (self.path / "cgroup.procs").write_text(str(each))

    def throttled(self) -> int:
        """Quota periods in which the group was throttled, so far."""
        for line in _read(self.path / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
        return 0

    def close(self) -> None:
        for left in _read(self.path / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                (self.parent / "cgroup.procs").write_text(left)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _tree(pid: int) -> list[int]:
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in _read(task / "children").split():
            found += _tree(int(child))
    return found


@contextlib.contextmanager
def quota(cores: float, period_us: int) -> Iterator[CpuQuota]:
    group = CpuQuota(cores, period_us)
    try:
        yield group
    finally:
        group.close()


@dataclass
class Cell(native_hits.Cell):
    """A cell of `native_hits.py`'s kind (hits="front" where the L1 is on), with its round,
    the L1, and the quota the server had."""

    round: int = 0
    l1: str = "on"
    cores: float = 0.0  # the quota
    throttled: int = 0  # quota periods throttled in the window
    periods: int = 0  # quota periods in the window

    @property
    def used(self) -> float:
        """The share of the CPU given that the server used."""
        return self.server_cpu / (self.cores * self.seconds)


def measure(
    redis: EmbeddedRedis,
    rnd: int,
    api: str,
    l1: str,
    workers: int,
    args: argparse.Namespace,
    work: Path,
) -> Cell:
    env = {
        "FEATURE_SERVING_SHADOW_FRACTION": "0",
        "FEATURE_SERVING_WARM_START_KEYS": "0",
    }
    cache = ["--cache-ttl", f"{args.ttl:g}"] if l1 == "on" else ["--no-cache"]
    serve_args = [*cache, "--workers", str(workers)]
    cores = args.share * workers
    assert redis.process is not None
    with (
        quota(cores, args.period_ms * 1000) as group,
        ServingProcess(
            redis.url, args=serve_args, env=env, grpc=api == "grpc", ready_path="/readyz"
        ) as server,
    ):
        assert server.process is not None
        group.add_tree(server.process.pid)

        load = native_hits.loader(server, api, work, args.entities)
        load(3.0, CONNECTIONS, 1)  # warm-up: connections, the L1's first loads, the forms learned
        s0, r0, n0 = tree_cpu(server.process.pid), cpu_seconds(redis.process.pid), group.throttled()
        t0 = time.monotonic()
        got = load(args.seconds, CONNECTIONS, 1)
        elapsed = time.monotonic() - t0
        cell = Cell(
            api,
            "front" if l1 == "on" else "none",
            workers,
            CONNECTIONS,
            1,
            int(got["requests"]),
            elapsed,
            got["p50"],
            got["p99"],
            got["max"],
            int(got["slow"]),
            int(got["errors"]),
            tree_cpu(server.process.pid) - s0,
            cpu_seconds(redis.process.pid) - r0,
            round=rnd,
            l1=l1,
            cores=cores,
            throttled=group.throttled() - n0,
            periods=int(elapsed * 1000 / args.period_ms),
        )
    print(
        f"round {rnd} {api:4} L1 {l1:3} workers {workers} ({cores:.2f} cores) "
        f"{cell.rate:9,.0f} req/s  p50 {cell.p50_ms:6.2f} ms  p99 {cell.p99_ms:7.2f} ms  "
        f"max {cell.max_ms:7.1f} ms  past {SLOW:g} s {cell.slow}  server {cell.server_us:5.1f} "
        f"us/entity ({cell.used:.0%} of its quota, throttled in {cell.throttled:,} of "
        f"{cell.periods:,} periods)  Redis {cell.redis_us:4.1f}  errors {cell.errors}",
        flush=True,
    )
    return cell


def ratios(cells: list[Cell], api: str, l1: str) -> list[float]:
    out = []
    for rnd in sorted({c.round for c in cells}):
        one, two = (
            next(c for c in cells if (c.round, c.api, c.l1, c.workers) == (rnd, api, l1, workers))
            for workers in (1, 2)
        )
        out.append(two.rate / one.rate)
    return out


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    labels = [f"{api.upper()}, L1 {l1}" for api, l1 in CASES]
    for offset, workers in ((-0.2, 1), (0.2, 2)):
        rates = [
            statistics.median(
                c.rate for c in cells if (c.api, c.l1, c.workers) == (api, l1, workers)
            )
            for api, l1 in CASES
        ]
        cores = next(c.cores for c in cells if c.workers == workers)
        bars = ax.bar(
            [x + offset for x in range(len(CASES))],
            rates,
            width=0.4,
            label=f"{workers} worker{'s' if workers > 1 else ''}, {cores:.2f} cores",
        )
        if workers == 2:
            for bar, (api, l1) in zip(bars, CASES, strict=True):
                ratio = statistics.median(ratios(cells, api, l1))
                ax.annotate(
                    f"{ratio:.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
    ax.set_xticks(range(len(CASES)), labels)
    ax.set_ylabel("requests/s (batches of 10), median")
    ax.set_title("--workers 2 against one, each worker given the same CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, default=2.0, help="the L1's TTL (seconds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--share", type=float, default=0.4, help="cores of CPU time given per worker"
    )
    parser.add_argument("--period-ms", type=int, default=10, help="the CFS quota's period")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    with quota(args.share, args.period_ms * 1000):
        pass  # fail early, before the data loads, where quotas cannot be set
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        for rnd in range(1, args.rounds + 1):
            for api, l1 in CASES:
                for workers in (1, 2):
                    cells.append(measure(redis, rnd, api, l1, workers, args, Path(tmp)))
    lines = [
        *header(
            f"Each server in a cgroup with a CPU quota of {args.share:g} cores per worker "
            f"(CFS period {args.period_ms} ms); wrk, h2load and Redis outside it. Batches of "
            f"{native_hits.BATCH}, all 50 features of the standard shape, "
            f"{args.entities:,} entities "
            f"(REST: 1,000 zipfian batches; gRPC: one batch), {CONNECTIONS} connections, "
            f"{args.seconds:g} s per cell, L1 TTL {args.ttl:g} s where on; one worker then two "
            f"in each of {args.rounds} rounds."
        ),
        "",
        "## 2 workers against one",
        "",
        "| API | L1 | 2 workers / 1 (median) | each round | target |",
        "|---|---|---:|---|---|",
    ]
    for api, l1 in CASES:
        each = ratios(cells, api, l1)
        median = statistics.median(each)
        lines.append(
            f"| {api} | {l1} | {median:.2f}x | {', '.join(f'{r:.2f}x' for r in each)} | "
            f">= {TARGET}x: {'met' if median >= TARGET else '**not met**'} |"
        )
    lines += [
        "",
        "## Every cell",
        "",
        "Used: the server's CPU over the window against its quota. Throttled: CFS periods in "
        "which the server had spent its quota and waited.",
        "",
        "| round | API | L1 | workers | cores given | req/s | p50 ms | p99 ms | max ms "
        f"| past {SLOW:g} s | errors | server µs/entity | used | throttled | Redis µs/entity |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.round} | {c.api} | {c.l1} | {c.workers} | {c.cores:.2f} | {c.rate:,.0f} | "
            f"{c.p50_ms:.2f} | {c.p99_ms:.2f} | {c.max_ms:,.1f} | {c.slow} | {c.errors} | "
            f"{c.server_us:.1f} | {c.used:.0%} | {c.throttled:,} of {c.periods:,} | "
            f"{c.redis_us:.1f} |"
        )
    save(args.out, "Workers: scaling with the CPU given", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
