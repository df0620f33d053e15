"""One command for the whole YCSB comparison: ``benchmarks/ycsb/run`` (see docs/ycsb.md).

Builds the Maven module, writes the value-size histogram, starts Redis (embedded), a
3-master Redis Cluster, PostgreSQL and the serving API on loopback, then for every row of
the table loads the records (timed) and runs the 100% batch-read and 95/5 workloads at the
same target ops/s and thread count, recording the store's CPU around each run. Writes the
markdown table and the raw YCSB output, and exits non-zero if any operation failed.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

import histogram  # noqa: E402
import report  # noqa: E402
import servers  # noqa: E402
import sweeps  # noqa: E402
import ycsb_output  # noqa: E402
from invoke import WORKLOADS, Measured, PhaseFailed, Settings, build, run_ycsb  # noqa: E402
from row_result import RowResult  # noqa: E402
from rows import POSTGRES_SETTINGS, ROW_NAMES, ROWS, SERVING, RowSpec, registry_text  # noqa: E402

from feature_store.embedded import EmbeddedCluster, EmbeddedRedis, free_port  # noqa: E402
from feature_store.errors import FeatureStoreError  # noqa: E402
from feature_store.registry import parse_registry  # noqa: E402
from feature_store.serving.process import ServingProcess  # noqa: E402

SWEEP = (1, 4, 16, 64, 256)  # client threads (connections) of the unthrottled runs
WARMUP_S = 5  # an unmeasured run of each row before its sweeps
# --quick: about 20 minutes on a 2-core machine (much shorter runs measure the JVM's
# warm-up more than the store)
QUICK: dict[str, object] = {
    "records": 100_000,
    "workloads": "read,c",
    "sweep": "4,32",
    "seconds": 8,
}


def redis_memory(ports: list[int]) -> int:
    """Bytes Redis holds for data and overhead (``used_memory``), summed over ``ports``."""
    return sum(int(redis.Redis(port=p).info("memory")["used_memory"]) for p in ports)


# --- the servers ---------------------------------------------------------------------------


def flush(url_ports: list[int]) -> None:
    for port in url_ports:
        redis.Redis(port=port).flushall()


@contextlib.contextmanager
def started(what: str, enter: Callable[[], object], leave: Callable[[], object]) -> Iterator[None]:
    t0 = time.monotonic()
    enter()
    print(f"{what} started in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        yield
    finally:
        leave()


def run_all(args: argparse.Namespace) -> int:
    rows = [r for r in ROWS if r.name in args.rows]
    results_dir: Path = args.results_dir
    raw_dir = results_dir / args.name  # benchmarks/results/ycsb/ for the full run
    raw_dir.mkdir(parents=True, exist_ok=True)
    for old in raw_dir.iterdir():  # the previous run's files; other runs' directories stay
        if old.is_file() and old.suffix in (".txt", ".hist", ".log"):
            old.unlink()
    work = Path(tempfile.mkdtemp(prefix="ycsb-run-"))
    hist = raw_dir / "fieldlength.hist"
    sizes = histogram.write_histogram(hist, entities=args.histogram_entities)
    print(f"value sizes: {sizes}", flush=True)
    if not args.skip_build:
        build()
    settings = Settings(
        records=args.records,
        operations=args.operations,
        target=args.target,
        threads=args.threads,
        batch_keys=args.batch_keys,
        batch_fields=args.batch_fields,
        histogram=hist,
        timeout_s=args.max_seconds,
        raw_dir=raw_dir,
        seconds=args.seconds if args.sweep else None,
        sweep=args.sweep,
        workloads=args.workloads,
        load_threads=args.load_threads,
        bound_ms=args.bound_ms,
    )
    registry_file = work / "features.yaml"
    registry_file.write_text(registry_text(10))
    parse_registry(registry_file.read_text(), source=str(registry_file))  # fails early if bad

    try:
        return _run_rows(args, rows, settings, work, registry_file, sizes, raw_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_rows(
    args: argparse.Namespace,
    rows: list[RowSpec],
    settings: Settings,
    work: Path,
    registry_file: Path,
    sizes: str,
    raw_dir: Path,
) -> int:
    results: dict[str, RowResult] = {}
    needs = {r.store for r in rows}
    servers.ensure_redis_server()
    with contextlib.ExitStack() as stack:
        single = EmbeddedRedis(work / "redis", port=free_port(), persistence=True)
        stack.enter_context(started("Redis", single.start, single.stop))
        cluster = None
        if "cluster" in needs:
            cluster = EmbeddedCluster(work / "cluster", masters=3)
            stack.enter_context(started("Redis Cluster (3 masters)", cluster.start, cluster.stop))
        pg = None
        if "postgres" in needs:
            pg = servers.Postgres(free_port(), POSTGRES_SETTINGS)
            stack.enter_context(started(pg.version(), pg.start, pg.stop))
        env_info = report.environment(pg.version() if pg else None)

        for spec in rows:
            reads = None if spec.loads else spec.reads
            result = RowResult(spec.name, spec.label, reads=reads)
            results[spec.name] = result
            if not spec.loads and spec.reads not in results:
                result.not_run = (
                    f"it reads the records the {spec.reads} row loads; run that row too"
                )
                continue
            try:
                run_row(spec, settings, result, single, cluster, pg, args, work)
            except (ycsb_output.YCSBRunFailed, servers.ServerError, FeatureStoreError) as e:
                result.error = str(e)
                print(f"[{spec.name}] FAILED: {e}", flush=True)

    table = report.render(args, list(results.values()), settings, sizes, env_info)
    out = args.results_dir / f"{args.name}.md"
    out.write_text(table)
    if settings.sweep:
        sweeps.plot(out.with_suffix(".png"), list(results.values()), settings.workloads)
    print("\n" + table)
    print(f"wrote {out} and the raw YCSB output in {raw_dir}/")
    failed = [r.name for r in results.values() if r.error]
    if failed:
        print(f"FAILED rows: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def run_row(
    spec: RowSpec,
    s: Settings,
    result: RowResult,
    single: EmbeddedRedis,
    cluster: EmbeddedCluster | None,
    pg: servers.Postgres | None,
    args: argparse.Namespace,
    work: Path,
) -> None:
    props: dict[str, str] = {}
    api_pid = None
    ports: list[int] = []  # the Redis nodes a loading row fills: their memory per record
    with contextlib.ExitStack() as stack:
        if spec.store == "postgres":
            assert pg is not None
            props = {"postgres.url": pg.jdbc_url, "postgres.user": servers.Postgres.USER}
            store_pids = [pg.pid]
        elif spec.store == "cluster":
            assert cluster is not None
            ports = [n.port or 0 for n in cluster.nodes]
            store_pids = [n.process.pid for n in cluster.nodes if n.process is not None]
            props = {"redis.port": str(ports[0]), "redis.cluster": "true"}
            if spec.loads:
                flush(ports)
            ports = ports if spec.loads else []
        else:
            assert single.process is not None
            assert single.port is not None
            store_pids = [single.process.pid]
            props = {"redis.port": str(single.port)}
            if spec.loads:
                flush([single.port])
                ports = [single.port]
        if spec.db in SERVING:
            grpc = spec.db == "GrpcServingClient"
            flags = ["--workers", str(args.serving_workers), *spec.serve_flags]
            if "--no-cache" not in flags:
                flags += ["--cache-ttl", f"{args.serving_ttl:g}"]
            assert cluster is not None or spec.store != "cluster"
            serving = ServingProcess(
                cluster.url if cluster is not None and spec.store == "cluster" else single.url,
                registry=work / "features.yaml",
                args=flags,
                grpc=grpc,
                log_path=s.raw_dir / f"{spec.name}.server.log",  # one per row
                ready_path="/readyz",
                start_timeout=60.0,
            )
            stack.enter_context(serving)
            assert serving.process is not None
            api_pid = serving.process.pid
            if grpc:
                props = {"serving.grpc": serving.grpc_target}
            else:
                props = {"serving.url": serving.rest_url}
            api = "" if grpc else "--no-grpc "
            result.notes.append(
                f"`feature-store serve {api}{' '.join(flags)}` on free loopback ports, with "
                "the run's registry (entity ycsb_user, group ycsb of field0..field9: string) and "
                + ("the Redis Cluster" if spec.store == "cluster" else "Redis")
            )
        failures: list[str] = []
        if spec.loads:
            print(f"[{spec.name}] load {s.records:,} records ...", flush=True)
            empty = redis_memory(ports)
            try:
                result.load = run_ycsb(spec, "load", s, props, store_pids, api_pid)
            except PhaseFailed as e:
                # the runs would read records that are not there: stop this row
                raise ycsb_output.YCSBRunFailed(str(e)) from e
            if ports:
                result.memory_per_record = (redis_memory(ports) - empty) / s.records

        def run(column: str, threads: int | None, target: int | None) -> Measured | None:
            at = "" if threads is None else f" at {threads} threads, target {target or 'none'}"
            print(f"[{spec.name}] {WORKLOADS[column]}{at} ...", flush=True)
            try:
                return run_ycsb(spec, column, s, props, store_pids, api_pid, threads, target)
            except PhaseFailed as e:
                # keep what it measured, marked as failed, and still run the other workloads
                print(f"[{spec.name}] FAILED: {e}", flush=True)
                failures.append(str(e))
                return e.measured

        if s.sweep and s.workloads:
            # unmeasured: the JVM's and the servers' warm-up (a serving worker learns its
            # request forms, its L1 fills) out of the first measured run
            first = s.workloads[0]
            print(f"[{spec.name}] warm-up: {WORKLOADS[first]} for {WARMUP_S} s ...", flush=True)
            try:
                run_ycsb(spec, first, s, props, store_pids, api_pid, 4, 0, WARMUP_S, "warmup")
            except PhaseFailed as e:
                failures.append(f"warm-up: {e}")
        for column in s.workloads:
            if s.sweep:
                runs = sweeps.sweep(lambda t, target: run(column, t, target), s.sweep)  # noqa: B023
                result.sweeps[column] = runs
            elif (once := run(column, None, None)) is not None:
                result.runs[column] = once
        if failures:
            result.error = "\n".join(failures)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/ycsb/run",
        description="Build, start the servers, load and run every binding x workload, "
        "and write the table to benchmarks/results/. See docs/ycsb.md.",
    )
    p.add_argument("--records", type=int, default=1_000_000, help="records (entities) to load")
    p.add_argument(
        "--sweep",
        default=",".join(map(str, SWEEP)),
        help="client threads of each workload's unthrottled runs, then runs at "
        + " and ".join(f"{share:.0%}%" for share in sweeps.SHARES)
        + " of the best throughput; 'none': each workload once, at --threads and --target",
    )
    p.add_argument("--seconds", type=int, default=10, help="length of each run of a sweep")
    p.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads, of: {', '.join(WORKLOADS)}",
    )
    p.add_argument(
        "--operations", type=int, default=10_000, help="operations per run, with --sweep none"
    )
    p.add_argument(
        "--target", type=int, default=0, help="target ops/s of each run with --sweep none (0: none)"
    )
    p.add_argument("--threads", type=int, default=4, help="YCSB client threads with --sweep none")
    p.add_argument("--load-threads", type=int, default=16, help="YCSB client threads of the loads")
    p.add_argument("--batch-keys", type=int, default=100, help="keys per batch read (K)")
    p.add_argument("--batch-fields", type=int, default=10, help="fields per key (F)")
    p.add_argument(
        "--rows",
        default=",".join(ROW_NAMES),
        help=f"comma-separated rows to run, of: {', '.join(ROW_NAMES)}",
    )
    p.add_argument("--serving-workers", type=int, default=1, help="workers of feature-store serve")
    p.add_argument(
        "--serving-ttl",
        type=float,
        default=2.0,
        help="the serving rows' L1 TTL in seconds (feature-store serve --cache-ttl): several "
        "TTLs inside each run, so that a run measures the cache's steady state",
    )
    p.add_argument(
        "--bound-ms", type=int, default=50, help="reads slower than this are counted per run"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CI mode: 1,000 records, each workload once: 1,000 operations, 2 threads, no target",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"about 20 minutes: {QUICK['records']:,} records, the workloads "
        f"{QUICK['workloads']}, sweeps of {QUICK['sweep']} threads, runs of "
        f"{QUICK['seconds']} s",
    )
    p.add_argument("--name", help="result name: <results-dir>/<name>.md (default ycsb, ycsb_smoke)")
    p.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--histogram-entities", type=int, default=2000)
    p.add_argument("--max-seconds", type=int, default=900, help="bound of each YCSB run")
    p.add_argument("--skip-build", action="store_true", help="use the classes already built")
    args = p.parse_args(argv)
    if args.smoke and args.quick:
        p.error("--smoke and --quick are two sizes: give one")
    if args.smoke:
        args.records, args.operations, args.threads, args.target = 1000, 1000, 2, 0
        args.sweep, args.load_threads = "none", 2
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    args.name = args.name or (
        "ycsb_smoke" if args.smoke else "ycsb_quick" if args.quick else "ycsb"
    )
    try:
        args.sweep = () if args.sweep == "none" else tuple(int(t) for t in args.sweep.split(","))
    except ValueError:
        p.error(f"--sweep takes thread counts such as 1,4,16,64, or none; not {args.sweep!r}")
    if any(t < 1 for t in args.sweep):
        p.error("--sweep: thread counts are at least 1")
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if bad := sorted(set(args.workloads) - set(WORKLOADS)):
        p.error(f"unknown workload(s) {', '.join(bad)}; known: {', '.join(WORKLOADS)}")
    args.workloads = tuple(w for w in WORKLOADS if w in args.workloads)  # D last: it inserts
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(args.rows) - set(ROW_NAMES))
    if unknown:
        p.error(f"unknown row(s) {', '.join(unknown)}; known: {', '.join(ROW_NAMES)}")
    given = shlex.join(sys.argv[1:] if argv is None else argv)
    args.command = f"benchmarks/ycsb/run {given}".strip()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run_all(args)
    except servers.ServerError as e:
        print(f"benchmarks/ycsb/run: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
