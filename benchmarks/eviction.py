"""Which eviction policy the L1 should use: LRU, CLOCK (the fronts' own) and SIEVE, with
and without a doorkeeper admission filter, simulated over traces of entity lookups.

    python3 benchmarks/eviction.py [--keys 100000] [--accesses 400000] [--out FILE]

A simulation, not a timing: a policy's hit rate and the entries it stores depend on the
order of the lookups alone (``benchmarks/_policies.py``), so the figures are exact and the
same on any machine for a seed. What each entry stored costs the server is measured by
``benchmarks/l1_misses.py`` (a miss that makes a new entry against one that does not).

Traces: ``keys`` entities, looked up one at a time, drawn from a Zipf distribution of
exponent 0.7, 0.9 and 1.1 (a few entities are most of the lookups: users, items, merchants)
and uniformly (every entity as likely: the cache's worst case, and what
``l1_misses.py``'s bounded cells draw); ranks are shuffled over the ids. A fifth trace,
Zipf 0.9 with its popularity moving (a fifth of the ranks dealt to other entities eight
times over the trace), is where an admission filter pays for what it refuses. The first quarter
of each trace fills the cache and is not counted. Caches of 0.5% to 50% of the entities.

Per policy and cache size: the hit rate, and the entries stored per 100 lookups (each a
Redis read's entry made, and, once the cache is full, one evicted).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
from pathlib import Path

import numpy as np
from _policies import policy
from _results import header, save

SEED = 20261129
EXPONENTS = (0.7, 0.9, 1.1)
SIZES = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5)  # of the entities
RUNS = (("LRU", False), ("CLOCK", False), ("SIEVE", False), ("CLOCK", True), ("SIEVE", True))


def zipf_trace(keys: int, accesses: int, exponent: float, rng: np.random.Generator) -> list[int]:
    weights = 1.0 / np.arange(1, keys + 1) ** exponent
    ranks = rng.choice(keys, size=accesses, p=weights / weights.sum())
    ids = rng.permutation(keys)  # the most looked up entity is not id 0
    return [int(k) for k in ids[ranks]]


def drifting_trace(
    keys: int, accesses: int, exponent: float, rng: np.random.Generator, phases: int = 8
) -> list[int]:
    """Zipf, with the entities' popularity moving: at each of ``phases`` a fifth of the
    ranks are dealt to other entities (new items, trends), so that entities become hot
    that the cache has not held, where an admission filter makes them wait a miss more."""
    weights = 1.0 / np.arange(1, keys + 1) ** exponent
    ids = rng.permutation(keys)
    out: list[int] = []
    per = accesses // phases
    for phase in range(phases):
        if phase:
            moved = rng.choice(keys, size=keys // 5, replace=False)
            ids[moved] = ids[rng.permutation(moved)]
        ranks = rng.choice(keys, size=per, p=weights / weights.sum())
        out += [int(k) for k in ids[ranks]]
    return out


def uniform_trace(keys: int, accesses: int, rng: np.random.Generator) -> list[int]:
    return [int(k) for k in rng.integers(0, keys, size=accesses)]


def simulate(trace: list[int], name: str, capacity: int, doorkeeper: bool) -> tuple[float, float]:
    """The hit rate and the entries stored per 100 lookups, after the first quarter."""
    cache = policy(name, capacity, doorkeeper)
    warm = len(trace) // 4
    for key in trace[:warm]:
        cache.access(key)
    stored = cache.inserts
    hits = sum(cache.access(key) for key in trace[warm:])
    counted = len(trace) - warm
    return hits / counted, 100 * (cache.inserts - stored) / counted


def label(name: str, doorkeeper: bool) -> str:
    return f"{name} + doorkeeper" if doorkeeper else name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--accesses", type=int, default=400_000)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rng = np.random.default_rng(SEED)
    traces = {f"Zipf {s}": zipf_trace(args.keys, args.accesses, s, rng) for s in EXPONENTS}
    traces["Zipf 0.9, popularity moving"] = drifting_trace(args.keys, args.accesses, 0.9, rng)
    traces["uniform"] = uniform_trace(args.keys, args.accesses, rng)
    lines = header(
        f"{args.keys:,} entities, {args.accesses:,} lookups per trace (the first quarter "
        f"not counted), seed {SEED}; hit rate, and entries stored per 100 lookups in "
        "parentheses."
    )
    results: dict[str, dict[str, list[float]]] = {}
    for trace_name, trace in traces.items():
        lines += ["", f"## {trace_name}", ""]
        columns = [label(n, d) for n, d in RUNS]
        lines.append("| cache | " + " | ".join(columns) + " |")
        lines.append("|---:|" + "---:|" * len(columns))
        results[trace_name] = {c: [] for c in columns}
        for size in SIZES:
            capacity = max(1, int(args.keys * size))
            cells = []
            for name, doorkeeper in RUNS:
                rate, stored = simulate(trace, name, capacity, doorkeeper)
                results[trace_name][label(name, doorkeeper)].append(rate)
                cells.append(f"{rate:.3f} ({stored:.1f})")
            lines.append(f"| {size:.1%} ({capacity:,}) | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    save(args.out, "Eviction and admission policies over lookup traces", lines)
    if args.out is not None:
        plot(args.out.with_suffix(".png"), results)


def plot(path: Path, results: dict[str, dict[str, list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.6), sharey=True)
    for ax, (trace_name, series) in zip(axes, results.items(), strict=True):
        lru = series["LRU"]
        for name, rates in series.items():
            ax.plot(
                [s * 100 for s in SIZES],
                [r - base for r, base in zip(rates, lru, strict=True)],
                marker="o",
                label=name,
            )
        ax.set_xscale("log")
        ax.set_title(trace_name)
        ax.set_xlabel("cache, % of the entities")
        ax.axhline(0, color="grey", linewidth=0.5)
    axes[0].set_ylabel("hit rate minus LRU's")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
