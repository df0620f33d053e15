"""Where a serving worker's CPU goes: py-spy samples of one worker under wrk or h2load load.

    python3 benchmarks/profile_serving.py [--api rest|grpc] [--seconds 8] [--out FILE]

One `feature-store serve` worker (REST: batches of 10 x all 50 features of the standard
shape, zipfian ids over 100,000 entities, 8 connections from wrk; gRPC: one such batch,
8 connections from h2load), L1 off, then on (after a warm-up), then on with a TTL of 1 ms,
so that nearly every lookup misses and loads through the L1's policy. `py-spy record` samples
the worker at 500 Hz; the report lists the functions with the most samples of their own
(time in C called from them counts as theirs: an orjson or native call is its caller's
self time), and the share of a few paths. py-spy sees Python threads only, so the CPU of
each of the worker's threads over the window (/proc/<pid>/task) comes first: the native
gRPC front's thread ("grpc-front") is not in the samples.
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import orjson
from _results import header, save
from cost import wrk_script
from serving import add_data_dir, ensure_data, id_batches

from feature_store import sample
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess

PATHS = {  # frame name prefixes -> what they stand for
    ("NativeRoundTrip.__call__", "PackedRoundTrip.__call__"): (
        "the Redis round trip (reading the reply included)"
    ),
    ("GroupFormat.load",): "stored values to their answer bytes (native, at load)",
    ("whole_group_rows", "_whole_group_rows", "_picked_rows"): "the REST answer's rows",
    ("answer_rows", "_answer_rows"): "the gRPC answer's rows",
    ("NativeFront.answer", "FeatureServicer.get_features"): (
        "the gRPC method (lookup and answer bytes included)"
    ),
    ("NativeRestFront.answer",): "the REST method (lookup and answer bytes included)",
    ("CachedReader.get", "SingleFlight._load", "Batches._read_chunk", "StoreReads."): (
        "the L1 and the read path (round trip and decoding included)"
    ),
    ("NativeHits.drain",): "hits the fronts answered, counted (metrics, refresh notes)",
    ("QueuedCalls.load",): "a front's lookup with misses: its keys loaded into the L1",
    ("GroupSpec.entry",): "loaded values to a cache entry (the native decode included)",
    ("LRUCache.put_many", "NativeCache.put_many"): "entries stored in the L1",
    ("HttpToolsProtocol", "RequestResponseCycle.send"): "uvicorn: HTTP parsing, socket writes",
}


def _frame(text: str) -> str:
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", text)
    if not m:
        return text
    name, path = m.groups()
    path = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", path)
    return f"{name} ({re.sub(r'.*/feature_store/', 'feature_store/', path)})"


def thread_cpu(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds (user + system) of each thread of ``pid``, by (thread id, name)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            out[(tid, name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def profile(
    redis: EmbeddedRedis, args: list[str], seconds: float, script: Path, api: str
) -> list[str]:
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    raw = script.with_name("samples.txt")
    with ServingProcess(redis.url, args=args, env=env, grpc=api == "grpc") as server:
        assert server.process is not None
        if api == "rest":
            url = f"{server.rest_url}/v1/features/get"
            load = ["wrk", "-t1", "-c8", "-s", str(script), url]
            duration = "-d"
        else:  # h2load sends one body: one batch of 10 (a gRPC frame of the request)
            load = [
                *("h2load", "-c8", "-m1", "--data", str(script.with_name("request.bin"))),
                *("-H", "content-type: application/grpc", "-H", "te: trailers"),
                f"http://{server.grpc_target}/feature_store.v1.FeatureService/GetFeatures",
            ]
            duration = "-D"
        if "--no-cache" not in args:  # fill the L1
            subprocess.run([*load, duration, "3"], capture_output=True, check=True)
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                *("record", "--pid", str(server.process.pid), "--duration", f"{seconds:g}"),
                *("--rate", "500", "--format", "raw", "--output", str(raw), "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        before = thread_cpu(server.process.pid)
        subprocess.run([*load, duration, f"{seconds + 1:g}"], capture_output=True, check=True)
        after = thread_cpu(server.process.pid)
        spy.wait()
    used: Counter[str] = Counter()
    for (tid, name), cpu in after.items():
        used[name] += cpu - before.get((tid, name), 0.0)
    busy = sum(used.values()) or 1.0
    own: Counter[str] = Counter()
    within: Counter[tuple[str, ...]] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for prefixes in PATHS:
            if any(f.startswith(prefixes) for f in frames):
                within[prefixes] += n
    lines = ["| thread | CPU share of the worker |", "|---|---:|"]
    lines += [f"| {name} | {100 * cpu / busy:.1f}% |" for name, cpu in used.most_common(4)]
    lines += ["", f"{total:,} samples (Python threads).", ""]
    lines += ["| share | function (self time) |", "|---:|---|"]
    lines += [f"| {100 * n / total:.1f}% | `{f}` |" for f, n in own.most_common(15)]
    lines += ["", "| share | path (inclusive) |", "|---:|---|"]
    lines += [f"| {100 * within[p] / total:.1f}% | {what} |" for p, what in PATHS.items()]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--api", choices=["rest", "grpc"], default="rest")
    parser.add_argument("--out", type=Path, help="write the results as markdown here")
    add_data_dir(parser)
    args = parser.parse_args()
    if (
        shutil.which("wrk") is None
        or shutil.which("h2load") is None
        or shutil.which(str(Path(sys.executable).parent / "py-spy")) is None
    ):
        raise SystemExit("needs wrk, h2load and py-spy: run ./scripts/setup.sh")
    bodies = [
        orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        for ids in id_batches(100_000, 10, 1000)
    ]
    loader = "wrk" if args.api == "rest" else "h2load"
    lines = header(
        f"One {args.api} worker, batch 10 x 50, 8 {loader} connections, py-spy at 500 Hz."
    )
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, 100_000)
        script = wrk_script(Path(tmp) / "post.lua", bodies)
        request = pb.GetFeaturesRequest(
            entity_type=sample.ENTITY, int_ids=id_batches(100_000, 10, 1)[0], groups=[sample.GROUP]
        ).SerializeToString()
        Path(tmp, "request.bin").write_bytes(b"\x00" + len(request).to_bytes(4, "big") + request)
        for title, serve_args in (
            ("L1 off", ["--no-cache"]),
            ("L1 on", ["--cache-ttl", "3600"]),
            ("L1 on, nearly every lookup a miss (TTL 1 ms)", ["--cache-ttl", "0.001"]),
        ):
            found = profile(redis, serve_args, args.seconds, script, args.api)
            lines += ["", f"## {title}", "", *found]
    save(args.out, "Where a serving worker's CPU goes", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
