"""The tables and the plot of a sweep: each row's best unthrottled throughput per workload,
the latency at it, and the latencies at fixed shares of it (``benchmarks/ycsb/run``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from row_result import BATCH, MeasuredLike, RowResult

BATCH_WORKLOADS = ("read", "mix")  # the workloads of batch reads; the others read one record
SHARES = (0.5, 0.9)  # the fixed-rate runs, as shares of the best unthrottled throughput
P50, P99 = "50thPercentileLatency(us)", "99thPercentileLatency(us)"
MAX = "MaxLatency(us)"
PAST = "PastBound(ops)"  # LatencyTail's count of the operations slower than the run's bound
# what a run's latency is read from: the batch read, or a single record's read
READS = (BATCH, "READ")


def read_op(m: MeasuredLike) -> str | None:
    return next((name for name in READS if name in m.output.operations), None)


def latency(m: MeasuredLike | None, metric: str) -> float | None:
    if m is None or (name := read_op(m)) is None:
        return None
    value = m.output.operations[name].metrics.get(metric)
    return None if value is None else value / 1000.0


def past(m: MeasuredLike | None) -> str:
    """The reads slower than the run's bound, as a count and a share of the reads."""
    if m is None or (name := read_op(m)) is None:
        return "-"
    op = m.output.operations[name]
    n, ops = op.metrics.get(PAST), op.metrics.get("Operations")
    if n is None or not ops:
        return "-"
    return f"{n:,.0f} ({n / ops:.2%})"


def sweep(
    run: Callable[[int, int], MeasuredLike | None], threads: Sequence[int]
) -> list[MeasuredLike]:
    """A workload's runs: unthrottled at each count of ``threads``, then at each share of
    SHARES of the best of those throughputs, with that run's threads. ``run(threads,
    target)`` makes one, or None where it failed without a figure."""
    found = [m for t in threads if (m := run(t, 0)) is not None]
    if not found:
        return found
    top = max(found, key=lambda m: m.output.throughput)
    for share in SHARES:
        at = run(top.threads, target_of(top, share))
        if at is not None:
            found.append(at)
    return found


def target_of(top: MeasuredLike, share: float) -> int:
    """The target ops/s of the run at ``share`` of the unthrottled run ``top``."""
    return max(1, round(top.output.throughput * share))


def best(runs: Sequence[MeasuredLike]) -> MeasuredLike | None:
    """The unthrottled run of the highest throughput."""
    free = [m for m in runs if m.target == 0]
    return max(free, key=lambda m: m.output.throughput, default=None)


def fixed(runs: Sequence[MeasuredLike], share: float) -> MeasuredLike | None:
    """The run at ``share`` of the best throughput (its target, rounded as the runner does)."""
    top = best(runs)
    if top is None:
        return None
    target = target_of(top, share)
    return next((m for m in runs if m.target == target), None)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _at(m: MeasuredLike | None) -> str:
    if m is None:
        return "-"
    return f"{m.output.throughput:,.0f} ops/s: {_ms(latency(m, P50))} / {_ms(latency(m, P99))}"


def failed_in(error: str | None, workload: str) -> bool:
    """Whether a row's failures (one ``<workload>.<phase>: why`` line per failed run, each
    followed by its stderr) include a run of this workload."""
    if not error:
        return False
    head = f"{workload}."
    return any(line.startswith(head) for line in error.splitlines())


def per_op(m: MeasuredLike, cpu_s: float | None) -> float | None:
    """``cpu_s`` of the run ``m`` per operation, in µs."""
    n = m.output.done
    return None if cpu_s is None or not n else cpu_s * 1e6 / n


def table(
    rows: Sequence[RowResult], workloads: Sequence[str], lookups: int, bound_ms: int
) -> list[str]:
    """One line per row and workload."""
    out = [
        "| row | workload | best ops/s (threads) | p99 / max at best (ms) "
        "| at 50%: ops/s, p50 / p99 (ms) | at 90%: ops/s, p50 / p99 (ms) "
        f"| reads past {bound_ms} ms at best / at 90% "
        "| store CPU per op at best (µs) | API CPU per op at best (µs) "
        "| client CPU per op at best (µs) |",
        "|---|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if r.not_run:
            out.append(f"| {r.label} | - | not run: {r.not_run} |  |  |  |  |  |  |  |")
            continue
        for w in workloads:
            runs = r.sweeps.get(w, [])
            top = best(runs)
            if top is None:
                out.append(f"| {r.label} | {w} | FAILED (see below) |  |  |  |  |  |  |  |")
                continue
            store, api = per_op(top, top.store_cpu_s), per_op(top, top.api_cpu_s)
            client = per_op(top, top.client_cpu_s)
            if store is not None and read_op(top) == BATCH:
                store_cell = f"{store:,.0f} ({store / lookups:.3f} per lookup)"
            else:
                store_cell = "-" if store is None else f"{store:,.1f}"
            failed = " **had failed operations**" if failed_in(r.error, w) else ""
            out.append(
                f"| {r.label}{failed} | {w} | {top.output.throughput:,.0f} ({top.threads}) "
                f"| {_ms(latency(top, P99))} / {_ms(latency(top, MAX))} "
                f"| {_at(fixed(runs, 0.5))} | {_at(fixed(runs, 0.9))} "
                f"| {past(top)} / {past(fixed(runs, 0.9))} "
                f"| {store_cell} | {'-' if api is None else f'{api:,.1f}'} "
                f"| {'-' if client is None else f'{client:,.0f}'} |"
            )
    return out


# (row, base row): the comparisons the table is for; a serving row is also compared with the
# row whose records it reads (RowResult.reads), and the L1-on row with its --no-cache twin
STORE_PAIRS = [
    ("flat", "hash"),
    ("flat-pipeline", "hash"),
    ("postgres", "hash"),
    ("hash-cluster", "hash"),
    ("flat-cluster", "hash-cluster"),
]


def ratios(rows: Sequence[RowResult], workloads: Sequence[str]) -> list[str]:
    """Each comparison as ratios of two rows' best runs in this run: the store's CPU per
    operation, and for the serving rows the API's, and the best throughput."""
    by_name = {r.name: r for r in rows if not r.not_run}
    pairs = [(a, b) for a, b in STORE_PAIRS if a in by_name and b in by_name]
    pairs += [(r.name, r.reads) for r in by_name.values() if r.reads in by_name]
    pairs += [(n, f"{n}-nocache") for n in by_name if f"{n}-nocache" in by_name]
    out = []
    for w in workloads:
        for a, b in pairs:
            top_a, top_b = best(by_name[a].sweeps.get(w, [])), best(by_name[b].sweeps.get(w, []))
            if top_a is None or top_b is None or not top_b.output.throughput:
                continue
            parts = []
            store_a, store_b = per_op(top_a, top_a.store_cpu_s), per_op(top_b, top_b.store_cpu_s)
            if store_a is not None and store_b:
                parts.append(f"store CPU per op x{store_a / store_b:.2f}")
            api_a, api_b = per_op(top_a, top_a.api_cpu_s), per_op(top_b, top_b.api_cpu_s)
            if api_a is not None and api_b:
                parts.append(f"API CPU per op x{api_a / api_b:.2f}")
            elif api_a is not None and store_b:
                # the API's CPU and the store's together, against the direct binding's store
                parts.append(f"API + store CPU per op x{(api_a + (store_a or 0)) / store_b:.2f}")
            parts.append(f"best ops/s x{top_a.output.throughput / top_b.output.throughput:.2f}")
            failed = [n for n in (a, b) if failed_in(by_name[n].error, w)]
            flag = f" [{', '.join(failed)}: had failed operations]" if failed else ""
            out.append(f"- `{w}`, {a} / {b}: {', '.join(parts)}{flag}")
    return out


def loads(rows: Sequence[RowResult], records: int) -> list[str]:
    """Each loading row's load time and Redis memory per record."""
    out = [
        f"| row | load of {records:,} records (s) | Redis memory per record (B) |",
        "|---|---:|---:|",
    ]
    for r in rows:
        if r.load is None:
            continue
        memory = "-" if r.memory_per_record is None else f"{r.memory_per_record:,.0f}"
        out.append(f"| {r.label} | {r.load.output.runtime_s:,.1f} | {memory} |")
    return out


def plot(path: Path, rows: Sequence[RowResult], workloads: Sequence[str]) -> None:
    """Throughput against p99 of the read, one panel per workload, one line per row through
    its unthrottled runs (by threads), its fixed-rate runs as hollow markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(workloads))
    lines = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(lines, cols, figsize=(5 * cols, 3.8 * lines), squeeze=False)
    for ax, w in zip(axes.flat, workloads, strict=False):
        for i, r in enumerate(rows):
            runs = r.sweeps.get(w, [])
            free = sorted((m for m in runs if m.target == 0), key=lambda m: m.threads)
            points = [(m.output.throughput, latency(m, P99)) for m in free]
            points = [(x, y) for x, y in points if y]
            if not points:
                continue
            color = f"C{i % 10}"
            ax.plot(*zip(*points, strict=True), marker="o", color=color, label=r.name)
            held = [(m.output.throughput, latency(m, P99)) for m in runs if m.target]
            held = [(x, y) for x, y in held if y]
            if held:
                ax.scatter(*zip(*held, strict=True), facecolors="none", edgecolors=color)
        ax.set_title(f"workload {w}")
        ax.set_xlabel("throughput (ops/s)")
        ax.set_ylabel("p99 of the read (ms)")
        ax.set_yscale("log")
    for ax in list(axes.flat)[len(workloads) :]:
        ax.set_visible(False)
    legend = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    labels, handles = list(legend), list(legend.values())
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels) or 1), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
