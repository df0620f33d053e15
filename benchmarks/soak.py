"""Serving under faults for a long while: no wrong value, no 500, nothing lost, nothing leaking.

    python3 benchmarks/soak.py [--minutes 10] [--entities 5000] [--out FILE] [--json FILE]

A Redis Cluster of 3 masters and 3 replicas on loopback (cluster-node-timeout 2 s) holds
the standard shape's group for ``--entities`` entities, whose ``int_0`` says which entity
and which write it came from (``entity * 1,000,000 + write number``). Two deployments of
`feature-store serve --workers 2` read it: A with the L1 on (TTL 5 s, so that entries
expire and refresh many times inside the run), B with the L1 off. For the whole run:

- **Reads**: one REST and one gRPC client per deployment, each about 40 requests/s of 10
  random entities. The oracle checks every value: it must be one that was written for
  that entity (the initial value, a push write's, or the nightly job's), never another
  entity's or one never written. Every answer's status is recorded: no 500 and no gRPC
  INTERNAL anywhere.
- **Push writes** from a writer process (alternately through A and B), with
  ``--write-durability replicas=1,timeout=500`` on both deployments by default: each
  acknowledged write is then read back from both deployments on fresh connections (so
  from either worker) until three reads in a row serve it or something newer; the time
  from the acknowledgement to the first of those is its freshness, and one never served
  within 10 s is lost. Without durability (``--write-durability ''``) a write that the
  SIGSTOPped master takes as it resumes, before it learns its replica took over, is
  acknowledged and then dropped (Redis's asynchronous replication): the test saw it.
- **Faults on a schedule**: a master SIGKILLed (its replica takes over; the killed node
  is then started again and rejoins as the new master's replica), one of A's
  workers SIGKILLed (uvicorn starts another), a master SIGSTOPped for 5 s, and the nightly
  Spark job (local[2]) writing the group for every entity.
- **Resources**: RSS and open file descriptors of each deployment (supervisor and workers)
  every 2 s; the drift is the mean of the last fifth of the run against the fifth after
  warm-up.

Reported: per fault, the window of failed requests after it and their kinds; wrong values;
500s; the freshness distribution per deployment; RSS and fd drift; and a timeline PNG
(requests/s, failures/s, p99 latency, RSS) beside the markdown file.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import orjson
from _results import header, save
from _soak_report import (
    FRESH_TIMEOUT,
    NIGHTLY,
    STOP_SECONDS,
    Fault,
    M,
    Observations,
    analyse,
    markdown,
    plot,
    value,
)
from cost import rss

from feature_store import sample
from feature_store.embedded import EmbeddedCluster, EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import serving_pb2_grpc as pb_grpc
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

READ_RATE = 40.0  # requests/s per reading client
FRESH_READS = 3  # reads in a row (fresh connections) that must serve a write
SAMPLE_EVERY = 2.0  # seconds between RSS / fd samples
# push writes wait for a replica: without it, a write a SIGSTOPped master takes as it
# resumes, before it learns its replica took over, is acknowledged and then lost
DURABILITY = "replicas=1,timeout=500"


# --- the writer process -------------------------------------------------------------------


def writer(urls: list[str], entities: int, log_path: str, seconds: float, seed: int) -> None:
    """Push writes until ``seconds`` pass; each attempt and each ack goes to ``log_path``
    (JSON lines) before the next write, then the write is read back from every URL."""
    rng = random.Random(seed)
    seqs: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    with open(log_path, "ab", buffering=0) as log, httpx.Client(timeout=5) as http:
        i = 0
        while time.monotonic() < deadline:
            e = rng.randrange(entities)
            seqs[e] += 1
            seq = seqs[e]
            target = urls[i % len(urls)]
            i += 1
            log.write(orjson.dumps({"e": e, "seq": seq, "sent": time.time()}) + b"\n")
            body = {"group": sample.GROUP, "rows": [{"id": e, "values": {"int_0": value(e, seq)}}]}
            try:
                status = http.post(f"{target}/v1/features/write", json=body).status_code
            except httpx.HTTPError as error:
                status = type(error).__name__
            acked = time.time()
            record: dict[str, object] = {"e": e, "seq": seq, "status": status, "acked": acked}
            if status == 200:
                record["fresh"] = served_after(urls, e, seq, acked)
            log.write(orjson.dumps(record) + b"\n")
            time.sleep(0.05)


def served_after(urls: list[str], e: int, seq: int, acked: float) -> list[float | None]:
    """Per URL, seconds from the ack until it served the write (or newer) on FRESH_READS
    fresh connections in a row, from the first of them; None if not within FRESH_TIMEOUT.
    Each URL is read by a thread of its own, so that one's delay has no other's reads."""
    out: list[float | None] = [None] * len(urls)

    def probe(i: int) -> None:
        out[i] = _served_after(urls[i], e, seq, acked)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _served_after(url: str, e: int, seq: int, acked: float) -> float | None:
    body = {"entity_type": sample.ENTITY, "ids": [e], "features": ["int_0"]}
    first, run = None, 0
    while time.time() - acked < FRESH_TIMEOUT:
        t = time.time()
        try:  # a fresh connection each time: either worker may answer
            r = httpx.post(f"{url}/v1/features/get", json=body, timeout=2)
            got = r.json()["results"][0]["values"][0] if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError):
            got = None
        if isinstance(got, int) and got % M >= seq:
            first = t if run == 0 else first
            run += 1
            if run == FRESH_READS:
                return max(0.0, (first or t) - acked)
        else:
            run = 0
            time.sleep(0.005)
    return None


# --- the readers --------------------------------------------------------------------------


def rest_reader(
    who: str, url: str, entities: int, obs: Observations, stop: threading.Event, seed: int
) -> None:
    rng = random.Random(seed)
    http = httpx.Client(base_url=url, timeout=5)
    while not stop.is_set():
        ids = rng.sample(range(entities), 10)
        body = {"entity_type": sample.ENTITY, "ids": ids, "features": ["int_0", "float_00"]}
        start = time.monotonic()
        detail = ""
        try:
            r = http.post("/v1/features/get", json=body)
            outcome = str(r.status_code)
            values = (
                [(row["id"], row["values"][0]) for row in r.json()["results"]]
                if r.status_code == 200
                else []
            )
            if r.status_code != 200:
                detail = r.text
        except httpx.HTTPError as error:
            outcome, values, detail = type(error).__name__, [], str(error)
            http.close()
            http = httpx.Client(base_url=url, timeout=5)
        obs.record(who, outcome, start, values, detail)
        time.sleep(max(0.0, 1 / READ_RATE - (time.monotonic() - start)))
    http.close()


def grpc_reader(
    who: str, target: str, entities: int, obs: Observations, stop: threading.Event, seed: int
) -> None:
    rng = random.Random(seed)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
        while not stop.is_set():
            ids = rng.sample(range(entities), 10)
            request = pb.GetFeaturesRequest(
                entity_type=sample.ENTITY, int_ids=ids, features=["int_0", "float_00"]
            )
            start = time.monotonic()
            detail = ""
            try:
                response = stub.GetFeatures(request, timeout=5)
                outcome = "OK"
                values: list[tuple[int, object]] = []
                for row in response.rows:
                    kind = row.values[0].WhichOneof("kind")
                    values.append(
                        (row.id.int_id, None if kind is None else row.values[0].int_value)
                    )
            except grpc.RpcError as error:
                outcome, values = error.code().name, []  # type: ignore[attr-defined]
                detail = str(error.details())  # type: ignore[attr-defined]
            obs.record(who, outcome, start, values, detail)
            time.sleep(max(0.0, 1 / READ_RATE - (time.monotonic() - start)))


# --- processes: resources, faults ---------------------------------------------------------


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def resources(pids: list[int]) -> tuple[int, int]:
    """RSS bytes and open fds of these processes, summed."""
    held = fds = 0
    for pid in pids:
        try:
            held += rss(pid)
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return held, fds


def workers_of(server: ServingProcess) -> list[int]:
    assert server.process is not None
    # serve --workers N: uvicorn's supervisor, whose children are the workers (and its
    # multiprocessing helper, which has no children of its own and takes no requests)
    return children(server.process.pid)


def kill_master(cluster: EmbeddedCluster, keep: EmbeddedRedis) -> str:
    """SIGKILL a master; once its replica has taken over, start it again (as a deployment's
    supervisor would), so that it rejoins as the new master's replica: durable writes to
    that shard need one."""
    victim = next(n for n in cluster.master_nodes() if n is not keep)
    victim.kill()
    took = cluster.wait_ok()
    t0 = time.monotonic()
    victim.restart()
    victim.wait_replica()
    return (
        f"port {victim.port}; the cluster was ok again after {took:.1f} s; restarted, a "
        f"synced replica {time.monotonic() - t0:.1f} s later"
    )


def kill_worker(server: ServingProcess) -> str:
    pids = [p for p in workers_of(server) if children(p) == [] and _is_worker(p)]
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    return f"pid {victim}"


def _is_worker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_master(cluster: EmbeddedCluster, keep: EmbeddedRedis) -> str:
    victim = next(n for n in cluster.master_nodes() if n is not keep)
    assert victim.process is not None
    os.kill(victim.process.pid, signal.SIGSTOP)
    time.sleep(STOP_SECONDS)
    os.kill(victim.process.pid, signal.SIGCONT)
    took = cluster.wait_ok()
    return f"port {victim.port} for {STOP_SECONDS:.0f} s; the cluster was ok {took:.1f} s later"


def nightly(cluster: EmbeddedCluster, tmp: Path, entities: int, log: Path) -> str:
    """The nightly Spark job over the group: every entity's int_0 set to its NIGHTLY value."""
    data = tmp / "nightly.json"
    with data.open("wb") as f:
        for e in range(entities):
            f.write(orjson.dumps({"id": e, "int_0": value(e, NIGHTLY)}) + b"\n")
    registry = tmp / "features.yaml"
    registry.write_text(sample.registry_text())
    report = tmp / "nightly-report.json"
    t0 = time.monotonic()
    with log.open("ab") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "feature_store.cli",
                "ingest",
                *("--registry", str(registry), "--group", sample.GROUP),
                *("--input", str(data), "--format", "json", "--id-column", "id"),
                *("--redis-url", cluster.url, "--master", "local[2]"),
                *("--allow-missing-features", "--report", str(report)),
                *("--progress-interval", "0"),
            ],
            stdout=out,
            stderr=out,
            timeout=600,
            check=False,
        )
    took = time.monotonic() - t0
    if done.returncode != 0:
        return f"FAILED (exit {done.returncode}) after {took:.0f} s; see {log}"
    written = orjson.loads(report.read_bytes()).get("entities_written", "?")
    return f"{written} entities written in {took:.0f} s (Spark start included)"


# --- the run ------------------------------------------------------------------------------


def run(minutes: float, entities: int, tmp: Path, durability: str) -> dict[str, object]:
    seconds = minutes * 60
    schedule = [
        ("master SIGKILLed (failover)", 0.15),
        ("serving worker SIGKILLed (A)", 0.35),
        (f"master SIGSTOPped {STOP_SECONDS:.0f} s", 0.55),
        ("nightly Spark job", 0.7),
    ]
    with EmbeddedCluster(tmp / "cluster", replicas=1, node_timeout_ms=2000) as cluster:
        keep = cluster.nodes[0]  # the node the URL names (pub/sub, first contact) stays up
        with FeatureStore.connect(cluster.url, sample.registry()) as store:
            rows = [(e, {**sample.features(e), "int_0": value(e, 0)}) for e in range(entities)]
            store.write(sample.GROUP, rows)
        common = ["--workers", "2", "--log-level", "warning"]
        if durability:  # push writes acknowledged once a replica holds them
            common += ["--write-durability", durability]
        env = {"FEATURE_SERVING_CACHE_TTL": "5"}
        with (
            ServingProcess(cluster.url, args=common, env=env, log_path=tmp / "a.log") as a,
            ServingProcess(cluster.url, args=[*common, "--no-cache"], log_path=tmp / "b.log") as b,
        ):
            time.sleep(2.0)  # both workers of each deployment up
            t0 = time.monotonic()
            wall0 = time.time()
            obs = Observations(t0)
            stop = threading.Event()
            readers = [
                threading.Thread(
                    target=rest_reader, args=("A rest", a.rest_url, entities, obs, stop, 1)
                ),
                threading.Thread(
                    target=grpc_reader, args=("A grpc", a.grpc_target, entities, obs, stop, 2)
                ),
                threading.Thread(
                    target=rest_reader, args=("B rest", b.rest_url, entities, obs, stop, 3)
                ),
                threading.Thread(
                    target=grpc_reader, args=("B grpc", b.grpc_target, entities, obs, stop, 4)
                ),
            ]
            for t in readers:
                t.start()
            write_log = tmp / "writes.jsonl"
            writer_proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--writer",
                    json.dumps([a.rest_url, b.rest_url]),
                    "--entities",
                    str(entities),
                    "--write-log",
                    str(write_log),
                    "--minutes",
                    str(minutes),
                ]
            )

            def act(fault: Fault) -> None:
                act_on(fault)
                fault.lasted = time.monotonic() - t0 - fault.at

            def act_on(fault: Fault) -> None:
                if fault.name.startswith("master SIGKILLed"):
                    fault.detail = kill_master(cluster, keep)
                elif fault.name.startswith("serving worker"):
                    fault.detail = kill_worker(a)
                elif fault.name.startswith("master SIGSTOPped"):
                    fault.detail = stop_master(cluster, keep)
                else:
                    fault.detail = nightly(cluster, tmp, entities, tmp / "nightly.log")

            samples: list[tuple[float, str, int, int]] = []
            faults: list[Fault] = []
            pending = list(schedule)
            next_sample = 0.0
            nightly_started: float | None = None
            threads: list[threading.Thread] = []
            try:
                while (now := time.monotonic() - t0) < seconds:
                    if now >= next_sample:
                        for name, server in (("A", a), ("B", b)):
                            assert server.process is not None
                            pids = [server.process.pid, *workers_of(server)]
                            rss, fds = resources(pids)
                            samples.append((now, name, rss, fds))
                        next_sample = now + SAMPLE_EVERY
                    if pending and now >= pending[0][1] * seconds:
                        name, _ = pending.pop(0)
                        fault = Fault(name, now)
                        faults.append(fault)
                        print(f"{now:6.1f} s  {name}", flush=True)
                        if name.startswith("nightly"):
                            nightly_started = time.time()
                        thread = threading.Thread(target=act, args=(fault,))
                        thread.start()
                        threads.append(thread)
                    time.sleep(0.2)
            except BaseException:  # stopped (SIGTERM): the writer process goes too
                writer_proc.terminate()
                raise
            finally:  # the readers stop, so that the process can exit
                stop.set()
                for t in (*readers, *threads):
                    t.join(timeout=700)
                writer_proc.wait(timeout=60)
    result = analyse(obs, faults, samples, write_log, wall0, nightly_started, seconds)
    return {"write_durability": durability or "asynchronous", **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--entities", type=int, default=5000)
    parser.add_argument("--out", type=Path, help="write the results as markdown here (+ .png)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--write-durability",
        default=DURABILITY,
        help=f"the deployments' --write-durability ({DURABILITY}); '' for asynchronous "
        "replication, where a failover may lose acknowledged writes",
    )
    parser.add_argument("--writer", help=argparse.SUPPRESS)  # the writer process: its URLs
    parser.add_argument("--write-log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        writer(json.loads(args.writer), args.entities, args.write_log, args.minutes * 60, seed=7)
        return 0
    # stopped (a test's timeout, kill): its cluster and servers stop all the same, where
    # SIGTERM's default left the Redis nodes running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.minutes, args.entities, Path(tmp), args.write_durability)
    lines = markdown(result)
    print("\n".join(lines), flush=True)
    if args.json:
        summary = {k: v for k, v in result.items() if k != "timeline"}
        args.json.write_text(json.dumps(summary, indent=1))
    if args.out:
        png = args.out.with_suffix(".png")
        plot(result, png)
        head = header(
            f"A Redis Cluster of 3 masters + 3 replicas on loopback; {args.entities:,} entities "
            "of the standard shape; two `serve --workers 2` deployments (A: L1 on, TTL 5 s; "
            "B: L1 off), REST and gRPC readers at about 40 requests/s each, a writer process; "
            f"push writes with --write-durability {args.write_durability or '(none)'}."
        )
        save(args.out, "Soak under faults", [*head, "", f"![timeline]({png.name})", "", *lines])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
