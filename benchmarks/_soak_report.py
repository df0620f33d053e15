"""What the soak (benchmarks/soak.py) records and what it reports: the values it writes
(``value``), what its readers observed (``Observations``) and the faults it made
(``Fault``); read afterwards (``analyse``) into the failures after each fault, the wrong
values, the writes' freshness and the resources' drift, as markdown and a timeline PNG."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson

M = 1_000_000  # int_0 = entity * M + write number
NIGHTLY = M - 1  # the nightly job's write number: newer than any push write
FRESH_TIMEOUT = 10.0  # seconds: a write not served by then counts as unserved
STOP_SECONDS = 5.0  # how long a master is SIGSTOPped
SETTLE_SECONDS = 10.0  # after a fault's end, pools have reopened what they need
BURST_GAP = 2.0  # seconds without a failure that end a fault's burst of failures


def value(entity: int, seq: int) -> int:
    return entity * M + seq


@dataclass
class Observations:
    t0: float
    requests: list[tuple[float, str, str, float]] = field(
        default_factory=list
    )  # t, who, outcome, s
    seen: set[tuple[int, int]] = field(default_factory=set)  # (entity, int_0) pairs served
    # what each failed request said (t, who, its error's message or answer), for the report
    details: list[tuple[float, str, str]] = field(default_factory=list)
    wrong_entity: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self,
        who: str,
        outcome: str,
        start: float,
        values: list[tuple[int, object]],
        detail: str = "",
    ) -> None:
        with self.lock:
            self.requests.append((start - self.t0, who, outcome, time.monotonic() - start))
            if detail:
                self.details.append((start - self.t0, who, f"{outcome}: {detail[:300]}"))
            for e, v in values:
                if v is None:
                    continue
                if not isinstance(v, int) or v // M != e:
                    self.wrong_entity += 1
                self.seen.add((e, v))  # type: ignore[arg-type]


@dataclass
class Fault:
    name: str
    at: float  # seconds since t0
    detail: str = ""
    lasted: float = 0.0  # seconds from its start until it was over (the cluster ok again)


def analyse(
    obs: Observations,
    faults: list[Fault],
    samples: list[tuple[float, str, int, int]],
    write_log: Path,
    wall0: float,
    nightly_started: float | None,
    seconds: float,
) -> dict[str, object]:
    attempted: dict[int, int] = defaultdict(int)  # entity -> highest write number sent
    fresh: dict[str, list[float]] = {"A": [], "B": []}
    unserved: list[dict[str, object]] = []
    writes = Counter()
    for line in write_log.read_bytes().splitlines():
        rec = orjson.loads(line)
        if "sent" in rec:
            attempted[rec["e"]] = max(attempted[rec["e"]], rec["seq"])
            continue
        writes[str(rec["status"])] += 1
        for name, delay in zip(("A", "B"), rec.get("fresh", ()), strict=False):
            if delay is None:
                unserved.append({"to": name, "at": rec["acked"] - wall0, "entity": rec["e"]})
            else:
                fresh[name].append(delay)
    # every served value must have been written for its entity
    never_written = sum(
        1
        for e, v in obs.seen
        if v // M == e
        and not (v % M <= attempted.get(e, 0) or (v % M == NIGHTLY and nightly_started))
    )
    requests = sorted(obs.requests)
    failed = [(t, who, outcome) for t, who, outcome, _ in requests if outcome not in ("200", "OK")]
    windows = []
    bounds = [f.at for f in faults] + [seconds + 60]
    for i, fault in enumerate(faults):
        mine = [x for x in failed if bounds[i] <= x[0] < bounds[i + 1]]
        # the burst: failures from the first on, each within BURST_GAP of the previous;
        # failures after it are listed apart (an isolated timeout, a reconnect)
        burst = mine[:1]
        for x in mine[1:]:
            if x[0] - burst[-1][0] > BURST_GAP:
                break
            burst.append(x)
        later = mine[len(burst) :]
        windows.append(
            {
                "fault": fault.name,
                "at": round(fault.at, 1),
                "detail": fault.detail,
                "failed": len(mine),
                "lasted": round(fault.lasted, 1),
                "window": (
                    [round(burst[0][0] - fault.at, 2), round(burst[-1][0] - fault.at, 2)]
                    if burst
                    else None
                ),
                "kinds": dict(Counter(f"{who}: {outcome}" for _, who, outcome in burst)),
                "later": [(round(t - fault.at, 2), f"{who}: {o}") for t, who, o in later],
                # what the failures said, each message once (first five)
                "said": list(
                    dict.fromkeys(
                        f"{who} {d}" for t, who, d in obs.details if bounds[i] <= t < bounds[i + 1]
                    )
                )[:5],
            }
        )
    before_faults = [x for x in failed if not faults or x[0] < faults[0].at]
    drift = {}
    # the settled stretch: from SETTLE_SECONDS after the last fault that moves connections
    # (a failover opens pools to the promoted master: a step, not a trend) to the end; the
    # nightly job, a fault of the data, comes inside it
    moving = [f.at for f in faults if not f.name.startswith("nightly")]
    settled_from = (max(moving) if moving else 0.0) + STOP_SECONDS + SETTLE_SECONDS
    for name in ("A", "B"):
        series = [(t, rss, fds) for t, n, rss, fds in samples if n == name]
        fifth = max(1, len(series) // 5)
        early, late = series[fifth : 2 * fifth], series[-fifth:]
        settled = [x[2] for x in series if x[0] >= settled_from]
        half = len(settled) // 2
        if early and late:
            drift[name] = {
                # the most fds open in the first and in the second half of the settled
                # stretch: a leak grows with requests and shows here, a step does not (a
                # failover's new pools; pools that grew to the nightly job's misses, which
                # the first half takes: compared by their means, a step inside the first
                # half read as 5.4 fds of growth)
                "fds_settled": [max(settled[:half]), max(settled[half:])] if half else None,
                "rss_mib": [
                    round(_mean(x[1] for x in early) / 2**20, 1),
                    round(_mean(x[1] for x in late) / 2**20, 1),
                ],
                "rss_drift": round(_mean(x[1] for x in late) / _mean(x[1] for x in early) - 1, 3),
                "fds": [round(_mean(x[2] for x in early), 1), round(_mean(x[2] for x in late), 1)],
                "fd_drift": round(_mean(x[2] for x in late) / _mean(x[2] for x in early) - 1, 3),
            }
    latencies = sorted(x[3] for x in requests)
    return {
        "seconds": seconds,
        "requests": len(requests),
        "failed": len(failed),
        "failed_before_any_fault": len(before_faults),
        "http_500": sum(1 for _, _, o in failed if o.startswith("5") and o != "503"),
        "grpc_internal": sum(1 for _, _, o in failed if o in ("INTERNAL", "UNKNOWN")),
        "wrong_entity_values": obs.wrong_entity,
        "never_written_values": never_written,
        "values_checked": len(obs.seen),
        "latency_ms": {
            "p50": round(_pct(latencies, 0.5) * 1000, 2),
            "p99": round(_pct(latencies, 0.99) * 1000, 2),
            "max": round(latencies[-1] * 1000, 1) if latencies else None,
            "over_1s": sum(1 for x in latencies if x > 1.0),
            # each request over 1 s: when (s from the start), whose, its outcome, how long
            "over_1s_requests": [
                (round(t, 2), who, outcome, round(s * 1000, 1))
                for t, who, outcome, s in requests
                if s > 1.0
            ],
        },
        "faults": windows,
        "writes": dict(writes),
        "freshness_s": {
            name: {
                "count": len(v),
                "p50": round(_pct(sorted(v), 0.5), 4),
                "p99": round(_pct(sorted(v), 0.99), 4),
                "max": round(max(v), 4) if v else None,
            }
            for name, v in fresh.items()
        },
        "unserved_writes": unserved,
        "resources": drift,
        "timeline": _timeline(requests, faults, samples, seconds),
    }


def _mean(values: object) -> float:
    xs = list(values)  # type: ignore[call-overload]
    return sum(xs) / len(xs) if xs else 0.0


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _timeline(
    requests: list[tuple[float, str, str, float]],
    faults: list[Fault],
    samples: list[tuple[float, str, int, int]],
    seconds: float,
) -> dict[str, object]:
    n = int(seconds) + 1
    per_second: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    failures = [0] * n
    latency: dict[int, list[float]] = defaultdict(list)
    for t, who, outcome, took in requests:
        s = min(n - 1, int(t))
        per_second[who][s] += 1
        failures[s] += outcome not in ("200", "OK")
        latency[s // 5].append(took)
    p99 = [(k * 5, _pct(sorted(v), 0.99) * 1000) for k, v in sorted(latency.items())]
    return {
        "requests": dict(per_second),
        "failures": failures,
        "p99_ms": p99,
        "rss_mib": {
            name: [(t, rss / 2**20) for t, nm, rss, _ in samples if nm == name]
            for name in ("A", "B")
        },
        "faults": [(f.at, f.name) for f in faults],
    }


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result["timeline"]
    assert isinstance(tl, dict)
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    for who, series in tl["requests"].items():
        axes[0].plot(range(len(series)), series, label=who, linewidth=0.8)
    axes[0].set_ylabel("requests/s")
    axes[0].legend(loc="lower left", fontsize=7, ncol=4)
    axes[1].plot(range(len(tl["failures"])), tl["failures"], color="tab:red", linewidth=0.8)
    axes[1].set_ylabel("failed/s")
    xs, ys = zip(*tl["p99_ms"], strict=True) if tl["p99_ms"] else ((), ())
    axes[2].plot(xs, ys, color="tab:purple")
    axes[2].set_ylabel("p99 ms (5 s)")
    axes[2].set_yscale("log")
    for name, series in tl["rss_mib"].items():
        if series:
            t, v = zip(*series, strict=True)
            axes[3].plot(t, v, label=f"{name} (supervisor + 2 workers)")
    axes[3].set_ylabel("RSS MiB")
    axes[3].legend(loc="lower left", fontsize=7)
    axes[3].set_xlabel("seconds")
    for at, name in tl["faults"]:
        for ax in axes:
            ax.axvline(at, color="grey", linestyle="--", linewidth=0.7)
        axes[0].annotate(name, (at, 0), rotation=90, fontsize=6, va="bottom")
    fig.suptitle("Soak under faults: A = L1 on, B = L1 off; REST and gRPC each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, object]) -> list[str]:
    lat = result["latency_ms"]
    assert isinstance(lat, dict)
    lines = [
        "## Answers",
        "",
        f"- {result['requests']:,} requests ({result['values_checked']:,} distinct "
        f"(entity, value) pairs checked); {result['failed']} failed, "
        f"{result['failed_before_any_fault']} of them before the first fault",
        f"- wrong values: {result['wrong_entity_values']} of another entity, "
        f"{result['never_written_values']} never written",
        f"- HTTP 500: {result['http_500']}; gRPC INTERNAL/UNKNOWN: {result['grpc_internal']}",
        f"- latency over the whole run: p50 {lat['p50']} ms, p99 {lat['p99']} ms, "
        f"max {lat['max']} ms, {lat['over_1s']} requests over 1 s"
        + (
            " ("
            + "; ".join(f"{w} at {t} s: {o} in {ms} ms" for t, w, o, ms in lat["over_1s_requests"])
            + ")"
            if lat["over_1s_requests"]
            else ""
        ),
        "",
        "## Faults",
        "",
        "| fault | at (s) | lasted (s) | what happened | failed requests "
        "| burst after the fault (s) | kinds in the burst | later, apart (s after the fault) |",
        "|---|---:|---:|---|---:|---|---|---|",
    ]
    for w in result["faults"]:  # type: ignore[attr-defined]
        window = "-" if w["window"] is None else f"{w['window'][0]} to {w['window'][1]}"
        kinds = ", ".join(f"{k} x {n}" for k, n in w["kinds"].items()) or "-"
        later = ", ".join(f"{t}: {what}" for t, what in w["later"]) or "-"
        lines.append(
            f"| {w['fault']} | {w['at']} | {w['lasted']} | {w['detail']} | {w['failed']} "
            f"| {window} | {kinds} "
            f"| {later} |"
        )
    lines += [
        "",
        "A fault's failed requests are those between it and the next fault; its burst runs "
        f"from the first on while no {BURST_GAP:.0f} s pass without one. A fault lasts until "
        "it is over: the cluster ok again after a master's kill or stop, the nightly job "
        "finished.",
        "",
        "## Push writes: acknowledged to served by every worker",
        "",
        f"Writes by outcome: {result['writes']}; write durability: "
        f"{result['write_durability']} (a 503 is a write not confirmed by a replica, or "
        "refused while its master was down: never acknowledged).",
        "",
        "| deployment | writes read back | p50 (s) | p99 (s) | max (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, f in result["freshness_s"].items():  # type: ignore[attr-defined]
        lines.append(f"| {name} | {f['count']} | {f['p50']} | {f['p99']} | {f['max']} |")
    unserved = result["unserved_writes"]
    assert isinstance(unserved, list)
    lines += [
        "",
        f"Acknowledged writes not served within {FRESH_TIMEOUT:.0f} s (lost): {len(unserved)}"
        + (f" ({unserved[:5]})" if unserved else ""),
        "",
        "## Resources (mean of the last fifth of the run against the fifth after warm-up)",
        "",
        "| deployment | RSS MiB | RSS drift | open fds | fd drift | open fds once settled |",
        "|---|---|---:|---|---:|---|",
    ]
    for name, r in result["resources"].items():  # type: ignore[attr-defined]
        settled = r.get("fds_settled")
        lines.append(
            f"| {name} | {r['rss_mib'][0]} -> {r['rss_mib'][1]} | {r['rss_drift']:+.1%} | "
            f"{r['fds'][0]} -> {r['fds'][1]} | {r['fd_drift']:+.1%} | "
            + (f"{settled[0]} -> {settled[1]} |" if settled else "- |")
        )
    lines += [
        "",
        f"Once settled: the most open in each half of the stretch from {SETTLE_SECONDS:.0f} s"
        " after the last fault that moves connections (a failover's new pools are a step, a"
        " leak a trend).",
    ]
    return lines
