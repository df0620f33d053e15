"""Partitions between hosts under load, and a checker that reads the history afterwards.

    sudo python3 benchmarks/partitions.py [--fault-seconds 5] [--failover-seconds 10]
                                          [--entities 6000] [--out FILE]

Each Redis Cluster node (3 masters, 3 replicas, cluster-node-timeout 2 s), each of two
serving deployments (one `feature-store serve` worker each: A with the L1 on, TTL 1 s; B
with it off) and the client (this process: the load and the checks) run on hosts of
their own: network namespaces on one bridge (``_netrig``), so that a fault is a partition
between hosts (packets vanish silently; connects and reads hang), not a process stopped
on one. The whole run is made once per ``--durability`` (serve's ``--write-durability``):
by default with ``replicas=1,timeout=500``, then asynchronous.

Under a steady load (per deployment a REST and a gRPC reader of 10 entities at about 25
requests/s each, 3 of them among the last written, and one writer of push writes, each
key written by one writer only and once: ``_history``), each fault lasts
``--fault-seconds`` (the two that cut a master off from its replica:
``--failover-seconds``, long enough for the replica to take over, about 5 s here, and for
serving to follow it; so does the subscription's cut, long enough for its health check),
is healed, and the cluster is waited on until it is ok again before the next:

- **master isolated**: a master cut from every host (its replica takes over);
- **master in a minority**: a master cut from the other nodes but not from the serving
  hosts, which go on writing to it until it sees that it is alone (Jepsen's classic: what
  it acknowledged meanwhile is gone once its replica has taken over, unless the write
  waited for that replica);
- **serving hosts cut from one master**: the cluster stays healthy;
- **asymmetric**: a master hears the serving hosts, but its replies to them are dropped;
- **flapping link**: the serving hosts' link to one master down and up every second;
- **slow link**: a master's link adds 50 ms plus or minus 20 ms to every round trip;
- **lossy link**: 5% of what crosses a master's link is lost and sent again (TCP's
  retransmission after 200 ms, which is what loss costs a connection);
- **subscription cut**: the serving hosts' pub/sub connections to the URL's node (where
  they follow the invalidation channel) cut silently while both deployments write, and
  their reads of that node left alone: A reads keys B writes, whose notices are lost, and
  is held to its bound all the same (the report says how often A's health check found the
  cut: ``feature_serving_invalidation_gaps_total{kind="silent"}``).

Every node sits behind a small TCP proxy on its host (``_linkproxy``) that makes the last
three: this kernel has no netem qdisc and no iptables, so delay and loss cannot be made on
the link itself, and the subscription and the reads of a node share its address.

The checker (``_history.check``) then reports per fault (what started from its beginning
to the next fault's) and deployment, and for the load before the first ("steady"): wrong
values, stale reads beyond the deployment's bound (A: the L1's TTL with its jitter; B:
none), values served marked stale, acknowledged writes lost (each key read back from the
cluster at the end), requests past their deadline (1 s, plus 100 ms), the longest
request, and the time from the heal to the first good read and to the last failed read
and write. A timeline PNG beside the markdown shows requests by outcome with the faults
shaded.

How long a write announced during such a cut is served old, with the health check and
without it: benchmarks/invalidation_gap.py. Needs root; exits 2 with the reason where
namespaces cannot be made.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import httpx
import redis
from _history import History, Read, Window, Write, check
from _netrig import NetRig, available
from _results import ROOT, header, save
from _soak_report import M, value

from feature_store import sample
from feature_store.embedded import server_config
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import serving_pb2_grpc as pb_grpc
from feature_store.store import FeatureStore

PORT = 6379
REST_PORT = 8000
GRPC_PORT = 50051
NODES = 6  # 3 masters, 3 replicas
TTL = 1.0  # deployment A's L1 TTL (seconds)
JITTER = 0.1  # the serving default: the TTL varies by +-5%
DEADLINE = 1.0  # seconds a request may take (plus _history.SLACK)
READ_RATE = 25.0  # requests/s per reader
WRITE_GAP = 0.04  # seconds between one writer's writes
RECENT = 200  # keys last written, among which readers pick RECENT_IDS of their 10 ids
# (where a stale read would show; a write drops the entity's L1 entries, so that more of
# them would leave the L1 nothing to answer with when a master is away)
RECENT_IDS = 3
STEADY = 3.0  # seconds of load before the first fault
SETTLE = 4.0  # seconds of load after the cluster is ok again, before the next fault
FAILOVERS = ("master isolated", "master in a minority")  # its replica takes over
# as long as a failover: past the subscription's health check (3 s and a PING interval)
LONG = (*FAILOVERS, "subscription cut")
FAULTS = (
    "master isolated",
    "master in a minority",
    "serving hosts cut from one master",
    "asymmetric",
    "flapping link",
    "slow link",
    "lossy link",
    "subscription cut",
)
STATUSES = {pb.PRESENT: "present", pb.MISSING: "missing", pb.STALE: "stale", pb.ERROR: "error"}
GRPC_READS: Counter[str] = Counter()  # gRPC lookups sent, by deployment
# what a master's link does in the faults made by its proxy (_linkproxy)
LINKS = {"slow link": {"delay": 0.05, "jitter": 0.02}, "lossy link": {"loss": 0.05}}
HOSTS = ["client", "serve-a", "serve-b", *(f"redis-{i}" for i in range(NODES))]


# --- the hosts ----------------------------------------------------------------------------


def start_nodes(rig: NetRig, tmp: Path) -> None:
    """Each node listens on its host's loopback behind its link (``_linkproxy``), which
    listens on the host's address, and announces that address to the cluster."""
    for i in range(NODES):
        host = f"redis-{i}"
        data = tmp / host
        data.mkdir()
        address = rig.addresses[host]
        extra = {
            "protected-mode": "no",  # the address exists only inside this rig
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "2000",
            "cluster-announce-ip": address,
            "cluster-announce-port": str(PORT),
            "cluster-announce-bus-port": str(PORT + 10000),
        }
        cfg = server_config(PORT, data, persistence=False, extra=extra)
        conf = data / "redis.conf"
        conf.write_text("".join(f"{k} {v}\n" for k, v in cfg.items()))
        rig.spawn(host, ["redis-server", str(conf)])
        link = [sys.executable, str(Path(__file__).with_name("_linkproxy.py"))]
        link += ["--listen", address, "--ports", str(PORT), str(PORT + 10000)]
        rig.spawn(host, [*link, "--control", str(control(tmp, host))])


def control(tmp: Path, host: str) -> Path:
    """The file that says what ``host``'s link does (``_linkproxy``)."""
    return tmp / f"{host}.link.json"


def node(rig: NetRig, host: str, timeout: float = 0.5) -> redis.Redis:
    """A client of one node (the caller closes it)."""
    return redis.Redis(host=rig.addresses[host], port=PORT, socket_timeout=timeout,
                       socket_connect_timeout=timeout)  # fmt: skip


def roles(rig: NetRig) -> dict[str, str]:
    """Each reachable node's role ("master" or "slave")."""
    out = {}
    for i in range(NODES):
        host = f"redis-{i}"
        try:
            with node(rig, host) as c:
                out[host] = c.execute_command("ROLE")[0].decode()
        except redis.RedisError:
            pass
    return out


def wait_until(what: str, done: Callable[[], bool], timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if done():
            return time.monotonic() - t0
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s")


def cluster_ok(rig: NetRig) -> bool:
    try:
        states = []
        for i in range(NODES):
            with node(rig, f"redis-{i}") as c:
                states.append(c.cluster("info")["cluster_state"])
        replicas = [h for h, r in roles(rig).items() if r == "slave"]
        links = []
        for host in replicas:
            with node(rig, host) as c:
                links.append(c.info("replication").get("master_link_status"))
        return states == ["ok"] * NODES and links == ["up"] * (NODES // 2)
    except redis.RedisError:
        return False


def create_cluster(rig: NetRig) -> str:
    def answers() -> bool:
        try:
            for i in range(NODES):
                with node(rig, f"redis-{i}") as c:
                    c.ping()
        except redis.RedisError:
            return False
        return True

    wait_until("the Redis nodes answering", answers, 20)
    subprocess.run(
        ["redis-cli", "--cluster", "create",
         *(f"{rig.addresses[f'redis-{i}']}:{PORT}" for i in range(NODES)),
         "--cluster-replicas", "1", "--cluster-yes"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    wait_until("the cluster ok with its replicas linked", lambda: cluster_ok(rig))
    return f"redis://{rig.addresses['redis-0']}:{PORT}?cluster=true"


def start_worker(rig: NetRig, host: str, url: str, args: list[str], tmp: Path) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FEATURE_SERVING_", "FEATURE_STORE_"))
        and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["FEATURE_SERVING_CACHE_TTL"] = str(TTL)
    address = rig.addresses[host]
    with open(tmp / f"{host}.log", "wb") as log:
        process = rig.spawn(
            host,
            [sys.executable, "-m", "feature_store.cli", "serve", "--registry", "sample",
             "--redis-url", url, "--host", address, "--port", str(REST_PORT),
             "--grpc-port", str(GRPC_PORT),
             "--workers", "1", "--log-level", "warning", *args],
            env=env, output=log, cwd=ROOT,
        )  # fmt: skip

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"serve on {host} exited: {(tmp / f'{host}.log').read_text()}")
        try:
            return httpx.get(f"http://{address}:{REST_PORT}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(f"serve on {host} ready", ready)
    return f"http://{address}:{REST_PORT}"


# --- the load -----------------------------------------------------------------------------


def reader(who: str, url: str, entities: int, recent: deque[int], history: History,
           stop: threading.Event, seed: int) -> None:  # fmt: skip
    """Lookups of 10 entities: RECENT_IDS of them among the last written (where a stale read
    would show), the rest at random."""
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=5) as http:
        while not stop.is_set():
            ids = set(rng.sample(list(recent), min(RECENT_IDS, len(recent))))
            while len(ids) < 10:
                ids.add(rng.randrange(entities))
            body = {"entity_type": sample.ENTITY, "ids": sorted(ids), "features": ["int_0"]}
            start = time.time()
            values: list[tuple[int, int | None, str]] = []
            wrong, detail = 0, ""
            try:
                r = http.post("/v1/features/get", json=body)
                ok = r.status_code == 200
                detail = "" if ok else f"{r.status_code} {r.text[:200]}"
                for row in r.json()["results"] if ok else ():
                    got, status = row["values"][0], row["statuses"][0]
                    if isinstance(got, int) and got // M != row["id"]:
                        wrong += 1
                    seq = got % M if isinstance(got, int) else None
                    values.append((row["id"], seq, status))
            except (httpx.HTTPError, ValueError) as e:
                ok, detail = False, f"{type(e).__name__} {e}"[:200]
            end = time.time()
            history.read(Read(who, start, end, ok, tuple(values), wrong, detail))
            time.sleep(max(0.0, 1 / READ_RATE - (end - start)))


def grpc_reader(who: str, url: str, entities: int, recent: deque[int], history: History,
                stop: threading.Event, seed: int) -> None:  # fmt: skip
    """``reader``'s lookups over gRPC (``url``: the deployment's REST URL, whose host serves
    gRPC on GRPC_PORT)."""
    rng = random.Random(seed)
    target = f"{url.removeprefix('http://').rsplit(':', 1)[0]}:{GRPC_PORT}"
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        while not stop.is_set():
            ids = set(rng.sample(list(recent), min(RECENT_IDS, len(recent))))
            while len(ids) < 10:
                ids.add(rng.randrange(entities))
            request = pb.GetFeaturesRequest(
                entity_type=sample.ENTITY, int_ids=sorted(ids), features=["int_0"]
            )
            start = time.time()
            GRPC_READS[who] += 1
            values: list[tuple[int, int | None, str]] = []
            wrong, ok, detail = 0, True, ""
            try:
                for row in stub.GetFeatures(request, timeout=5).rows:
                    entity, status = row.id.int_id, STATUSES.get(row.statuses[0], "?")
                    seq = None
                    if row.values[0].WhichOneof("kind") == "int_value":
                        got = row.values[0].int_value
                        wrong += got // M != entity
                        seq = got % M
                    values.append((entity, seq, status))
            except grpc.RpcError as e:
                ok = False
                detail = f"{e.code().name} {e.details()}"[:200]  # type: ignore[attr-defined]
            end = time.time()
            history.read(Read(who, start, end, ok, tuple(values), wrong, detail))
            time.sleep(max(0.0, 1 / READ_RATE - (end - start)))


def writer(who: str, url: str, keys: list[int], recent: deque[int], history: History,
           stop: threading.Event) -> None:  # fmt: skip
    """Push writes of ``keys`` in turn, each once (the run is sized so that they do not
    run out: a key written once was lost exactly when Redis does not hold it at the end);
    a second round, should one come, writes the next number."""
    with httpx.Client(base_url=url, timeout=5) as http:
        for i in itertools.count():
            if stop.is_set():
                return
            key, seq = keys[i % len(keys)], 1 + i // len(keys)
            rows = [{"id": key, "values": {"int_0": value(key, seq)}}]
            start = time.time()
            try:
                r = http.post("/v1/features/write", json={"group": sample.GROUP, "rows": rows})
                acked = r.status_code == 200
            except httpx.HTTPError:
                acked = False
            end = time.time()
            history.wrote(Write(who, key, seq, start, end, acked))
            recent.append(key)
            time.sleep(max(0.0, WRITE_GAP - (end - start)))


# --- the faults ---------------------------------------------------------------------------


def a_master(rig: NetRig) -> str:
    """A master other than the node the URL names (the first contact, which the workers'
    pub/sub uses): the faults leave that one alone."""
    return sorted(h for h, r in roles(rig).items() if r == "master" and h != "redis-0")[0]


def fault(rig: NetRig, name: str, seconds: float, tmp: Path) -> str:
    """Make the fault ``name`` for ``seconds``, then heal it; what it was done to."""
    master = a_master(rig)
    serving = ("serve-a", "serve-b")
    if name in LINKS:
        link = control(tmp, master)
        link.write_text(json.dumps(LINKS[name]))
        time.sleep(seconds)
        link.unlink()
        return master
    if name == "subscription cut":  # the workers follow the channel on the URL's node
        link = control(tmp, "redis-0")
        link.write_text(json.dumps({"freeze_subscribers": True}))
        time.sleep(seconds)
        link.unlink()
        return "redis-0"
    if name == "master isolated":
        rig.isolate(master)
    elif name == "master in a minority":
        for other in (h for h in HOSTS if h.startswith("redis-") and h != master):
            rig.cut(master, other)
    elif name == "serving hosts cut from one master":
        for host in serving:
            rig.cut(host, master)
    elif name == "asymmetric":
        for host in serving:
            rig.drop(master, host)
    elif name == "flapping link":
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for host in serving:
                rig.cut(host, master)
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            rig.heal()
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        return master
    else:
        raise ValueError(f"unknown fault {name!r}: one of {', '.join(FAULTS)}")
    time.sleep(seconds)
    rig.heal()
    return master


# --- the run ------------------------------------------------------------------------------


def run(faults: list[str], seconds: float, failover_seconds: float, entities: int,
        durability: str, tmp: Path) -> dict[str, object]:  # fmt: skip
    with NetRig(HOSTS) as rig:
        start_nodes(rig, tmp)
        rig.enter("client")
        url = create_cluster(rig)
        with FeatureStore.connect(url, sample.registry()) as store:
            rows = [(e, {**sample.features(e), "int_0": value(e, 0)}) for e in range(entities)]
            store.write(sample.GROUP, rows)
        common = ["--write-durability", durability] if durability else []
        urls = {
            "A": start_worker(rig, "serve-a", url, common, tmp),
            "B": start_worker(rig, "serve-b", url, [*common, "--no-cache"], tmp),
        }
        history, stop = History(), threading.Event()
        GRPC_READS.clear()
        recent: deque[int] = deque(maxlen=RECENT)
        threads = []
        for i, (who, at) in enumerate(urls.items()):
            keys = list(range(i, entities, len(urls)))  # one writer per key
            threads.append(
                threading.Thread(target=writer, args=(who, at, keys, recent, history, stop))
            )
            for j, read in enumerate((reader, grpc_reader)):
                args = (who, at, entities, recent, history, stop, 10 * i + j)
                threads.append(threading.Thread(target=read, args=args))
        for t in threads:
            t.start()
        made: list[tuple[str, float, float]] = []  # each fault's name, start and heal
        done = []
        try:
            time.sleep(STEADY)  # steady load before the first fault
            for name in faults:
                start = time.time()
                lasts = failover_seconds if name in LONG else seconds
                gaps = silent_gaps(urls["A"])
                target = fault(rig, name, lasts, tmp)
                made.append((name, start, time.time()))
                ok_after = wait_until("the cluster ok after the heal", lambda: cluster_ok(rig))
                done.append(
                    {"fault": name, "target": target, "ok_after_heal_s": ok_after,
                     "silent_gaps_a": silent_gaps(urls["A"]) - gaps}
                )  # fmt: skip
                print(f"{name} ({target}): ok {ok_after:.1f} s after the heal", flush=True)
                time.sleep(SETTLE)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        ends = [start for _, start, _ in made[1:]] + [time.time()]
        windows = [Window(n, s, h, e) for (n, s, h), e in zip(made, ends, strict=True)]
        with FeatureStore.connect(url, sample.registry()) as store:
            got = store.read(sample.ENTITY, list(range(entities)), ["int_0"]).as_dicts()
        final = {e: int(row["int_0"]) % M for e, row in enumerate(got)}  # type: ignore[arg-type]
    bounds = {"A": TTL * (1 + JITTER / 2) + 0.1, "B": 0.1}
    tallies = check(history, windows, final, bounds, DEADLINE)
    return {
        "durability": durability or "asynchronous",
        "faults": done,
        "grpc_reads": dict(GRPC_READS),
        "windows": [asdict(w) for w in windows],
        "tallies": {n: {who: asdict(t) for who, t in ts.items()} for n, ts in tallies.items()},
        "timeline": timeline(history, windows),
    }


def silent_gaps(url: str) -> float:
    """The silent gaps of its subscription a deployment has found
    (``feature_serving_invalidation_gaps_total{kind="silent"}``)."""
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("feature_serving_invalidation_gaps_total") and 'kind="silent"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def timeline(history: History, windows: list[Window], step: float = 0.5) -> dict[str, object]:
    """Requests per ``step`` seconds by deployment and outcome, from the first request."""
    t0 = min((r.start for r in history.reads), default=0.0)
    counts: dict[str, list[int]] = {}
    for r in history.reads:
        kind = (
            "ok"
            if r.ok and all(s == "present" for *_, s in r.values)
            else ("stale" if r.ok else "failed")
        )
        series = counts.setdefault(f"{r.who} {kind}", [])
        i = int((r.start - t0) / step)
        series.extend([0] * (i + 1 - len(series)))
        series[i] += 1
    return {"step": step, "series": counts,
            "faults": [(w.name, w.start - t0, w.heal - t0) for w in windows]}  # fmt: skip


# --- the report ---------------------------------------------------------------------------


COLUMNS = (
    "reads", "failed_reads", "stale_marked", "stale_beyond_bound", "wrong_values", "writes",
    "failed_writes", "lost_writes", "past_deadline",
)  # fmt: skip


HEALS = (
    ("heal_to_good_read", "heal→good read s"),
    ("heal_to_last_failed_read", "heal→last failed read s"),
    ("heal_to_last_failed_write", "heal→last failed write s"),
)


def markdown(results: list[dict[str, object]], command: list[str]) -> list[str]:
    lines = [*command, ""]
    lost = [f"{r['durability']}: {lost_writes(r):,}" for r in results]
    lines += [f"Acknowledged writes lost, every fault together: {'; '.join(lost)}.", ""]
    head = ["fault", "deployment", *COLUMNS, "max ms", *(h for _, h in HEALS)]
    for result in results:
        lines += [f"## Write durability `{result['durability']}`", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        tallies: dict[str, dict[str, dict[str, Any]]] = result["tallies"]  # type: ignore[assignment]
        for name in ["steady", *(f["fault"] for f in result["faults"])]:  # type: ignore[attr-defined]
            for who, t in sorted(tallies.get(name, {}).items()):
                cells = [name, "A (L1 on)" if who == "A" else "B (L1 off)"]
                cells += [f"{t[c]:,}" for c in COLUMNS]
                cells.append(f"{t['max_seconds'] * 1000:.0f}")
                for c, _ in HEALS:
                    cells.append("-" if t[c] is None else f"{t[c]:.2f}")
                lines.append("| " + " | ".join(cells) + " |")
        found = [f"{f['fault']} {f['silent_gaps_a']:.0f}" for f in result["faults"]]  # type: ignore[attr-defined]
        lines += ["", "A's silent subscription gaps found, by fault: " + ", ".join(found) + "."]
        said = [
            f"- {name}, {who}: {example}"
            for name, ts in tallies.items()
            for who, t in sorted(ts.items())
            for example in t["examples"]
        ]
        if said:
            lines += ["", "The first of what was past its deadline, wrong or lost:", "", *said]
        lines.append("")
    return lines


def lost_writes(result: dict[str, object]) -> int:
    tallies: dict[str, dict[str, dict[str, int]]] = result["tallies"]  # type: ignore[assignment]
    return sum(t["lost_writes"] for ts in tallies.values() for t in ts.values())


def plot(results: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(r, who) for r in results for who in ("A", "B")]
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 2.6 * len(rows)), squeeze=False)
    for ax, (result, who) in zip(axes[:, 0], rows, strict=True):
        tl: dict[str, object] = result["timeline"]  # type: ignore[assignment]
        step: float = tl["step"]  # type: ignore[assignment]
        for kind, color in (("ok", "tab:green"), ("stale", "tab:orange"), ("failed", "tab:red")):
            series = tl["series"].get(f"{who} {kind}", [])  # type: ignore[attr-defined]
            ax.plot([i * step for i in range(len(series))], [n / step for n in series],
                    color=color, label=kind)  # fmt: skip
        for name, start, heal in tl["faults"]:  # type: ignore[attr-defined]
            ax.axvspan(start, heal, color="grey", alpha=0.2)
            ax.text(start + 0.2, 2, name, fontsize=7, rotation=90, va="bottom")
        l1 = "L1 on" if who == "A" else "L1 off"
        ax.set_title(f"{who} ({l1}), write durability {result['durability']}", fontsize=9)
        ax.set_ylabel("reads/s")
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds (faults shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fault-seconds", type=float, default=5.0)
    p.add_argument("--failover-seconds", type=float, default=10.0)
    p.add_argument("--entities", type=int, default=6000, help="enough that no key is written twice")
    p.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    p.add_argument(
        "--durability",
        nargs="+",
        default=["replicas=1,timeout=500", ""],
        help="serve's --write-durability, a run each ('' for asynchronous writes)",
    )
    p.add_argument("--out", type=Path, help="markdown results (and a PNG beside it)")
    p.add_argument("--json", type=Path, help="the whole result, for a test")
    args = p.parse_args()
    why = available()
    if why is not None:
        print(f"partitions.py needs network namespaces: {why}", file=sys.stderr)
        return 2
    # stopped (a test's timeout, kill): the rig's processes and namespaces go all the same
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for durability in args.durability:
        with tempfile.TemporaryDirectory(prefix="partitions-") as d:
            results.append(
                run(args.faults, args.fault_seconds, args.failover_seconds, args.entities,
                    durability, Path(d))
            )  # fmt: skip
    setup = (
        f"Redis Cluster 3+3 and two serving hosts in network namespaces; "
        f"{args.entities:,} entities; each fault {args.fault_seconds:.0f} s, "
        f"those with a failover, and the subscriptions' cut, {args.failover_seconds:.0f} s."
    )
    save(args.out, "Partitions between hosts under load", markdown(results, header(setup)))
    if args.json is not None:
        args.json.write_text(json.dumps(results))
    if args.out is not None:
        plot(results, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
