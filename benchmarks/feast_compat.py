"""Feast's clients against this server, and against Feast's own, on the same data.

    python3 benchmarks/feast_compat.py [--entities 10000] [--seconds 15] [--out FILE]

The standard shape (entity ``consumer``, one 50-feature view) is loaded twice from the
same generated rows: into this project's Redis layout (``FeatureStore.write``) and, from a
parquet file, into Feast 0.67's Redis online store (``feast apply`` + ``feast
materialize``), each on its own embedded redis-server. Requests are batches of 10 zipfian
ids x all 50 features.

1. Feast's Python SDK, one client calling back to back for ``--seconds``:
   ``get_online_features`` on Feast's Redis online store (its own read path, in process)
   against this project's online store plugin (``feature_store.feast.online_store``: Feast's SDK
   on this project's layout, in process, loaded by ``feast materialize`` into a third
   redis-server), the same SDK with ``online_store: type: remote`` pointed at this server
   (``POST /get-online-features``), and with this project's typed store for Feast
   (``feature_store.feast.remote``: the same request, values made by declared type), L1
   off and on. ``feast materialize`` is timed into Feast's store and into the plugin's,
   and each Redis's memory per value is read (``used_memory`` after the load, less before).
   Then both in-process paths run under cProfile: where a call's time goes.
2. Feast's HTTP API under a compiled load generator (wrk, a Lua script cycling through
   1,000 batches, the same bodies for both): ``feast serve`` (one worker, its defaults, no
   access log) against this server's ``/get-online-features`` (one worker, L1 off and on),
   at 8 and 256 connections; and, as this server's own baseline, the same batches through
   ``/v1/features/get``. Server CPU per entity is read from /proc over the window (the
   whole process tree for ``feast serve``), next to its redis-server's.

L1 on means a 1 s TTL: each window holds many expiries and refreshes (steady state).
Before measuring, one batch is read through both servers and the values compared.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import numpy as np
import orjson

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _feast_rig import answer_columns, as_float32, feast, feast_serve, non_200, tree_cpu
from _results import PerEntity, bars, header, save
from cost import TAIL_BOUND_US, _ms, cpu_seconds, tail_lua, tail_of

BATCH = 10
NAMES = sample.FLOATS + sample.INTS + sample.INT_LISTS + sample.EMBEDDINGS
REFS = [f"{sample.GROUP}:{n}" for n in NAMES]
L1_TTL = "1"
TYPED = "feature_store.feast.remote.FeatureStoreOnlineStore"  # this project's Feast store
PLUGIN = "feature_store.feast.online_store.FeatureStoreRedisOnlineStore"  # in process, our layout
PLUGIN_CELL = "Feast SDK on this project's plugin (in process, this layout)"
PROFILE_CALLS = 400
MATERIALIZE_ROUNDS = 3
# (label, module file, function): the phases of a call, cumulative time under cProfile
PHASES = {
    "feast": [
        ("whole get_online_features + to_dict", "benchmarks/feast_compat.py", "call"),
        ("request resolution (registry, entity protos)", "feast/utils.py",
         "_prepare_entities_to_read_from_online_store"),
        ("Redis round trip (HMGET pipeline, replies)", "online_stores/redis.py",
         "_read_hash_fields"),
        ("values parsed (ParseFromString per value)", "online_stores/redis.py",
         "_convert_redis_values_to_protobuf"),
        ("response protos built", "feast/utils.py", "_populate_response_from_feature_data"),
        ("to_dict (each Value to Python)", "feast/online_response.py", "to_dict"),
    ],
    "plugin": [
        ("whole get_online_features + to_dict", "benchmarks/feast_compat.py", "call"),
        ("request planned (cached per shape)", "feature_store/feast/online_store.py", "_cached"),
        ("Redis round trip (HGETALL pipeline, replies)", "redis/client.py", "execute"),
        ("values decoded (native core)", "feature_store/batch.py", "decode_read"),
        ("the read in all (round trip, decode, columns, statuses)",
         "feature_store/feast/online_store.py", "_answer"),
        ("to_dict (columns as they are)", "feature_store/feast/answers.py", "to_dict"),
    ],
}  # fmt: skip
BOUND_US = TAIL_BOUND_US  # requests slower than 1 s are counted
ENV = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}


# --- 1. the SDK ----------------------------------------------------------------------------


@dataclass
class SdkCell:
    name: str
    requests: int
    seconds: float
    latencies_ms: list[float]

    def p(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))


def sdk_call(repo: Path) -> Callable[[list[int]], dict[str, list[object]]]:
    """One ``get_online_features(...).to_dict()`` of Feast's SDK on the repository."""
    import feast as feast_sdk

    store = feast_sdk.FeatureStore(repo_path=str(repo))

    def call(ids: list[int]) -> dict[str, list[object]]:
        got: dict[str, list[object]] = store.get_online_features(
            features=REFS, entity_rows=[{"consumer_id": i} for i in ids]
        ).to_dict()
        assert len(got["float_00"]) == len(ids)
        return got

    return call


def sdk_cell(name: str, repo: Path, batches: list[list[int]], seconds: float) -> SdkCell:
    call = sdk_call(repo)
    for ids in batches[:50]:  # warm-up: registry, connections
        call(ids)
    latencies = []
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        ids = batches[i % len(batches)]
        i += 1
        s = time.perf_counter()
        call(ids)
        latencies.append((time.perf_counter() - s) * 1000)
    return SdkCell(name, len(latencies), time.perf_counter() - t0, latencies)


def profile(
    repo: Path, batches: list[list[int]], phases: list[tuple[str, str, str]]
) -> list[tuple[str, float]]:
    """ms per call of each phase under cProfile (which slows every call alike)."""
    import cProfile
    import pstats

    call = sdk_call(repo)
    for ids in batches[:50]:
        call(ids)
    profiler = cProfile.Profile()
    profiler.enable()
    for ids in batches[:PROFILE_CALLS]:
        call(ids)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    out = []
    for label, where, function in phases:
        total = sum(
            row[3]
            for (path, _, name), row in stats.items()
            if name == function
            and path.endswith(where.split("/", 1)[-1])
            and where.split("/", 1)[0] in path
        )
        out.append((label, total / PROFILE_CALLS * 1000))
    return out


def materialize(repo: Path) -> tuple[float, float]:
    """``materialize`` of every row through Feast's SDK in this process: seconds in all,
    and of them in the online store's ``online_write_batch``."""
    import feast as feast_sdk

    store = feast_sdk.FeatureStore(repo_path=str(repo))
    online = store._get_provider().online_store
    write = online.online_write_batch
    spent = [0.0]

    def timed(*args: object, **kwargs: object) -> object:
        t = time.perf_counter()
        try:
            return write(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    online.online_write_batch = timed
    t0 = time.perf_counter()
    store.materialize(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
    return time.perf_counter() - t0, spent[0]


def used_memory(url: str) -> int:
    import redis

    with redis.Redis.from_url(url) as client:
        return int(client.info("memory")["used_memory"])


# --- 2. HTTP under wrk -----------------------------------------------------------------------


@dataclass
class HttpCell(PerEntity):
    server: str
    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    past_1s: int
    timeouts: int
    errors: int
    server_cpu: float
    redis_cpu: float
    batch: ClassVar[int] = BATCH  # entities per request


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    pid: int  # the server (its process tree is counted)
    redis_pid: int
    bodies: list[bytes]


def wrk_cell(target: Target, connections: int, seconds: float, work: Path) -> HttpCell:
    """The target under wrk for ``seconds`` (after 2 s of the same load), CPU read around."""
    url, server_pid, redis_pid = target.url, target.pid, target.redis_pid
    table = ",\n".join("[[" + b.decode() + "]]" for b in target.bodies)
    script = work / "feast.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{table}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[i])\nend\n" + tail_lua(BOUND_US)
    )
    command = ["wrk", "-t2", f"-c{connections}", "--latency", "--timeout", "10s", "-s", str(script)]
    subprocess.run(
        [*command, "-d2s", f"{url}/get-online-features"], capture_output=True, check=True
    )
    s0, r0 = tree_cpu(server_pid), cpu_seconds(redis_pid)
    t0 = time.monotonic()
    out = subprocess.run(
        [*command, f"-d{seconds:g}s", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    elapsed = time.monotonic() - t0
    s1, r1 = tree_cpu(server_pid), cpu_seconds(redis_pid)

    def find(pattern: str, text: str = out) -> str:
        m = re.search(pattern, text)
        if m is None:
            raise SystemExit(f"unexpected wrk output:\n{out}")
        return m.group(1)

    latency = out[out.index("Latency Distribution") :]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return HttpCell(
        target.name,
        connections,
        int(find(r"(\d+) requests in")),
        elapsed,
        _ms(find(r"\s50%\s+(\S+)", latency)),
        _ms(find(r"\s99%\s+(\S+)", latency)),
        *tail_of(out),
        int(bad.group(1)) if bad else 0,
        s1 - s0,
        r1 - r0,
    )


def plot(path: Path, sdk: list[SdkCell], http: list[HttpCell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    ax = axes[0]
    xs = range(len(sdk))
    ax.bar([x - 0.2 for x in xs], [c.p(50) for c in sdk], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [c.p(99) for c in sdk], 0.4, label="p99")
    short = [
        "Feast's own\nRedis store",
        "plugin,\nin process",
        "remote ->\nthis, L1 off",
        "remote ->\nthis, L1 on",
        "typed ->\nthis, L1 off",
        "typed ->\nthis, L1 on",
    ]
    ax.set_xticks(list(xs), short[: len(sdk)], fontsize=8)
    ax.set_ylabel("ms per get_online_features (10 x 50)")
    ax.set_title("Feast's Python SDK, one client")
    ax.legend()
    names = {
        "feast serve": "feast\nserve",
        "L1 off": "this,\nL1 off",
        "L1 on": "this,\nL1 on",
        "/v1/": "this /v1,\nL1 off",
    }
    labels = [
        next(v for k, v in reversed(names.items()) if k in c.server) + f"\n{c.connections} conn"
        for c in http
    ]
    xs = range(len(http))
    ax = axes[1]
    ax.bar(
        list(xs),
        [c.rate for c in http],
        color=["C3" if "feast" in c.server else "C0" for c in http],
    )
    ax.set_yscale("log")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("requests/s (log)")
    ax.set_title("POST /get-online-features, wrk")
    bars(
        axes[2],
        labels,
        {"server": [c.server_us for c in http], "redis-server": [c.redis_us for c in http]},
        title="Cost per entity looked up",
        ylabel="CPU µs per entity (log)",
        log=True,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=15.0, help="per measured cell")
    parser.add_argument("--connections", default="8,256", help="wrk connection counts")
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run ./scripts/setup.sh")
    connections = [int(c) for c in args.connections.split(",")]
    zipf = sample.Zipf(args.entities, seed=BATCH)
    batches = [zipf.sample(BATCH) for _ in range(1000)]
    bodies = [orjson.dumps({"features": REFS, "entities": {"consumer_id": ids}}) for ids in batches]
    random.Random(0).shuffle(bodies)
    v1_bodies = [  # the same batches in this server's own API: its baseline
        orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        for ids in (orjson.loads(b)["entities"]["consumer_id"] for b in bodies)
    ]
    sdk: list[SdkCell] = []
    http: list[HttpCell] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedRedis(Path(tmp) / "ours") as ours_redis,
        EmbeddedRedis(Path(tmp) / "feast") as feast_redis,
        EmbeddedRedis(Path(tmp) / "plugin") as plugin_redis,
    ):
        work = Path(tmp)
        empty = {"feast": used_memory(feast_redis.url), "plugin": used_memory(plugin_redis.url)}
        print(f"loading {args.entities:,} entities into both stores ...", flush=True)
        t0 = time.perf_counter()
        with FeatureStore.connect(ours_redis.url, sample.registry()) as store:
            store.write(sample.GROUP, sample.rows(args.entities))
        ours_load = time.perf_counter() - t0
        feast_address = feast_redis.url.split("//")[1].split("/")[0]
        event_time = time.time() - 3600

        def load(name: str, online_store: str) -> tuple[Path, float]:
            """A repository of the standard shape, applied; seconds of `feast materialize`."""
            repo = sample.feast_repo(
                work / name, online_store, args.entities, event_time=event_time
            )
            feast("apply", cwd=repo)
            t0 = time.perf_counter()
            feast("materialize", "2000-01-01T00:00:00", "2100-01-01T00:00:00", cwd=repo)
            return repo, time.perf_counter() - t0

        feast_repo, feast_load = load(
            "feast_repo", f'  type: redis\n  connection_string: "{feast_address}"'
        )
        plugin_repo, plugin_load = load(
            "plugin_repo", f"  type: {PLUGIN}\n  connection_string: {plugin_redis.url}"
        )
        values = args.entities * len(NAMES)
        feast_bytes = (used_memory(feast_redis.url) - empty["feast"]) / values
        plugin_bytes = (used_memory(plugin_redis.url) - empty["plugin"]) / values
        print(
            f"loaded: this store {ours_load:.1f} s; feast materialize (the command) into "
            f"Feast's store {feast_load:.1f} s, into the plugin's {plugin_load:.1f} s; bytes "
            f"per value {feast_bytes:.1f} (Feast's), {plugin_bytes:.1f} (plugin's)",
            flush=True,
        )
        rounds: dict[str, list[tuple[float, float]]] = {"feast": [], "plugin": []}
        for _ in range(MATERIALIZE_ROUNDS):  # alternated: the machine's noise hits both
            rounds["feast"].append(materialize(feast_repo))
            rounds["plugin"].append(materialize(plugin_repo))
        median = {k: sorted(v)[len(v) // 2] for k, v in rounds.items()}
        loads = Loads(*median["feast"], *median["plugin"], feast_bytes, plugin_bytes)
        print(
            f"materialize in process, median of {MATERIALIZE_ROUNDS}: Feast's store "
            f"{loads.feast_seconds:.2f} s (its write {loads.feast_write:.2f} s), the plugin's "
            f"{loads.plugin_seconds:.2f} s (its write {loads.plugin_write:.2f} s)",
            flush=True,
        )
        same_values = sdk_call(feast_repo)(batches[0]), sdk_call(plugin_repo)(batches[0])
        if {k: [as_float32(v) for v in c] for k, c in same_values[0].items()} != {
            k: [as_float32(v) for v in c] for k, c in same_values[1].items()
        }:
            raise SystemExit("Feast's store and the plugin answer different values")
        print("one batch read through Feast's store and the plugin: the same values")
        assert ours_redis.process is not None
        assert feast_redis.process is not None
        with (
            ServingProcess(ours_redis.url, args=["--no-cache"], env=ENV, grpc=False) as off,
            ServingProcess(ours_redis.url, args=["--cache-ttl", L1_TTL], env=ENV, grpc=False) as on,
            feast_serve(feast_repo) as (feast_url, feast_process),
        ):
            assert off.process is not None
            assert on.process is not None
            feast_path = "/get-online-features"
            ours_pid, feast_pid = ours_redis.process.pid, feast_redis.process.pid
            servers = [
                Target("feast serve (Feast's Redis)", feast_url + feast_path,
                       feast_process.pid, feast_pid, bodies),
                Target("this server, L1 off", off.rest_url + feast_path,
                       off.process.pid, ours_pid, bodies),
                Target(f"this server, L1 on ({L1_TTL} s TTL)", on.rest_url + feast_path,
                       on.process.pid, ours_pid, bodies),
                Target("this server's /v1/features/get, L1 off", off.rest_url + "/v1/features/get",
                       off.process.pid, ours_pid, v1_bodies),
            ]  # fmt: skip
            theirs = answer_columns(servers[0].url, bodies[0])
            for target in servers[1:3]:
                if answer_columns(target.url, bodies[0]) != theirs:
                    raise SystemExit(f"{target.url} and feast serve answer different values")
            print("one batch read through both servers: the same values", flush=True)
            repos: dict[str, Path] = {
                "Feast SDK on Feast's Redis online store": feast_repo,
                PLUGIN_CELL: plugin_repo,
            }
            stores = [
                ("remote", "remote", off.rest_url, "L1 off"),
                ("remote", "remote", on.rest_url, f"L1 on, {L1_TTL} s TTL"),
                ("typed", TYPED, off.rest_url, "L1 off"),
                ("typed", TYPED, on.rest_url, f"L1 on, {L1_TTL} s TTL"),
            ]
            for label, kind, url, l1 in stores:
                repo = sample.feast_repo(
                    work / f"sdk_{len(repos)}", f"  type: {kind}\n  path: {url}"
                )
                feast("apply", cwd=repo)
                repos[f"Feast SDK, {label} -> this server, {l1}"] = repo
            for name, repo in repos.items():
                cell = sdk_cell(name, repo, batches, args.seconds)
                print(
                    f"{name}: {cell.requests / cell.seconds:,.0f} req/s, "
                    f"p50 {cell.p(50):.2f} ms, p99 {cell.p(99):.2f} ms",
                    flush=True,
                )
                sdk.append(cell)
            for c in connections:
                for t in servers:
                    cell = wrk_cell(t, c, args.seconds, work)
                    print(
                        f"{t.name}, {c} connections: {cell.rate:,.0f} req/s, p99 "
                        f"{cell.p99_ms:.1f} ms, max {cell.max_ms:.0f} ms, past 1 s "
                        f"{cell.past_1s}, server {cell.server_us:.1f} us/entity, Redis "
                        f"{cell.redis_us:.1f}",
                        flush=True,
                    )
                    http.append(cell)
            codes = {"L1 off": non_200(off.rest_url), "L1 on": non_200(on.rest_url)}
            profiles = {
                "Feast's Redis store": profile(feast_repo, batches, PHASES["feast"]),
                "this project's plugin": profile(plugin_repo, batches, PHASES["plugin"]),
            }
    lines = report(args, sdk, http, loads, profiles)
    lines += [
        "",
        "Answers other than 200 in this server's metrics (api method code: count): "
        + "; ".join(f"{name}: {found or 'none'}" for name, found in codes.items()),
    ]
    save(args.out, "Feast's clients: this server against Feast's own", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), sdk, http)
    return 0


@dataclass(frozen=True)
class Loads:
    feast_seconds: float  # materialize into Feast's Redis store, in process (median)
    feast_write: float  # of which in its online_write_batch
    plugin_seconds: float  # the same into the plugin's
    plugin_write: float
    feast_bytes: float  # Redis used_memory per value
    plugin_bytes: float


def report(
    args: argparse.Namespace,
    sdk: list[SdkCell],
    http: list[HttpCell],
    loads: Loads,
    profiles: dict[str, list[tuple[str, float]]],
) -> list[str]:
    base_sdk = sdk[0]
    lines = [
        *header(
            f"Feast 0.67.0. {args.entities:,} entities of the standard shape; batches of "
            f"{BATCH} zipfian ids x all 50 features; {args.seconds:g} s per cell; each "
            "server one worker; L1 on: 1 s TTL (many expiries per window)."
        ),
        "",
        "## Feast's Python SDK, one client back to back",
        "",
        "| path | requests | req/s | p50 ms | p99 ms | max ms | p50 vs Feast's own |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sdk:
        lines.append(
            f"| {c.name} | {c.requests:,} | {c.requests / c.seconds:,.0f} | {c.p(50):.2f} | "
            f"{c.p(99):.2f} | {max(c.latencies_ms):.1f} | {base_sdk.p(50) / c.p(50):.2f}x |"
        )
    plugin = next(c for c in sdk if c.name == PLUGIN_CELL)
    lines += [
        "",
        f"The plugin against Feast's own store: p50 {base_sdk.p(50) / plugin.p(50):.2f}x "
        f"faster, p99 {base_sdk.p(99) / plugin.p(99):.2f}x.",
        "",
        f"## Loading and memory (the same parquet; `materialize` of every row through "
        f"Feast's SDK in process, median of {MATERIALIZE_ROUNDS} alternated rounds)",
        "",
        "| online store | materialize s | rows/s | of which online_write_batch s "
        "| Redis bytes per value |",
        "|---|---:|---:|---:|---:|",
        f"| Feast's Redis store | {loads.feast_seconds:.2f} | "
        f"{args.entities / loads.feast_seconds:,.0f} | {loads.feast_write:.2f} | "
        f"{loads.feast_bytes:.1f} |",
        f"| this project's plugin | {loads.plugin_seconds:.2f} | "
        f"{args.entities / loads.plugin_seconds:,.0f} | {loads.plugin_write:.2f} | "
        f"{loads.plugin_bytes:.1f} |",
        "",
        f"Materialize: the plugin {loads.feast_seconds / loads.plugin_seconds:.2f}x Feast's "
        f"speed in all, {loads.feast_write / loads.plugin_write:.2f}x in the online store's "
        f"write (the rest is Feast's: reading the parquet, rows to protobuf Values); memory: "
        f"{loads.feast_bytes / loads.plugin_bytes:.2f}x less per value.",
        "",
        f"## Where a call's time goes ({PROFILE_CALLS} calls of 10 x 50 under cProfile, "
        "which slows every call; cumulative ms per call)",
        "",
    ]
    for name, phases in profiles.items():
        lines += [f"| {name} | ms per call |", "|---|---:|"]
        lines += [f"| {label} | {ms:.3f} |" for label, ms in phases]
        lines.append("")
    lines += [
        "## Feast's HTTP API under wrk (POST /get-online-features, the same bodies)",
        "",
        "| server | conn | req/s | p50 ms | p99 ms | max ms | past 1 s | timeouts | non-2xx "
        "| server µs/entity | Redis µs/entity | req/s vs feast serve |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in http:
        base = next(b for b in http if b.connections == c.connections and "feast" in b.server)
        lines.append(
            f"| {c.server} | {c.connections} | {c.rate:,.0f} | {c.p50_ms:.2f} | {c.p99_ms:.1f} "
            f"| {c.max_ms:.0f} | {c.past_1s} | {c.timeouts} | {c.errors} | {c.server_us:.1f} "
            f"| {c.redis_us:.1f} | {c.rate / base.rate:.1f}x |"
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
