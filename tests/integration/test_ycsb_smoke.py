"""CI smoke run of the YCSB harness (benchmarks/ycsb/run --smoke): every row of the table at a
small size, with no failed operation; plus the harness's own checks and the hash binding's
layout read back through the project's store client."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import redis

from feature_store.batch import Status
from feature_store.registry import parse_registry
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

REPO = Path(__file__).resolve().parents[2]
YCSB = REPO / "benchmarks" / "ycsb"
SMOKE_RECORDS = SMOKE_OPERATIONS = 1000  # what --smoke runs


def _module(name: str) -> ModuleType:
    """A module of benchmarks/ycsb, which is a directory of scripts, not a package."""
    if str(YCSB) not in sys.path:
        sys.path.insert(0, str(YCSB))
    spec = importlib.util.spec_from_file_location(name, YCSB / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ycsb_output = _module("ycsb_output")
histogram = _module("histogram")
rows = _module("rows")
invoke = _module("invoke")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Runs the whole harness once in smoke mode; yields (results dir, its output)."""
    results = tmp_path_factory.mktemp("ycsb-results")
    # as from a root shell whose PATH lacks the sbin directories (runuser, useradd live there)
    path = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not d.rstrip("/").endswith("sbin")
    )
    done = subprocess.run(
        [str(YCSB / "run"), "--smoke", "--results-dir", str(results)],
        capture_output=True,
        text=True,
        timeout=840,
        env={**os.environ, "PATH": path},
    )
    output = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, f"benchmarks/ycsb/run --smoke failed:\n{output[-6000:]}"
    return results, output


def _raw(results: Path, row: str, phase: str, name: str = "ycsb_smoke") -> tuple[str, str]:
    text = (results / name / f"{row}.{phase}.txt").read_text()
    stdout, _, stderr = text.partition("# ---- stderr ----")
    return stdout, stderr


@pytest.mark.timeout(900)
@pytest.mark.parametrize("row", rows.ROW_NAMES)
def test_smoke_row_has_no_failed_operations(smoke: tuple[Path, str], row: str) -> None:
    results, _ = smoke
    spec = next(r for r in rows.ROWS if r.name == row)
    phases = (["load"] if spec.loads else []) + list(invoke.WORKLOADS)
    for phase in phases:
        stdout, stderr = _raw(results, row, phase)
        expected = SMOKE_RECORDS if phase == "load" else SMOKE_OPERATIONS
        out = ycsb_output.check(stdout, expected, stderr)  # raises on any failed operation
        if phase == "read":
            assert out.count("BATCH_READ") == SMOKE_OPERATIONS
        if phase == "mix":
            assert out.count("BATCH_READ") + out.count("UPDATE") == SMOKE_OPERATIONS
            assert out.count("UPDATE") > 0
        if phase in ("a", "b", "c", "d", "f"):  # single records, every read of all 10 fields
            assert out.count("READ") > 0
            assert "BATCH_READ" not in out.operations
        writes = {"a": "UPDATE", "b": "UPDATE", "d": "INSERT", "f": "READ-MODIFY-WRITE"}
        if phase in writes:
            assert out.operations[writes[phase]].metrics["Operations"] > 0
    table = (results / "ycsb_smoke.md").read_text()
    assert spec.label in table


@pytest.mark.timeout(900)
def test_smoke_table_has_every_row(smoke: tuple[Path, str]) -> None:
    results, output = smoke
    table = (results / "ycsb_smoke.md").read_text()
    assert "FAILED" not in table, output[-4000:]
    for spec in rows.ROWS:
        assert f"| {spec.label} |" in table


@pytest.mark.timeout(600)
def test_a_sweep_runs_unthrottled_then_at_fixed_rates(
    smoke: tuple[Path, str], tmp_path: Path
) -> None:
    """The sweep (the default and --quick profiles), at its smallest: one row, one workload,
    two thread counts, then 50% and 90% of the better one's throughput."""
    done = subprocess.run(
        [
            str(YCSB / "run"), "--skip-build", "--rows", "hash", "--workloads", "c",
            "--sweep", "1,2", "--seconds", "2", "--records", "500", "--results-dir",
            str(tmp_path), "--name", "sweep",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    raw = tmp_path / "sweep"
    runs = {p.name[len("hash.c.") : -len(".txt")] for p in raw.glob("hash.c.*.txt")}
    assert {"warmup", "t1", "t2"} <= runs
    measured = {
        r: ycsb_output.check(_raw(tmp_path, "hash", f"c.{r}", "sweep")[0], None)
        for r in ("t1", "t2")
    }
    top = max(measured, key=lambda r: measured[r].throughput)
    targets = sorted(int(r.split(".r")[1]) for r in runs if ".r" in r)
    best = measured[top].throughput
    assert targets == [max(1, round(best * 0.5)), max(1, round(best * 0.9))]
    assert all(r.startswith(f"{top}.r") for r in runs if ".r" in r)  # at the best's threads
    table = (tmp_path / "sweep.md").read_text()
    assert f"| Redis, hash per entity (project layout) | c | {best:,.0f} (" in table
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "| reads past 50 ms at best / at 90% |" in table


def test_latency_tail_counts_the_reads_past_the_bound(
    smoke: tuple[Path, str], tmp_path: Path
) -> None:
    """With a bound of 0 ms every read is past it: LatencyTail's count, read from the
    HdrHistogram log YCSB wrote, is YCSB's own count of reads."""
    done = subprocess.run(
        [
            str(YCSB / "run"), "--skip-build", "--rows", "hash", "--workloads", "c",
            "--sweep", "none", "--operations", "300", "--records", "200", "--threads", "2",
            "--bound-ms", "0", "--results-dir", str(tmp_path), "--name", "tail",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = ycsb_output.parse(_raw(tmp_path, "hash", "c", "tail")[0])
    read = out.operations["READ"]
    assert read.metrics["Bound(us)"] == 0
    assert read.metrics["PastBound(ops)"] == read.metrics["Operations"] == 300


GOOD = """\
[OVERALL], RunTime(ms), 900
[OVERALL], Throughput(ops/sec), 1111.1
[BATCH_READ], Operations, 95
[BATCH_READ], AverageLatency(us), 1325.65
[BATCH_READ], Return=OK, 95
[UPDATE], Return=OK, 5
"""


def test_admin_tools_are_found_off_path(monkeypatch: pytest.MonkeyPatch) -> None:
    servers = _module("servers")
    monkeypatch.setenv("PATH", "/nonexistent")
    found = servers.system_tool("runuser", "util-linux")
    assert found in {f"{d}/runuser" for d in servers.SYSTEM_DIRS}
    with pytest.raises(servers.ServerError, match="apt-get install -y no-such-package"):
        servers.system_tool("no-such-tool", "no-such-package")


RMW = """\
[OVERALL], RunTime(ms), 900
[READ], Operations, 100
[READ], Return=OK, 100
[READ-MODIFY-WRITE], Operations, 48
[READ-MODIFY-WRITE], 99thPercentileLatency(us), 3479
[CLEANUP], Operations, 2
[UPDATE], Operations, 48
[UPDATE], Return=OK, 48
"""


def test_a_read_modify_write_is_one_operation() -> None:
    """YCSB returns an RMW's read and update under READ and UPDATE: 100 operations, not 148."""
    assert ycsb_output.check(RMW, 100).done == 100
    with pytest.raises(ycsb_output.YCSBRunFailed, match="148 operations returned"):
        ycsb_output.check(RMW.replace("[READ-MODIFY-WRITE], Operations, 48\n", ""), 100)


def test_a_run_bounded_by_time_needs_some_operations() -> None:
    assert ycsb_output.check(GOOD, None).done == 100
    empty = "[OVERALL], RunTime(ms), 900\n[OVERALL], Throughput(ops/sec), 0\n"
    with pytest.raises(ycsb_output.YCSBRunFailed, match="no operation returned"):
        ycsb_output.check(empty, None)


def _run(threads: int, target: int, throughput: float) -> object:
    out = ycsb_output.parse(
        f"[OVERALL], RunTime(ms), 1000\n[OVERALL], Throughput(ops/sec), {throughput}\n"
        "[READ], Return=OK, 10\n"
    )
    return invoke.Measured(out, 0.0, None, 1.0, threads, target)


def test_sweep_runs_at_shares_of_the_best_unthrottled_run() -> None:
    sweeps = _module("sweeps")
    throughputs = {1: 1000.0, 4: 3000.0, 16: 4001.0, 64: 3500.0}
    asked: list[tuple[int, int]] = []

    def run(threads: int, target: int) -> object:
        asked.append((threads, target))
        if threads == 64 and target == 0:
            return None  # failed without a figure: left out
        got = throughputs[threads] if target == 0 else target * 0.99
        return _run(threads, target, got)

    runs = sweeps.sweep(run, (1, 4, 16, 64))
    # unthrottled at each count, then 50% and 90% of the best (16 threads, 4,001 ops/s)
    assert asked == [(1, 0), (4, 0), (16, 0), (64, 0), (16, 2000), (16, 3601)]
    assert len(runs) == 5
    assert sweeps.best(runs).threads == 16
    assert sweeps.fixed(runs, 0.5).target == 2000
    assert sweeps.fixed(runs, 0.9).target == 3601
    assert sweeps.sweep(lambda t, target: None, (1, 4)) == []


def _cpu_run(throughput: float, store_s: float, api_s: float | None) -> object:
    out = ycsb_output.parse(
        f"[OVERALL], RunTime(ms), 1000\n[OVERALL], Throughput(ops/sec), {throughput}\n"
        "[READ], Return=OK, 1000\n"
    )
    return invoke.Measured(out, store_s, api_s, 1.0, 4, 0)


def test_sweep_ratios_compare_the_rows_best_runs() -> None:
    """flat against hash by the store's CPU per operation; the serving row against the row
    whose records it reads (API and store CPU together) and against its --no-cache twin."""
    sweeps, row_result = _module("sweeps"), _module("row_result")

    def row(name: str, reads: str | None, *runs: object) -> object:
        r = row_result.RowResult(name, name, reads=reads)
        r.sweeps["c"] = list(runs)
        return r

    rows = [
        row("hash", None, _cpu_run(2000.0, 0.010, None), _cpu_run(1000.0, 0.009, None)),
        row("flat", None, _cpu_run(1000.0, 0.020, None)),
        row("serving", "hash", _cpu_run(500.0, 0.001, 0.030)),
        row("serving-nocache", "hash", _cpu_run(400.0, 0.010, 0.040)),
    ]
    lines = sweeps.ratios(rows, ["c"])
    # per op: hash 10 µs store at its best (2,000 ops/s); flat 20 µs
    assert "- `c`, flat / hash: store CPU per op x2.00, best ops/s x0.50" in lines
    # serving: 1 µs store + 30 µs API against hash's 10 µs store
    assert (
        "- `c`, serving / hash: store CPU per op x0.10, API + store CPU per op x3.10, "
        "best ops/s x0.25" in lines
    )
    assert (
        "- `c`, serving / serving-nocache: store CPU per op x0.10, API CPU per op x0.75, "
        "best ops/s x1.25" in lines
    )
    assert not any("hash / flat" in line for line in lines)


def test_a_row_is_flagged_only_in_the_workloads_whose_runs_failed() -> None:
    """A failure is ``<workload>.<phase>: why`` and then its stderr; another workload's
    letter inside that text (a "c" in YCSB's banner) flags nothing."""
    sweeps = _module("sweeps")
    error = (
        "a.t64: [UPDATE] Return=ERROR, 4\nstderr ends with:\n"
        "DBWrapper: report latency for each error is false and specific error codes\n"
        "f.t16.r825: [UPDATE] Return=ERROR, 1"
    )
    assert sweeps.failed_in(error, "a")
    assert sweeps.failed_in(error, "f")
    assert not sweeps.failed_in(error, "c")
    assert not sweeps.failed_in(error, "read")
    assert not sweeps.failed_in(None, "a")


def test_check_accepts_a_clean_run() -> None:
    out = ycsb_output.check(GOOD, 100)
    assert out.count("BATCH_READ") == 95
    assert out.operations["BATCH_READ"].ms("AverageLatency(us)") == pytest.approx(1.32565)


@pytest.mark.parametrize(
    ("text", "expected", "message"),
    [
        (GOOD.replace("[UPDATE], Return=OK, 5", "[UPDATE], Return=ERROR, 5"), 100, "ERROR"),
        (GOOD + "[BATCH_READ], Return=NOT_FOUND, 1\n", 101, "NOT_FOUND"),
        (GOOD + "[BATCH_READ-FAILED], AverageLatency(us), 5\n", 100, "FAILED"),
        (GOOD, 1000, "1000 were asked for"),  # threads that died in init() run nothing
        ("", 100, "did not finish"),
    ],
)
def test_check_rejects_failed_or_missing_operations(text: str, expected: int, message: str) -> None:
    with pytest.raises(ycsb_output.YCSBRunFailed, match=message):
        ycsb_output.check(text, expected)


def test_histogram_is_what_ycsb_reads(tmp_path: Path) -> None:
    path = tmp_path / "hist"
    histogram.write_histogram(path, entities=200)
    lines = path.read_text().splitlines()
    assert lines[0] == "BlockSize\t1"
    buckets = [tuple(map(int, line.split("\t"))) for line in lines[1:]]
    assert [b for b, _ in buckets] == list(range(len(buckets)))  # contiguous from 0
    assert buckets[-1][1] == 0  # the folded last bucket is empty
    # YCSB's HistogramGenerator returns (i + 1) bytes for bucket i: the mean it draws is
    # the mean of the real encoded sizes.
    sizes = histogram.encoded_sizes(200, 0)
    real_mean = sum(k * n for k, n in sizes.items()) / sum(sizes.values())
    drawn_mean = sum((b + 1) * n for b, n in buckets) / sum(n for _, n in buckets)
    assert drawn_mean == pytest.approx(real_mean)
    assert buckets[0][1] > 0  # zero floats: "0" is one byte


@pytest.mark.timeout(600)
def test_hash_binding_writes_the_project_layout(redis_url: str, tmp_path: Path) -> None:
    """Records loaded by the Java hash binding read back through the project's store client."""
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    _load({"redis.port": port, "fs.prefix": rows.PREFIX, "fs.group": rows.GROUP}, 50, tmp_path)

    r = redis.Redis.from_url(redis_url)
    keys = sorted(k.decode() for k in r.scan_iter(match=f"{rows.PREFIX}:*"))
    assert len(keys) == 50
    assert all(0 < r.ttl(k) <= 7 * 86400 for k in keys)
    ids = [k.split(":", 1)[1] for k in keys]
    registry = parse_registry(rows.registry_text(10))
    with FeatureStore.connect(redis_url, registry) as store:
        result = store.read(rows.ENTITY, ids, groups=[rows.GROUP])
    assert len(result.features) == 10
    for row in result.rows:
        assert row.statuses == [Status.PRESENT] * 10
        assert row.ages[rows.GROUP] is not None
        assert 0 <= row.ages[rows.GROUP] < 600
        assert all(isinstance(v, str) for v in row.values)


def _load(binding_props: dict[str, str], records: int, tmp_path: Path) -> Path:
    """Loads ``records`` records with the Java hash binding; returns the value histogram."""
    if not (YCSB / "target" / "classes" / "featurestore").exists():
        invoke.build()
    hist = tmp_path / "hist"
    histogram.write_histogram(hist, entities=50)
    props = {"recordcount": str(records), "operationcount": "1", "fieldlengthhistogram": str(hist)}
    cmd = invoke.ycsb_command(
        "HashClient", "load", "batchread", {**props, **binding_props}, threads=1, target=0
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ycsb_output.check(done.stdout, records, done.stderr)
    return hist


@pytest.mark.timeout(600)
@pytest.mark.parametrize("binding", ["ServingClient", "GrpcServingClient"])
def test_a_write_the_server_skips_as_superseded_is_ok(
    binding: str, redis_url: str, tmp_path: Path
) -> None:
    """The serving API keeps the newest event: a YCSB update that reaches Redis after a newer
    write of its record is skipped, which the serving bindings count as OK (superseded), not
    as a failed operation; the newer values stay."""
    records, updates = 20, 40
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    store_props = {"redis.port": port, "fs.prefix": "sup", "fs.group": rows.GROUP}
    hist = _load(store_props, records, tmp_path)
    keys = sorted(k.decode() for k in redis.Redis.from_url(redis_url).scan_iter(match="sup:*"))
    assert len(keys) == records
    ids = [k.split(":", 1)[1] for k in keys]
    registry_text = rows.registry_text(10).replace(f"prefix: {rows.PREFIX}\n", "prefix: sup\n")
    assert "prefix: sup\n" in registry_text
    registry_path = tmp_path / "registry.yaml"
    registry_path.write_text(registry_text)
    registry = parse_registry(registry_text)
    newer = {f"field{i}": "newer" for i in range(10)}
    with FeatureStore.connect(redis_url, registry) as store:
        stats = store.write(rows.GROUP, [(i, newer) for i in ids], event_time=time.time() + 3600)
    assert stats.values_written == records * 10
    with ServingProcess(redis_url, registry=registry_path, args=["--no-cache"]) as server:
        serving = (
            {"serving.grpc": server.grpc_target}
            if binding == "GrpcServingClient"
            else {"serving.url": server.rest_url}
        )
        props = {
            "recordcount": str(records),
            "operationcount": str(updates),
            "readproportion": "0",
            "updateproportion": "1",
            "fieldlengthhistogram": str(hist),
            "fs.prefix": "sup",
            "fs.group": rows.GROUP,
            "serving.timeout": "30000",  # a busy machine's first gRPC connection is slow
            **serving,
        }
        cmd = invoke.ycsb_command(binding, "run", "workloada", props, threads=2, target=0)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ycsb_output.check(done.stdout, updates, done.stderr)
    assert f"[writes] {updates} writes skipped by the server" in done.stderr
    with FeatureStore.connect(redis_url, registry) as store:
        result = store.read(rows.ENTITY, ids, groups=[rows.GROUP])
    assert all(row.values == ["newer"] * 10 for row in result.rows)
