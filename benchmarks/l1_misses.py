"""What the L1 costs at every hit rate: server CPU per entity with the L1 on, against the L1
off (the fronts' planned reads), measured in the same run.

    python3 benchmarks/l1_misses.py [--seconds 8] [--rounds 3] [--cluster] [--out FILE]

One `feature-store serve` worker at a time on one embedded Redis holding 100,000 entities
of the standard shape; batches of 10 ids x all 50 features, ids drawn at random from a
working set of 20,000. Both loads are compiled, so they leave the cores to the server:
REST's is ``wrk`` (a Lua script draws one of 4,000 bodies at random for each request),
gRPC's ``feature-load`` (``clients/go/cmd/feature-load``, built here with ``go build``: the
same 4,000 batches drawn at random, on as many connections; h2load sends one body only,
whose ids would always hit). CPU is read from /proc/<pid>/stat of the server and of
redis-server over the measured window.

Cells, for each API:

- ``off``: the L1 off, the baseline;
- ``miss``: the L1 on with a TTL of 1 ms: every lookup a miss, loaded by the front itself;
  each entity's entry expired and read again, its values unchanged (between a group's
  writes, every reload), so the entry is kept as it is;
- ``miss, cold``: a TTL of 2 s and the cache bounded to 100 entries: nearly every lookup a
  miss of an entity with no entry (evicted), so every load makes, stores and evicts
  entries (a cold start, a working set far past the cache, or values changed since the
  last load);
- ``miss, Python loads``: the same with ``NATIVE_LOADS=off`` (misses loaded through
  Python's policy and copied to the fronts: the path before);
- ``bounded N``: a TTL of 2 s (several inside each window: the steady state, with expiry)
  and the cache bounded to N entries of the 20,000, so that part of the lookups miss;
- ``hot``: a TTL of 2 s, ids from a working set of 1,000: nearly every lookup a hit.

The hit rate of each cell is measured (the worker's cache counters over the window), and
a PNG plots CPU per entity against it. ``off`` and ``miss`` also run at 500 connections
(``--many``), REST and gRPC.

The L1 off is measured beside every cell, so that a ratio compares windows seconds apart,
not minutes (this machine is shared, and its speed drifts by 10% over a round): a worker
with the L1 off runs through each block of cells (one API, one count of connections), idle
while a cell is measured, and is measured in a window before and after each cell; the
cell's ratio is against the mean of those two. Each cell's figure is the median of
``--rounds`` rounds (every other round runs the cells in the reverse order), its ratio the
median of the rounds' ratios; its tail (the slowest request, and the count slower than
1 s) is taken over every round.
Targets: every lookup a miss, CPU per entity <= 1.15x the L1 off and req/s >= 0.9x; at no
hit rate more than the L1 off; all hits <= 3 µs per entity.

With ``--cluster``, the same on a 3-master Redis Cluster (the loads route by slot, as the
planned reads do): the cells ``off``, ``miss``, ``miss, cold``, ``bounded 10000`` and
``hot``, REST and gRPC.

A change to the miss path is measured against the code before it in the same run:
``--baseline REV`` checks that revision out (a git worktree, its own native extension) and
runs each cell there too (``CELL, before``), beside the same L1-off worker and right after
the cell; ``--cells NAME ...`` runs those cells only. Each cell is then also compared with
its ``before`` twin round by round (the median of the rounds' ratios of their ratios to the
L1 off), which a drift of the machine's speed between rounds does not move.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar, TypeAlias

import httpx
import orjson

from feature_store import sample
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, PerEntity, header, save, worktree
from cost import cpu_seconds, tail_of, wrk_script
from serving import add_data_dir, ensure_data

ENTITIES = 100_000
WORKING_SET = 20_000
HOT_SET = 1_000
BATCH = 10
BODIES = 4_000
MISS_TARGET, RATE_TARGET, HIT_TARGET = 1.15, 0.9, 3.0
BEFORE = ", before"  # a cell's twin run on --baseline's code
STORES = {
    False: "one embedded Redis",
    True: "a 3-master Redis Cluster (no replicas; Redis CPU: its masters' summed)",
}


@dataclass
class Cell(PerEntity):
    api: str
    name: str
    connections: int
    requests: int
    seconds: float
    errors: int
    server_cpu: float
    redis_cpu: float
    hit_rate: float | None
    max_ms: float  # the slowest request
    past_1s: int  # requests slower than 1 s (wrk's timeouts among them)
    # the L1 off's µs per entity and req/s in the windows just before and after (``paired``)
    off_us: float = 0.0
    off_rate: float = 0.0
    batch: ClassVar[int] = BATCH  # entities per request

    @property
    def ratio(self) -> float:
        """Server CPU per entity against the L1 off measured beside it."""
        return self.server_us / self.off_us if self.off_us else 1.0

    @property
    def rate_ratio(self) -> float:
        return self.rate / self.off_rate if self.off_rate else 1.0


def batches(working_set: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(working_set) for _ in range(BATCH)] for _ in range(BODIES)]


# what a load reports: requests, failed, the slowest (ms), and how many took longer than 1 s
Load = tuple[int, int, float, int]


def rest_load(url: str, script: Path, seconds: float, connections: int) -> Load:
    threads = 2 if connections > 100 else 1
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed = int(bad.group(1)) if bad else 0
    if errors:
        failed += sum(int(g) for g in errors.groups())
    max_ms, past, timeouts = tail_of(out)  # (wrk's timeout is 2 s: those took longer)
    return requests, failed, max_ms, past + timeouts


def build_feature_load(into: Path) -> Path:
    """``feature-load``, the Go client's load generator, built into ``into``."""
    binary = into / "feature-load"
    subprocess.run(
        ["go", "build", "-o", str(binary), "./cmd/feature-load"],
        cwd=ROOT / "clients" / "go",
        check=True,
    )
    return binary


def grpc_load(tool: Path, target: str, batch_file: Path, seconds: float, connections: int) -> Load:
    out = subprocess.run(
        [
            str(tool), "-addr", target, "-entity-type", sample.ENTITY, "-group", sample.GROUP,
            "-batches", str(batch_file), "-c", str(connections), "-d", f"{seconds:g}s",
            "-slow", "1s",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # fmt: skip
    done = orjson.loads(out)
    return int(done["requests"]), int(done["errors"]), float(done["max_ms"]), int(done["slow"])


def counters(server: ServingProcess) -> tuple[float, float]:
    doc = httpx.get(f"{server.rest_url}/v1/admin/cache", timeout=5).json()
    stats = doc["counters"]
    return float(stats.get("hits", 0) + stats.get("negative_hits", 0)), float(
        stats.get("misses", 0)
    )


class Rig:
    """One `feature-store serve` worker with its load, kept running so that it can be measured
    in several windows (the L1 off's between the cells it is compared with)."""

    def __init__(
        self,
        url: str,
        redis: list[EmbeddedRedis],  # its nodes (masters): their CPU is summed
        api: str,
        env: dict[str, str],
        args: list[str],
        ids: list[list[int]],
        connections: int,
        tool: Path,
        work: Path,
        cwd: Path | None = None,  # another checkout's code (--baseline)
    ) -> None:
        self.api, self.connections, self.tool = api, connections, tool
        self.pids = [node.process.pid for node in redis if node.process is not None]
        self.cache = "--no-cache" not in args
        base = {"FEATURE_SERVING_WARM_START_KEYS": "0", **env}
        self.server = ServingProcess(url, args=args, env=base, grpc=api == "grpc", cwd=cwd)
        work.mkdir(parents=True, exist_ok=True)
        self.script = wrk_script(
            work / "post.lua",
            [
                orjson.dumps({"entity_type": sample.ENTITY, "ids": b, "groups": [sample.GROUP]})
                for b in ids
            ],
            at_random=True,
            tail=True,
        )
        self.batch_file = work / "batches.txt"
        self.batch_file.write_text("".join(",".join(map(str, b)) + "\n" for b in ids))

    def __enter__(self) -> Rig:
        self.server.__enter__()
        self.load(2.0)  # the forms learned; the cache in its steady state
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(None, None, None)

    def load(self, window: float) -> Load:
        if self.api == "rest":
            url = f"{self.server.rest_url}/v1/features/get"
            return rest_load(url, self.script, window, self.connections)
        return grpc_load(
            self.tool, self.server.grpc_target, self.batch_file, window, self.connections
        )

    def window(self, name: str, seconds: float) -> Cell:
        process = self.server.process
        assert process is not None
        h0, m0 = counters(self.server) if self.cache else (0.0, 0.0)
        s0, r0 = cpu_seconds(process.pid), sum(cpu_seconds(p) for p in self.pids)
        t0 = time.monotonic()
        requests, errors, max_ms, past = self.load(seconds)
        elapsed = time.monotonic() - t0
        s1, r1 = cpu_seconds(process.pid), sum(cpu_seconds(p) for p in self.pids)
        h1, m1 = counters(self.server) if self.cache else (0.0, 0.0)
        looked = (h1 - h0) + (m1 - m0)
        hit_rate = (h1 - h0) / looked if self.cache and looked else None
        return Cell(
            self.api, name, self.connections, requests, elapsed, errors, s1 - s0, r1 - r0,
            hit_rate, max_ms, past,
        )  # fmt: skip


def paired(off: list[Cell], cell: Cell) -> Cell:
    """``cell`` with the L1 off it is compared with: the mean of the windows of the L1 off
    measured just before and just after it (``off``)."""
    cell.off_us = statistics.fmean(c.server_us for c in off)
    cell.off_rate = statistics.fmean(c.rate for c in off)
    return cell


def before(
    cell: tuple[str, str, dict[str, str], list[str], int],
) -> tuple[str, str, dict[str, str], list[str], int]:
    """``cell``'s twin on --baseline's code."""
    api, name, env, serve_args, conns = cell
    return api, name + BEFORE, env, serve_args, conns


def cells_of(args: argparse.Namespace) -> list[tuple[str, str, dict[str, str], list[str], int]]:
    """(api, name, env, serve's args, connections) of each cell."""
    miss = {"FEATURE_SERVING_CACHE_TTL": "0.001"}
    steady = {"FEATURE_SERVING_CACHE_TTL": "2"}
    out: list[tuple[str, str, dict[str, str], list[str], int]] = []
    # on a cluster: no Python loads, one bound, no many-connection cells
    bounds = [10_000] if args.cluster else args.bounds
    for api in ("rest", "grpc"):
        c = args.connections
        out += [
            (api, "off", {}, ["--no-cache"], c),
            (api, "miss", miss, [], c),
            (api, "miss, cold", {**steady, "FEATURE_SERVING_CACHE_MAX_ENTRIES": "100"}, [], c),
        ]
        if not args.cluster:
            python = {**miss, "FEATURE_SERVING_NATIVE_LOADS": "off"}
            out.append((api, "miss, Python loads", python, [], c))
        for bound in bounds:
            env = {**steady, "FEATURE_SERVING_CACHE_MAX_ENTRIES": str(bound)}
            out.append((api, f"bounded {bound}", env, [], c))
        out.append((api, "hot", steady, [], c))
    if not args.cluster:
        for api in ("rest", "grpc"):
            out += [(api, "off", {}, ["--no-cache"], args.many), (api, "miss", miss, [], args.many)]
    if args.cells:
        out = [c for c in out if c[1] == "off" or c[1] in args.cells]
    if args.baseline:  # each cell's twin on the baseline's code, right after it
        out = [
            twin for cell in out for twin in ([cell] if cell[1] == "off" else [cell, before(cell)])
        ]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--many", type=int, default=500, help="connections of the many cells")
    parser.add_argument(
        "--bounds",
        type=int,
        nargs="*",
        default=[3_000, 7_000, 12_000, 16_000],
        help="cache entries",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a 3-master Redis Cluster (no replicas; its masters' CPU summed), the cells "
        "of misses, one bound and hits",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--cells", nargs="+", metavar="NAME", help="only these cells (and the L1 off beside them)"
    )
    parser.add_argument(
        "--baseline", metavar="REV", help="a git revision whose cells run beside each cell"
    )
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="RESULTS",
        help="only draw the PNG beside a results file this script wrote, from its table",
    )
    add_data_dir(parser)
    args = parser.parse_args()
    if args.replot is not None:
        replot(args.replot)
        return 0
    plan = cells_of(args)
    results: dict[tuple[str, str, int], list[Cell]] = {}
    work_ids = batches(WORKING_SET, 1)
    hot_ids = batches(HOT_SET, 2)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        tool = build_feature_load(Path(tmp))
        tree = None
        if args.baseline:
            tree = stack.enter_context(worktree(args.baseline, Path(tmp) / "before"))
        if args.cluster:
            cluster = stack.enter_context(EmbeddedCluster(Path(tmp) / "cluster"))
            url, nodes = cluster.url, cluster.master_nodes()
            with FeatureStore.connect(url, sample.registry()) as store:
                store.write(sample.GROUP, sample.rows(ENTITIES))
        else:
            one = stack.enter_context(EmbeddedRedis(args.data_dir))
            url, nodes = one.url, [one]
            ensure_data(url, ENTITIES)
        for r in range(args.rounds):
            for (api, conns), off, cells in blocks(plan, reverse=r % 2 == 1):
                rig = partial(Rig, url, nodes, api, ids=work_ids, connections=conns, tool=tool)
                work = Path(tmp) / f"{api}-{conns}"
                offs = results.setdefault((api, "off", conns), [])  # listed first
                with rig(*off, work=work / "off") as beside:
                    before = beside.window("off", args.seconds)
                    note(r, before)
                    done = [before]
                    for i, (name, env, serve_args) in enumerate(cells):
                        cwd = tree if name.endswith(BEFORE) else None
                        hot = name.removesuffix(BEFORE) == "hot"
                        ids = hot_ids if hot else work_ids
                        with rig(env, serve_args, ids=ids, work=work / str(i), cwd=cwd) as server:
                            cell = server.window(name, args.seconds)
                        after = beside.window("off", args.seconds)
                        results.setdefault((api, name, conns), []).append(
                            paired([before, after], cell)
                        )
                        note(r, cell, after)
                        done.append(after)
                        before = after
                offs.extend(done)
    lines = report(results, args)
    save(args.out, "The L1 at every hit rate: CPU per entity against the L1 off", lines)
    if args.out is not None and not args.cells:
        plot(args.out.with_suffix(".png"), results)
    return 0


Serve: TypeAlias = tuple[dict[str, str], list[str]]  # a worker's environment and arguments


def blocks(
    plan: list[tuple[str, str, dict[str, str], list[str], int]], reverse: bool
) -> list[tuple[tuple[str, int], Serve, list[tuple[str, dict[str, str], list[str]]]]]:
    """The plan's cells by API and connections, each block run beside one L1-off worker (its
    ``off`` cell's); the cells in the plan's order, or (``reverse``, every other round) the
    other way, so that a drift of the machine's speed over a round favours no cell."""
    offs: dict[tuple[str, int], Serve] = {}
    cells: dict[tuple[str, int], list[tuple[str, dict[str, str], list[str]]]] = {}
    for api, name, env, serve_args, conns in plan:
        if name == "off":
            offs[(api, conns)] = (env, serve_args)
        else:
            cells.setdefault((api, conns), []).append((name, env, serve_args))
    return [(k, offs[k], v[::-1] if reverse else v) for k, v in cells.items()]


def note(r: int, *cells: Cell) -> None:
    """Print each measured window as it ends."""
    for cell in cells:
        ratio = f", {cell.ratio:.2f}x the L1 off beside it" if cell.off_us else ""
        hit = "-" if cell.hit_rate is None else f"{cell.hit_rate:.2f}"
        print(
            f"round {r + 1} {cell.api} {cell.name} c{cell.connections}: {cell.server_us:.2f} "
            f"µs/entity{ratio}, {cell.rate:,.0f} req/s, hit rate {hit}",
            flush=True,
        )


def median_cell(cells: list[Cell]) -> Cell:
    """The round whose server CPU per entity is the median."""
    ordered = sorted(cells, key=lambda c: c.server_us)
    return ordered[len(ordered) // 2]


def report(results: dict[tuple[str, str, int], list[Cell]], args: argparse.Namespace) -> list[str]:
    lines = header(
        f"One worker; {STORES[args.cluster]} of {ENTITIES:,} standard entities; batches of "
        f"{BATCH} x 50 features, ids at random from {WORKING_SET:,} ({HOT_SET:,} for `hot`); "
        f"{args.seconds:g} s per cell after 2 s of warm-up; each cell measured between two "
        f"windows of an L1-off worker kept running beside it, its ratio against their mean; "
        f"per cell the median of {args.rounds} rounds (µs: the round of median server CPU; "
        f"ratios: the median of the rounds' ratios; paired µs: that ratio x the L1 off's "
        f"median, the cell at the machine's usual speed), every other round in the reverse "
        f"order; REST by wrk, gRPC by feature-load (clients/go), both drawing the same "
        f"batches at random."
        + (f" Cells `..., before`: the same on {args.baseline}." if args.baseline else "")
    )
    lines += [
        "",
        "| api | cell | connections | hit rate | server µs/entity | x L1 off | "
        "paired µs/entity | req/s | x L1 off req/s | Redis µs/entity | errors | max ms | "
        "past 1 s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts: list[str] = []
    for (api, name, conns), cells in results.items():
        cell = median_cell(cells)
        # each round's cell against the L1 off beside it, the median of those ratios
        ratio = statistics.median(c.ratio for c in cells)
        rate = statistics.median(c.rate_ratio for c in cells)
        # the cell at the machine's usual speed: its ratio x the L1 off's median
        steady = ratio * median_cell(results[(api, "off", conns)]).server_us
        hit = "-" if cell.hit_rate is None else f"{cell.hit_rate:.2f}"
        errors = sum(c.errors for c in cells)
        # the tail over every round: the slowest request and the count past 1 s
        slowest, past = max(c.max_ms for c in cells), sum(c.past_1s for c in cells)
        lines.append(
            f"| {api} | {name} | {conns} | {hit} | {cell.server_us:.2f} | {ratio:.2f}x | "
            f"{steady:.2f} | {cell.rate:,.0f} | {rate:.2f}x | {cell.redis_us:.2f} | {errors} | "
            f"{slowest:,.1f} | {past} |"
        )
        if name.endswith(BEFORE):
            continue  # compared with its cell below
        if conns > 100:
            verdicts.append(
                f"- {api}, {name}, c{conns}: slowest request {slowest:,.1f} ms, {past} past 1 s "
                f"in {len(cells)} rounds"
            )
        if name.startswith("miss") and "Python" not in name:
            met = ratio <= MISS_TARGET and rate >= RATE_TARGET
            what = "every lookup a miss" + (", cold" if "cold" in name else "")
            verdicts.append(
                f"- {api}, c{conns}, {what}: {ratio:.2f}x the L1 off's CPU per "
                f"entity, {rate:.2f}x its req/s (targets <= {MISS_TARGET}x, >= {RATE_TARGET}x: "
                f"{'met' if met else 'MISSED'})"
            )
        elif name.startswith("bounded"):
            verdicts.append(
                f"- {api}, {name} (hit rate {hit}): {ratio:.2f}x the L1 off's CPU per entity "
                f"(target <= 1x: {'met' if ratio <= 1 else 'MISSED'})"
            )
        elif name == "hot":
            verdicts.append(
                f"- {api}, hot (hit rate {hit}): {cell.server_us:.2f} µs per entity (target "
                f"<= {HIT_TARGET} µs: {'met' if cell.server_us <= HIT_TARGET else 'MISSED'})"
            )
    spread = [
        f"{api} {name} c{conns}: "
        + ", ".join(f"{c.server_us:.2f}" for c in cells)
        + f" (median {statistics.median(c.server_us for c in cells):.2f})"
        + (
            "; against the L1 off beside it: " + ", ".join(f"{c.ratio:.2f}x" for c in cells)
            if name != "off"
            else ""
        )
        for (api, name, conns), cells in results.items()
    ]
    lines += ["", *verdicts, *against_baseline(results, args)]
    lines += ["", "Each round's server µs/entity:", "", *[f"- {s}" for s in spread]]
    return lines


def against_baseline(
    results: dict[tuple[str, str, int], list[Cell]], args: argparse.Namespace
) -> list[str]:
    """Each cell against its twin on ``--baseline``'s code: per round, the ratio of their
    ratios to the L1 off beside them (both measured within seconds of each other)."""
    lines = []
    for (api, name, conns), cells in results.items():
        twin = results.get((api, name + BEFORE, conns))
        if twin is None:
            continue
        ratios = [c.ratio / b.ratio for c, b in zip(cells, twin, strict=True)]
        lines.append(
            f"- {api}, {name}, c{conns}: {statistics.median(ratios):.2f}x the CPU per entity "
            f"of {args.baseline}'s (rounds: {', '.join(f'{r:.2f}x' for r in ratios)})"
        )
    if not lines:
        return []
    return ["", f"Against {args.baseline} (the cells `..., before`), round by round:", "", *lines]


def plot(path: Path, results: dict[tuple[str, str, int], list[Cell]]) -> None:
    """CPU per entity against the measured hit rate, per API, beside the L1 off's: each
    cell's paired µs (its median ratio against the L1 off beside it, x the L1 off's median),
    the column the report and the planner read."""
    series: dict[str, list[float]] = {}
    for api in ("rest", "grpc"):
        off_cells = next(v for k, v in results.items() if k[:2] == (api, "off"))
        off = median_cell(off_cells).server_us
        points = sorted(
            (c.hit_rate, statistics.median(r.ratio for r in cells) * off)
            for (a, name, conns), cells in results.items()
            if a == api
            and name != "off"
            and "Python" not in name
            and conns < 100
            and not name.endswith(BEFORE)
            for c in [median_cell(cells)]
            if c.hit_rate is not None
        )
        series[f"{api}: L1 on"] = [p[1] for p in points]
        series[f"{api}: L1 off"] = [off] * len(points)
        series[f"{api}: hit rate"] = [p[0] for p in points]
    line_plot_xy(path, series)


def replot(results_file: Path) -> None:
    """``plot`` from a results file's table: its hit rate and paired µs/entity columns."""
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in results_file.read_text().splitlines()
        if line.startswith(("| rest |", "| grpc |"))
    ]
    series: dict[str, list[float]] = {}
    for api in ("rest", "grpc"):
        mine = [r for r in rows if r[0] == api and int(r[2]) < 100]
        off = next(float(r[6]) for r in mine if r[1] == "off")
        points = sorted(
            (float(r[3]), float(r[6]))
            for r in mine
            if r[1] != "off" and "Python" not in r[1] and r[3] != "-"
        )
        series[f"{api}: L1 on"] = [p[1] for p in points]
        series[f"{api}: L1 off"] = [off] * len(points)
        series[f"{api}: hit rate"] = [p[0] for p in points]
    line_plot_xy(results_file.with_suffix(".png"), series)


def line_plot_xy(path: Path, series: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for api, style in (("rest", "o-"), ("grpc", "s-")):
        x = series[f"{api}: hit rate"]
        ax.plot(x, series[f"{api}: L1 on"], style, label=f"{api.upper()}: L1 on")
        ax.plot(x, series[f"{api}: L1 off"], "--", label=f"{api.upper()}: L1 off")
    ax.set_xlabel("hit rate (measured)")
    ax.set_ylabel("server CPU µs per entity (paired with the L1 off)")
    ax.set_title("L1 on against L1 off, one worker, batches of 10 x 50")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
