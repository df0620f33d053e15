"""The L1 cache's memory: RSS per cached entity against what the cache accounts, and a long
zipfian load against the byte bound; this checkout and (--baseline REV) an older one; each
of them also (--python-hits) with Python answering every lookup (NATIVE_HITS=off: its
entries are Python's loads), (--python-loads) with the fronts answering and Python loading
their misses (NATIVE_LOADS=off), and the first step again with the entities looked up over
gRPC (--grpc) or through Feast's API (--feast) instead of REST; and (--compact) this
checkout with the L1 keeping each entry's packed values only (CACHE_FORM=compact).

    python3 benchmarks/l1_memory.py [--baseline REV] [--python-hits] [--python-loads]
        [--compact] [--grpc] [--feast] [--entities 200000] [--seconds 45] [--out FILE]

1. A worker with the cache on (TTL 3,600 s) reads the first 40,000 entities of the
   standard shape, 1,000 ids per REST request. RSS (VmRSS of /proc/<pid>/status) before
   and after, against the bytes the cache accounts (`GET /v1/admin/cache`). With --grpc,
   the same through the gRPC front (GetFeatures, 1,000 int_ids per request); with --feast,
   through `POST /get-online-features` (1,000 consumer_id values, all 50 features).
2. A fresh worker with `--cache-max-bytes 256MiB`: uniform batches of 1,000 ids over
   every entity fill the bound, then wrk sends zipfian batches of 100 (8 connections) for
   --seconds. RSS is sampled every 0.5 s; the target is idle RSS + 256 MiB x 1.25.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from feature_store import sample
from feature_store.client import GrpcFeatureClient
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, header, save, worktree
from cost import rss, wrk
from serving import add_data_dir, ensure_data, id_batches

MIB = 1024 * 1024
BOUND = 256 * MIB
FIRST = 40_000
TARGET_COMPACT = 1500  # issue: L1 memory <= 1.5 KB RSS per cached entity
COMPACT = "this checkout, CACHE_FORM=compact"
LOOKUPS = {"grpc": "gRPC", "feast": "Feast"}  # --grpc, --feast: the first step through them


def lookups_label(side: str, api: str) -> str:
    return f"{side}, {LOOKUPS[api]} lookups"


GRPC, FEAST = (lookups_label("this checkout", api) for api in LOOKUPS)
ALL_FEATURES = [
    f"{sample.GROUP}:{name}"
    for name in [*sample.FLOATS, *sample.INTS, *sample.INT_LISTS, *sample.EMBEDDINGS]
]


def get(http: httpx.Client, ids: list[int]) -> None:
    body = {"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]}
    r = http.post("/v1/features/get", json=body)
    if r.status_code != 200:
        raise SystemExit(f"POST /v1/features/get answered {r.status_code}: {r.text[:500]}")


def cache_summary(http: httpx.Client) -> dict[str, object]:
    doc: dict[str, object] = http.get("/v1/admin/cache").json()
    return doc


@dataclass
class Outcome:
    label: str
    idle: int  # RSS before any read, bytes
    after_first: int  # RSS after caching FIRST entities
    accounted_first: int  # the cache's bytes then
    entries_first: int
    # the long load against the bound (None: not run, the gRPC and Feast cells)
    bound_idle: int | None = None
    bound_max: int | None = None  # the largest RSS sampled under the long load
    bound_accounted: int | None = None
    bound_entries: int | None = None

    @property
    def rss_per_entity(self) -> float:
        return (self.after_first - self.idle) / self.entries_first

    @property
    def accounted_per_entity(self) -> float:
        return self.accounted_first / self.entries_first

    @property
    def limit(self) -> int | None:
        return None if self.bound_idle is None else self.bound_idle + int(BOUND * 1.25)

    @property
    def bound_met(self) -> bool:
        return self.bound_max is not None and self.bound_max <= (self.limit or 0)


def measure(
    label: str,
    redis: EmbeddedRedis,
    tree: Path,
    entities: int,
    seconds: float,
    more_env: dict[str, str] | None = None,
    api: str = "rest",
) -> Outcome:
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    env.update(more_env or {})
    args = ["--cache-ttl", "3600"]
    grpc = api == "grpc"
    with ServingProcess(redis.url, args=args, env=env, grpc=grpc, cwd=tree) as server:
        assert server.process is not None
        pid = server.process.pid
        with httpx.Client(base_url=server.rest_url, timeout=60) as http:
            idle = rss(pid)
            with contextlib.ExitStack() as stack:
                if grpc:
                    client = stack.enter_context(GrpcFeatureClient(server.grpc_target, timeout=60))

                    def ask(ids: list[int]) -> None:
                        client.get(sample.ENTITY, ids, groups=[sample.GROUP])
                elif api == "feast":

                    def ask(ids: list[int]) -> None:
                        body = {"entities": {"consumer_id": ids}, "features": ALL_FEATURES}
                        http.post("/get-online-features", json=body).raise_for_status()
                else:

                    def ask(ids: list[int]) -> None:
                        get(http, ids)

                for start in range(0, FIRST, 1000):
                    ask(list(range(start, start + 1000)))
            after = rss(pid)
            summary = cache_summary(http)
    accounted, entries = int(summary["bytes"]), int(summary["entries"])  # type: ignore[call-overload]
    print(
        f"{label}: {entries:,} entries: RSS +{(after - idle) / MIB:,.0f} MiB "
        f"({(after - idle) / entries:,.0f} B/entity), accounted {accounted / MIB:,.0f} MiB "
        f"({accounted / entries:,.0f} B/entity)",
        flush=True,
    )
    if api != "rest":  # the first step alone
        return Outcome(label, idle, after, accounted, entries)
    args = ["--cache-ttl", "3600", "--cache-max-bytes", str(BOUND)]
    with (
        ServingProcess(redis.url, args=args, env=env, grpc=False, cwd=tree) as server,
        tempfile.TemporaryDirectory() as work,
    ):
        assert server.process is not None
        pid = server.process.pid
        samples: list[int] = []
        stop = threading.Event()

        def sample_rss() -> None:
            while not stop.wait(0.5):
                samples.append(rss(pid))

        with httpx.Client(base_url=server.rest_url, timeout=60) as http:
            bound_idle = rss(pid)
            sampler = threading.Thread(target=sample_rss)
            sampler.start()
            try:
                ids = list(range(entities))
                random.Random(7).shuffle(ids)
                for start in range(0, entities, 1000):
                    get(http, ids[start : start + 1000])
                bodies = [
                    orjson.dumps({"entity_type": sample.ENTITY, "ids": b, "groups": [sample.GROUP]})
                    for b in id_batches(entities, 100, count=2000)
                ]
                wrk(f"{server.rest_url}/v1/features/get", bodies, seconds, Path(work))
            finally:
                stop.set()
                sampler.join()
            summary = cache_summary(http)
    outcome = Outcome(
        label,
        idle,
        after,
        accounted,
        entries,
        bound_idle,
        max(samples),
        int(summary["bytes"]),  # type: ignore[call-overload]
        int(summary["entries"]),  # type: ignore[call-overload]
    )
    print(
        f"{label}: bound 256 MiB: idle {bound_idle / MIB:,.0f} MiB, "
        f"max {max(samples) / MIB:,.0f} MiB (limit {(outcome.limit or 0) / MIB:,.0f}), "
        f"{outcome.bound_entries:,} entries",
        flush=True,
    )
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to measure in the same run")
    parser.add_argument(
        "--python-hits",
        action="store_true",
        help="also with NATIVE_HITS=off (Python answers every lookup; its loads fill the L1)",
    )
    parser.add_argument(
        "--python-loads",
        action="store_true",
        help="also with NATIVE_LOADS=off (the fronts answer; Python loads their misses)",
    )
    parser.add_argument(
        "--compact",
        action="store_true",
        help="also this checkout with CACHE_FORM=compact (entries keep packed values only)",
    )
    parser.add_argument(
        "--grpc",
        action="store_true",
        help="also the first step through gRPC lookups (this checkout, and the baseline)",
    )
    parser.add_argument(
        "--feast",
        action="store_true",
        help="also the first step through Feast's API (this checkout, and the baseline)",
    )
    parser.add_argument("--entities", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    add_data_dir(parser)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run ./scripts/setup.sh")
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        variants = [
            (f", {name}=off", {f"FEATURE_SERVING_{name}": "off"})
            for name, wanted in (
                ("NATIVE_HITS", args.python_hits),
                ("NATIVE_LOADS", args.python_loads),
            )
            if wanted
        ]
        apis = [api for api in LOOKUPS if getattr(args, api)]

        def each(side: str, tree: Path) -> None:
            outcomes.append(measure(side, redis, tree, args.entities, args.seconds))
            for suffix, env in variants:
                label = side + suffix
                outcomes.append(measure(label, redis, tree, args.entities, args.seconds, env))
            if side == "this checkout" and args.compact:
                compact = {"FEATURE_SERVING_CACHE_FORM": "compact"}
                outcomes.append(measure(COMPACT, redis, tree, args.entities, args.seconds, compact))
            for api in apis:
                label = lookups_label(side, api)
                outcomes.append(measure(label, redis, tree, args.entities, args.seconds, api=api))

        each("this checkout", ROOT)
        if args.baseline:
            with worktree(args.baseline, Path(tmp) / "baseline") as tree:
                each(f"baseline {args.baseline}", tree)
    lines = [
        *header(
            f"One worker, cache TTL 3,600 s; {args.entities:,} entities of the standard "
            f"shape; the long load: wrk, zipfian batches of 100, 8 connections, "
            f"{args.seconds:g} s."
        ),
        "",
        f"| | RSS growth per entity ({FIRST:,} cached) | accounted per entity | RSS / accounted "
        "| idle RSS | max RSS under load, 256 MiB bound | limit (idle + 1.25 x bound) "
        "| entries at the bound |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def mib(n: int | None) -> str:
        return "not run" if n is None else f"{n / MIB:,.0f} MiB"

    for o in outcomes:
        lines.append(
            f"| {o.label} | {o.rss_per_entity:,.0f} B | {o.accounted_per_entity:,.0f} B | "
            f"{o.rss_per_entity / o.accounted_per_entity:.2f} | {mib(o.bound_idle)} | "
            f"{mib(o.bound_max)} | {mib(o.limit)} | "
            f"{'not run' if o.bound_entries is None else f'{o.bound_entries:,}'} |"
        )
    new = outcomes[0]
    lines += [
        "",
        f"Targets: RSS growth per entity <= 1.25x accounted: "
        f"{'met' if new.rss_per_entity <= 1.25 * new.accounted_per_entity else 'NOT met'} "
        f"({new.rss_per_entity / new.accounted_per_entity:.2f}x); <= 3 KB per entity: "
        f"{'met' if new.rss_per_entity <= 3072 else 'NOT met'} ({new.rss_per_entity:,.0f} B); "
        f"under the long load below idle + 1.25 x bound: "
        f"{'met' if new.bound_met else 'NOT met'}.",
    ]
    for o in outcomes:
        if o.label == COMPACT:
            lines.append(
                f"Compact: <= {TARGET_COMPACT:,} B per entity: "
                f"{'met' if o.rss_per_entity <= TARGET_COMPACT else 'NOT met'} "
                f"({o.rss_per_entity:,.0f} B, {o.rss_per_entity / new.rss_per_entity:.2f}x "
                f"the answers kept); under the long load below idle + 1.25 x bound: "
                f"{'met' if o.bound_met else 'NOT met'}."
            )
        if o.label == GRPC:
            lines.append(
                f"gRPC lookups: {o.rss_per_entity:,.0f} B per entity, "
                f"{o.rss_per_entity / new.rss_per_entity:.2f}x REST's (an entry keeps the "
                f"answer bytes of the API that loaded it)."
            )
        if o.label == FEAST:
            lines.append(
                f"Feast lookups: {o.rss_per_entity:,.0f} B per entity, "
                f"{o.rss_per_entity / new.rss_per_entity:.2f}x REST's (the native front "
                f"answers them from the entries' JSON, as REST's; the handler, from the packed "
                f"values, keeps none)."
            )
    save(args.out, "L1 memory", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
