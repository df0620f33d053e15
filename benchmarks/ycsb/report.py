"""The markdown table of a YCSB run, shaped like the production report's, plus ratios."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess

import sweeps
import ycsb_output
from row_result import BATCH, MeasuredLike, RowResult, SettingsLike


def _first_line(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return ((done.stdout or done.stderr).strip().splitlines() or ["unknown"])[0]


def environment(postgres_version: str | None) -> list[str]:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [
        f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, all on loopback",
        _first_line(["redis-server", "--version"]),
        _first_line(["java", "-version"]) + ", YCSB core 0.17.0, Jedis 5.1.3, pgjdbc 42.7.3",
        postgres_version or "PostgreSQL not run",
    ]


def _lat(op: ycsb_output.Operation | None) -> str:
    if op is None:
        return "-"
    return (
        f"{op.ms('AverageLatency(us)'):.2f} / {op.ms('95thPercentileLatency(us)'):.2f} / "
        f"{op.ms('99thPercentileLatency(us)'):.2f}"
    )


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[RowResult], s: SettingsLike) -> list[str]:
    lookups = s.batch_keys * s.batch_fields
    out = [
        f"| row | write {s.records:,} rows (s) | 95/5 batch read avg / p95 / p99 (ms) "
        f"| 100% batch read avg / p95 / p99 (ms) | 95/5 update avg (ms) "
        f"| throughput 95/5 / read (ops/s) | store CPU per lookup, read (µs) "
        f"| store CPU, read (% of a core) | API CPU per batch, read (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.not_run or (r.error and not r.runs):
            why = f"not run: {r.not_run}" if r.not_run else "FAILED (see below)"
            out.append(f"| {r.label} | {why} |  |  |  |  |  |  |  |")
            continue
        label = f"{r.label} (**had failed operations**, see below)" if r.error else r.label
        load = f"{r.load.output.runtime_s:.2f}" if r.load else "- (reads another row's records)"
        mix, read = r.runs.get("mix"), r.runs.get("read")
        update = mix.output.operations.get("UPDATE") if mix else None
        upd = f"{update.ms('AverageLatency(us)'):.2f}" if update else "-"
        tput = (
            f"{mix.output.throughput:.0f} / {read.output.throughput:.0f}" if mix and read else "-"
        )
        cpu_pct = read.store_cpu_s / read.output.runtime_s * 100 if read else None
        api = None
        if read and read.api_cpu_s is not None:
            api = read.api_cpu_s * 1000 / read.output.count(BATCH)
        out.append(
            f"| {label} | {load} | {_lat(r.batch('mix'))} | {_lat(r.batch('read'))} | {upd} "
            f"| {tput} | {_num(r.cpu_us_per_lookup('read', lookups), '.3f')} "
            f"| {_num(cpu_pct, '.0f')} | {_num(api, '.2f')} |"
        )
    return out


def single_table(rows: list[RowResult], workloads: list[str]) -> list[str]:
    """Each row's runs of YCSB's single-record workloads: throughput, and the read's and the
    write's latencies."""
    out = [
        "| row | workload | ops/s | read avg / p95 / p99 (ms) | write avg / p99 (ms) |",
        "|---|---|---:|---|---|",
    ]
    for r in rows:
        for w in workloads:
            m = r.runs.get(w)
            if m is None:
                why = f"not run: {r.not_run}" if r.not_run else "FAILED (see below)"
                out.append(f"| {r.label} | {w} | {why} |  |  |")
                continue
            ops = m.output.operations
            write = next((ops[n] for n in ("UPDATE", "INSERT") if n in ops), None)
            written = "-"
            if write is not None:
                avg, p99 = write.ms("AverageLatency(us)"), write.ms("99thPercentileLatency(us)")
                written = f"{avg:.2f} / {p99:.2f}"
            out.append(
                f"| {r.label} | {w} | {m.output.throughput:,.0f} | {_lat(ops.get('READ'))} "
                f"| {written} |"
            )
    return out


def cpu_table(rows: list[RowResult]) -> list[str]:
    """Store (and API) CPU seconds of every run, and as a share of one core over the run."""
    out = [
        "| row | load: store CPU (s) | 95/5: store CPU (s, % of a core) "
        "| read: store CPU (s, % of a core) | 95/5 / read: API CPU (s) |",
        "|---|---|---|---|---|",
    ]

    def cell(m: MeasuredLike | None) -> str:
        if m is None:
            return "-"
        return f"{m.store_cpu_s:.2f} ({m.store_cpu_s / m.output.runtime_s:.0%})"

    for r in rows:
        if r.not_run or not r.runs:
            continue
        mix, read = r.runs.get("mix"), r.runs.get("read")
        api = "-"
        if mix and read and mix.api_cpu_s is not None and read.api_cpu_s is not None:
            api = f"{mix.api_cpu_s:.2f} / {read.api_cpu_s:.2f}"
        load = f"{r.load.store_cpu_s:.2f}" if r.load else "-"
        out.append(f"| {r.label} | {load} | {cell(mix)} | {cell(read)} | {api} |")
    return out


def ratios(rows: dict[str, RowResult], s: SettingsLike) -> list[str]:
    """Each comparison the table is for, as a ratio of two rows of this run."""
    lookups = s.batch_keys * s.batch_fields

    def ok(name: str) -> RowResult | None:
        r = rows.get(name)
        return r if r is not None and not r.not_run and r.batch("read") else None

    def flag(*names: str) -> str:
        failed = [n for n in names if (r := rows.get(n)) is not None and r.error]
        return f" [{', '.join(failed)}: had failed operations]" if failed else ""

    def ms(name: str, metric: str) -> float:
        r = ok(name)
        op = r.batch("read") if r else None
        return op.ms(metric) if op else 0.0

    def cpu(name: str) -> float:
        r = ok(name)
        return (r.cpu_us_per_lookup("read", lookups) or 0.0) if r else 0.0

    avg, p99 = "AverageLatency(us)", "99thPercentileLatency(us)"
    out = []
    pairs = [("flat", "hash"), ("flat-pipeline", "hash"), ("flat-cluster", "hash-cluster")]
    pairs.append(("postgres", "hash"))
    for other, base in pairs:
        if not (ok(other) and ok(base) and ms(base, avg) and ms(base, p99)):
            continue
        line = (
            f"- {other} / {base}, 100% batch read: "
            f"avg latency x{ms(other, avg) / ms(base, avg):.2f}"
            f", p99 x{ms(other, p99) / ms(base, p99):.2f}"
        )
        if cpu(base):
            line += f", store CPU per lookup x{cpu(other) / cpu(base):.2f}"
        out.append(line + f" (above 1: {base} is better){flag(other, base)}")
    for api, base in [(n, r.reads) for n, r in rows.items() if r.reads is not None]:
        if not (ok(api) and ok(base) and ms(base, avg)):
            continue
        out.append(
            f"- {api} / {base}, 100% batch read: "
            f"avg latency x{ms(api, avg) / ms(base, avg):.2f}"
            f" (+{ms(api, avg) - ms(base, avg):.2f} ms per batch of {lookups:,} lookups), "
            f"p99 +{ms(api, p99) - ms(base, p99):.2f} ms{flag(api, base)}"
        )
    return out


def render(
    args: argparse.Namespace,
    rows: list[RowResult],
    s: SettingsLike,
    sizes: str,
    env: list[str],
) -> str:
    if s.sweep:
        return render_sweep(args, rows, s, sizes, env)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    target = f"{s.target} ops/s" if s.target else "none (as fast as possible)"
    lines = [
        f"# YCSB: batch reads of {s.batch_keys} keys x {s.batch_fields} fields",
        "",
        f"Command: `{args.command}` ({now})",
        "",
        *[f"- {e}" for e in env],
        f"- {s.records:,} records of 10 fields; {s.operations:,} operations per run; "
        f"target {target}; {s.threads} client threads; zipfian requests",
        f"- value sizes from benchmarks/ycsb/histogram.py: {sizes}",
        "- this machine's 2 cores are shared with other work: figures are noisy, compare the "
        "ratios of one run rather than absolute numbers across runs",
        "",
        *table(rows, s),
        "",
        "Latencies are YCSB's, per operation (one batch read of "
        f"{s.batch_keys * s.batch_fields:,} lookups, or one update of a whole record), "
        "measured in the client. Store CPU is utime+stime of the server processes over the "
        "100% read run, including everything else the server did meanwhile.",
        "",
    ]
    singles = [w for w in s.workloads if w not in sweeps.BATCH_WORKLOADS]
    if singles:
        lines += [
            "Single-record workloads (YCSB's own):",
            "",
            *single_table(rows, singles),
            "",
        ]
    lines += ["CPU of every run:", "", *cpu_table(rows), ""]
    rat = ratios({r.name: r for r in rows}, s)
    if rat:
        lines += ["Ratios (same run):", "", *rat, ""]
    return "\n".join(lines + notes_and_failures(rows))


WORKLOAD_NAMES = {
    "read": "batch reads",
    "mix": "95% batch reads, 5% updates of a whole record",
    "a": "YCSB A: 50% reads, 50% updates",
    "b": "YCSB B: 95% reads, 5% updates",
    "c": "YCSB C: reads only",
    "f": "YCSB F: 50% reads, 50% read-modify-writes",
    "d": "YCSB D: 95% reads of the latest records, 5% inserts",
}


def render_sweep(
    args: argparse.Namespace,
    rows: list[RowResult],
    s: SettingsLike,
    sizes: str,
    env: list[str],
) -> str:
    """The results of sweeps: best unthrottled throughput per row and workload, with the
    latencies at it and at fixed shares of it."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    lookups = s.batch_keys * s.batch_fields
    shares = " and ".join(f"{share:.0%}" for share in sweeps.SHARES)
    lines = [
        "# YCSB: the storage layouts and the serving API, unthrottled and at fixed rates",
        "",
        f"Command: `{args.command}` ({now}); load average at the end: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        "",
        *[f"- {e}" for e in env],
        f"- {s.records:,} records of 10 fields; each workload run unthrottled for "
        f"{s.seconds} s at each of {', '.join(map(str, s.sweep))} client threads, then at "
        f"{shares} of the best of those throughputs (its threads); zipfian requests "
        "(D: the latest records)",
        f"- batch reads of {s.batch_keys} keys x {s.batch_fields} fields = {lookups:,} lookups "
        "per operation; the single-record workloads read all 10 fields of one record",
        f"- value sizes from benchmarks/ycsb/histogram.py: {sizes}",
        "- workloads: "
        + "; ".join(f"`{w}`: {WORKLOAD_NAMES[w]}" for w in s.workloads)
        + ". YCSB's E (short scans) has no counterpart in a feature store: not run",
        "- this machine's 2 cores are shared by the store, the client and other work: compare "
        "the rows of one run, not absolute figures across runs or machines",
        "",
        *sweeps.table(rows, s.workloads, lookups, s.bound_ms),
        "",
        "Latencies are YCSB's, in the client, of the read (a batch read, or one record's read) "
        "only; the maximum is YCSB's MaxLatency, and the reads past the bound are counted in "
        "the HdrHistogram log YCSB writes of every read (`LatencyTail`). Store CPU is "
        "utime+stime of the store's processes (Redis's, the cluster's masters summed, "
        "PostgreSQL's) over the run, per operation; client CPU is the YCSB JVM's, start and "
        "warm-up included; API CPU is `feature-store serve`'s (the serving rows, "
        "whose store is Redis or the cluster).",
        "",
        *sweeps.loads(rows, s.records),
        "",
    ]
    if compared := sweeps.ratios(rows, s.workloads):
        lines += [
            "Ratios of two rows' best runs in this run (above 1: the first costs more, or "
            "reaches more). The best runs are at different rates, and a store's CPU per "
            "operation grows as its rate falls (fewer commands per wakeup: "
            "docs/ycsb.md, the cross-check):",
            "",
            *compared,
            "",
        ]
    return "\n".join(lines + notes_and_failures(rows))


def notes_and_failures(rows: list[RowResult]) -> list[str]:
    """The rows' notes, then each failed row with what failed."""
    lines: list[str] = []
    notes = [(r, n) for r in rows for n in r.notes]
    if notes:
        lines += ["Notes:", "", *[f"- {r.name}: {n}" for r, n in notes], ""]
    failures = [r for r in rows if r.error]
    if failures:
        lines += ["Failures:", ""]
        for r in failures:
            lines += [f"- {r.name}:", "", "```", (r.error or "").strip(), "```", ""]
    return lines
