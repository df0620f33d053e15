"""An older revision against this checkout, the same cells in alternation, round by round.

    python3 benchmarks/alternate.py --baseline REV [--rounds 3] [--entities 100000]
                                    [--seconds 12] [--ttl 2] [--compact] [--misses | --feast]
                                    [--out FILE]

These machines are shared, and their speed drifts within a run: in one dataplane.py run,
whose baseline cells came ten minutes before this checkout's, Redis's own CPU per entity
was a third higher in the later cells, though Redis and its workload were the same. So here
each round runs the baseline's worker and this checkout's back to back on the same cells
(which goes first alternates), and each cell's ratio (now / before, server CPU per entity)
is taken within its round; the median over the rounds is the figure, with Redis's own
ratio beside it as the witness of drift (about 1.0 when the two ran alike).

The cells are those of dataplane.py (benchmarks/dataplane.py: wrk on 1,000 zipfian batches
for REST, h2load on one batch for gRPC, 8 connections, the L1's TTL a fraction of each
window): REST and gRPC with the L1 off and on at batches of 10 and 100, and REST with the
L1 on at 1,000 too, where some ids miss in every request. The last table gives each
cell's median ratio and the medians of the figures themselves. ``--compact``: the L1
cells alone, both sides with CACHE_FORM=compact (every hit writes its answer from the
entry's packed values); with ``--misses`` or ``--feast``, the
L1 cells of those. ``--misses``: the miss path alone, REST with the L1 on at batches of
10, 100 and 1,000 and a TTL of 1 ms (unless ``--ttl`` says otherwise), so that nearly
every lookup misses and is loaded through the L1's policy (single-flight and the cache)
before it is answered: the cost of a cold key, a refresh, a restart. Its
figure is server CPU per entity read from Redis (HMGET and HGETALL calls, as Redis counts
them), beside the share of the entities looked up that were read. ``--feast``: lookups
answered from the packed values, at batch 10: Feast's ``/get-online-features`` (all 50
features) and ten picked features of ``/v1/features/get`` (dataplane.PICKED), each with
the L1 off and on.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import header, save, worktree
from dataplane import COMPACT, Cell, run_server
from serving import add_data_dir, ensure_data

from feature_store.embedded import EmbeddedRedis

# (API, L1, the cells of one worker: (batch, connections))
WORKERS: tuple[tuple[str, bool, list[tuple[int, int]]], ...] = (
    ("rest", False, [(10, 8), (100, 8)]),
    ("rest", True, [(10, 8), (100, 8), (1000, 8)]),
    ("grpc", False, [(10, 8), (100, 8)]),
    ("grpc", True, [(10, 8), (100, 8)]),
)
# --misses: gRPC's one batch (h2load) would be all hits between its reloads, or all
# coalesced into one read
MISSES: tuple[tuple[str, bool, list[tuple[int, int]]], ...] = (
    ("rest", True, [(10, 8), (100, 8), (1000, 8)]),
)
MISSES_TTL = 0.001
# --feast: answers written from the packed values (Feast's API, picked features)
FEAST: tuple[tuple[str, bool, list[tuple[int, int]]], ...] = (
    ("feast", False, [(10, 8)]),
    ("picked", False, [(10, 8)]),
    ("feast", True, [(10, 8)]),
    ("picked", True, [(10, 8)]),
)


def one_round(
    redis: EmbeddedRedis, tree: Path, first: str, args: argparse.Namespace, work: Path
) -> dict[str, list[Cell]]:
    """Each worker of WORKERS, the baseline's and this checkout's back to back."""
    order = ("before", "now") if first == "before" else ("now", "before")
    cells: dict[str, list[Cell]] = {"before": [], "now": []}
    for api, l1, plan in MISSES if args.misses else FEAST if args.feast else WORKERS:
        if args.compact and not l1:
            continue
        for side in order:
            cwd = tree if side == "before" else None
            path = COMPACT if args.compact else "before" if side == "before" else "native"
            cells[side] += run_server(redis, path, api, l1, plan, args.seconds, work, args.ttl, cwd)
    return cells


def plot(path: Path, names: list[str], ratios: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for x, name in enumerate(names):
        ys = ratios[name]
        ax.scatter([x] * len(ys), ys, color="tab:blue", s=18)
        ax.hlines(statistics.median(ys), x - 0.3, x + 0.3, color="tab:blue")
    ax.axhline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_xticks(range(len(names)), names, fontsize=8, rotation=20, ha="right")
    ax.set_ylabel("server CPU per entity, now / before")
    ax.set_title("This checkout against the baseline, round by round (line: median)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--ttl", type=float, help="the L1's TTL (seconds; default 2)")
    parser.add_argument("--compact", action="store_true", help="L1 cells, CACHE_FORM=compact")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--misses", action="store_true", help="REST L1 cells that nearly all miss")
    form.add_argument("--feast", action="store_true", help="Feast's API and picked features")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    add_data_dir(parser)
    args = parser.parse_args()
    if args.ttl is None:
        args.ttl = MISSES_TTL if args.misses else 2.0
    rounds: list[dict[str, list[Cell]]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedRedis(args.data_dir) as redis,
        contextlib.ExitStack() as stack,
    ):
        ensure_data(redis.url, args.entities)
        tree = stack.enter_context(worktree(args.baseline, Path(tmp) / "before"))
        for r in range(args.rounds):
            first = "before" if r % 2 == 0 else "now"
            rounds.append(one_round(redis, tree, first, args, Path(tmp)))
    names = [c.name for c in rounds[0]["now"]]
    server: dict[str, list[float]] = {name: [] for name in names}
    # the figures themselves, now and before (per entity, or per entity read)
    absolute: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
    redis_ratio: dict[str, list[float]] = {name: [] for name in names}
    # the server's CPU per entity over Redis's own in the same cell (not for --misses)
    over_redis: dict[str, list[float]] = {name: [] for name in names}
    lines = [
        *header(
            f"One worker per cell; {args.rounds} rounds, the baseline ({args.baseline}) and "
            f"this checkout back to back in each; {args.seconds:g} s per cell, L1 TTL "
            f"{args.ttl:g} s; {args.entities:,} entities, batches of the standard shape"
            + ("; the L1 compact (CACHE_FORM=compact) on both sides" if args.compact else "")
            + ("; the miss path: nearly every lookup misses" if args.misses else "")
            + ("; Feast's API and picked features" if args.feast else "")
            + "."
        ),
        "",
        (
            "| cell | round | first | now µs/entity read | before µs/entity read "
            "| now / before | Redis now / before | read now | read before |"
            if args.misses
            else "| cell | round | first | now µs/entity | before µs/entity | now / before "
            "| Redis now / before | now / Redis's own | before / Redis's own |"
        ),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, cells in enumerate(rounds):
        for now, before in zip(cells["now"], cells["before"], strict=True):
            if args.misses:  # per entity read from Redis: the share of lookups that missed varies
                ours, theirs = now.server_us_per_read, before.server_us_per_read
                witness = now.redis_us_per_read / max(before.redis_us_per_read, 1e-9)
            else:
                ours, theirs = now.server_us, before.server_us
                witness = now.redis_us / max(before.redis_us, 1e-9)
            ratio = ours / theirs
            server[now.name].append(ratio)
            absolute[now.name][0].append(ours)
            absolute[now.name][1].append(theirs)
            redis_ratio[now.name].append(witness)
            first = "before" if r % 2 == 0 else "now"
            if args.misses:
                more = f" {now.loaded:.0%} | {before.loaded:.0%} |"
            else:
                mine, old = (c.server_us / max(c.redis_us, 1e-9) for c in (now, before))
                over_redis[now.name].append(mine)
                more = f" {mine:.2f}x | {old:.2f}x |"
            lines.append(
                f"| {now.name} | {r + 1} | {first} | {ours:.2f} | {theirs:.2f} | {ratio:.2f}x | "
                f"{witness:.2f}x |" + more
            )
    lines += [
        "",
        "| cell | median now / before | range | Redis's median | now / Redis's own (range) "
        f"| median now µs/entity{' read' if args.misses else ''} "
        f"| median before µs/entity{' read' if args.misses else ''} |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for name in names:
        ys, own = server[name], over_redis[name]
        mine, old = (statistics.median(v) for v in absolute[name])
        lines.append(
            f"| {name} | {statistics.median(ys):.2f}x | {min(ys):.2f} to {max(ys):.2f} | "
            f"{statistics.median(redis_ratio[name]):.2f}x | "
            + (f"{min(own):.2f} to {max(own):.2f}x |" if own else "(per read) |")
            + f" {mine:.2f} | {old:.2f} |"
        )
    save(args.out, "This checkout against an older revision, in alternation", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), names, server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
