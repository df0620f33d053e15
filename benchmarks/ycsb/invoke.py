"""One YCSB process, and what it measured: the command line, the store's, the serving API's
and the client's CPU around it, and the tail of its read latencies (``LatencyTail``).
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import servers
import ycsb_output
from rows import ENTITY, GROUP, PREFIX, RowSpec

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# table column -> workload file: the batch read and the 95/5 mix of batch reads and updates,
# then YCSB's standard A, B, C, F and D on single records (D last: it inserts records; E,
# short scans, has no counterpart in a feature store)
WORKLOADS = {
    "read": "batchread",
    "mix": "batchmix",
    "a": "workloada",
    "b": "workloadb",
    "c": "workloadc",
    "f": "workloadf",
    "d": "workloadd",
}
BOUNDLESS = 2_000_000_000  # operationcount of a run bounded by its time
TAIL = "# ---- LatencyTail ----"  # the raw output's section of counts past the bound
AROUND = "# ---- measured around the run ----"  # CPU and wall time, in YCSB's line format
PACKAGE = "featurestore.ycsb"


# --- building and invoking YCSB ---------------------------------------------------------


def build(quiet: bool = True) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise servers.ServerError("Maven (mvn) was not found; install it (apt-get install maven)")
    flags = ["-B", "-q"] if quiet else ["-B"]
    # the gRPC binding's client, the project's own (clients/java), into the local repository
    steps = [
        ("the Java client (mvn install)", REPO / "clients" / "java", ["install", "-DskipTests"]),
        ("the YCSB module (mvn package)", HERE, ["package"]),
    ]
    # copy-dependencies adds jars and never removes one: a version the pom left stays on the
    # classpath (target/lib/*) beside its successor unless the directory starts empty
    shutil.rmtree(HERE / "target" / "lib", ignore_errors=True)
    for what, where, goals in steps:
        print(f"building {what} ...", flush=True)
        cmd = [mvn, *flags, *goals]
        done = subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-4000:]
            raise servers.ServerError(f"{shlex.join(cmd)} in {where} failed:\n{tail}")


def classpath() -> str:
    return f"{HERE / 'target' / 'classes'}{os.pathsep}{HERE / 'target' / 'lib' / '*'}"


def ycsb_command(
    db: str, phase: str, workload: str, props: dict[str, str], threads: int, target: int
) -> list[str]:
    cmd = ["java", "-Xms256m", "-Xmx1g", "-cp", classpath(), "site.ycsb.Client"]
    cmd += ["-load" if phase == "load" else "-t", "-db", f"{PACKAGE}.{db}"]
    cmd += ["-P", str(HERE / "workloads" / workload), "-threads", str(threads)]
    if target > 0:
        cmd += ["-target", str(target)]
    for k, v in props.items():
        cmd += ["-p", f"{k}={v}"]
    return cmd


@dataclass
class Measured:
    output: ycsb_output.Output
    store_cpu_s: float
    api_cpu_s: float | None
    wall_s: float
    threads: int = 0
    target: int = 0  # ops/s asked for; 0: unthrottled
    client_cpu_s: float = 0.0  # the YCSB JVM's own CPU


@dataclass
class Settings:
    records: int
    operations: int
    target: int
    threads: int
    batch_keys: int
    batch_fields: int
    histogram: Path
    timeout_s: int
    raw_dir: Path
    seconds: int | None = None  # each run bounded by this time instead of an operation count
    sweep: tuple[int, ...] = ()  # threads of the unthrottled runs; () runs each workload once
    workloads: tuple[str, ...] = tuple(WORKLOADS)
    load_threads: int = 4
    bound_ms: int = 50  # a run's operations slower than this are counted (PastBound(ops))


def run_ycsb(
    spec: RowSpec,
    phase: str,
    s: Settings,
    props: dict[str, str],
    store_pids: list[int],
    api_pid: int | None,
    threads: int | None = None,
    target: int | None = None,
    seconds: int | None = None,
    tag: str | None = None,
) -> Measured:
    """One YCSB process: the load (``phase`` "load") or a run of one workload, at ``threads``
    and ``target`` ops/s (the settings' by default), bounded by ``seconds`` (the settings' if
    any). ``tag`` names its raw output file in place of its threads and target."""
    workload = WORKLOADS.get(phase, "batchread")
    threads = s.threads if threads is None else threads
    target = s.target if target is None else target
    seconds = s.seconds if seconds is None else seconds
    bounded = phase != "load" and seconds is not None
    all_props = {
        "recordcount": str(s.records),
        "operationcount": str(BOUNDLESS if bounded else s.operations),
        "batchkeys": str(s.batch_keys),
        "batchfields": str(s.batch_fields),
        "fieldlengthhistogram": str(s.histogram),
        "maxexecutiontime": str(seconds if bounded else s.timeout_s),
        "fs.prefix": PREFIX,
        "fs.group": GROUP,
        "fs.entity": ENTITY,
        **spec.props,
        **props,
    }
    if phase == "load":
        target, threads = 0, s.load_threads  # the load runs flat out: it is timed
    hdr_dir = Path(tempfile.mkdtemp(prefix="ycsb-hdr-"))
    all_props["hdrhistogram.fileoutput"] = "true"
    all_props["hdrhistogram.output.path"] = f"{hdr_dir}{os.sep}"
    cmd = ycsb_command(spec.db, phase, workload, all_props, threads, target)
    # a workload run once is named by it alone; a sweep's by its threads and target too
    run = ""
    if tag is not None:
        run = f".{tag}"
    elif phase != "load" and s.sweep:
        run = f".t{threads}" + (f".r{target}" if target else "")
    raw = s.raw_dir / f"{spec.name}.{phase}{run}.txt"
    cpu0 = servers.cpu_seconds(store_pids)
    api0 = servers.cpu_seconds([api_pid]) if api_pid else None
    client0 = children_cpu()
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=s.timeout_s + 120)
    except subprocess.TimeoutExpired as e:
        raise ycsb_output.YCSBRunFailed(f"YCSB did not finish within {s.timeout_s + 120} s") from e
    wall = time.monotonic() - t0
    client = children_cpu() - client0
    time.sleep(0.5)  # let PostgreSQL reap the backends of the closed connections
    cpu1 = servers.cpu_seconds(store_pids)
    api1 = servers.cpu_seconds([api_pid]) if api_pid else None
    try:
        tail = latency_tail(hdr_dir, s.bound_ms)
    finally:
        shutil.rmtree(hdr_dir, ignore_errors=True)
    store_cpu = cpu1 - cpu0
    api_cpu = None if api0 is None or api1 is None else api1 - api0
    around = [
        ("StoreCPU(s)", store_cpu),
        ("ClientCPU(s)", client),
        ("Wall(s)", wall),
        ("Threads", threads),
        ("Target(ops/sec)", target),
    ] + ([] if api_cpu is None else [("ApiCPU(s)", api_cpu)])
    measured_lines = "\n".join(f"[MEASURED], {name}, {value:g}" for name, value in around)
    raw.write_text(
        f"$ {shlex.join(cmd)}\n# exit {done.returncode}\n\n{done.stdout}\n{TAIL}\n{tail}\n"
        f"{AROUND}\n{measured_lines}\n# ---- stderr ----\n{done.stderr}"
    )
    expected = s.records if phase == "load" else (None if bounded else s.operations)
    if done.returncode != 0:
        raise ycsb_output.YCSBRunFailed(
            f"YCSB exited {done.returncode}; see {raw}\n{done.stderr[-1500:]}"
        )

    def measured(out: ycsb_output.Output) -> Measured:
        return Measured(out, store_cpu, api_cpu, wall, threads, target, client)

    try:
        out = ycsb_output.check(f"{done.stdout}\n{tail}", expected, done.stderr)
    except ycsb_output.YCSBRunFailed as e:
        partial = None if e.output is None else measured(e.output)
        raise PhaseFailed(f"{phase}{run}: {e} (raw output: {raw})", partial) from e
    return measured(out)


def latency_tail(hdr_dir: Path, bound_ms: int) -> str:
    """``LatencyTail``'s lines for the HdrHistogram logs of one run (one per operation, named
    by it): how many of each operation took longer than ``bound_ms``."""
    logs = sorted(hdr_dir.glob("*.hdr"))
    if not logs:
        return ""
    cmd = ["java", "-cp", classpath(), f"{PACKAGE}.LatencyTail", str(bound_ms * 1000)]
    cmd += [f"{log.stem}={log}" for log in logs]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ycsb_output.YCSBRunFailed(f"LatencyTail failed: {done.stderr[-1500:]}")
    return done.stdout.strip()


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended: a YCSB process's own, read
    before and after it (the servers, which run on, are not among them)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


class PhaseFailed(Exception):
    """A load or run with failed operations; ``measured`` holds its figures if it finished."""

    def __init__(self, message: str, measured: Measured | None) -> None:
        super().__init__(message)
        self.measured = measured
