"""Redis's own CPU per read under our raw-hash YCSB binding against redis-benchmark's, on
the same keys at the same concurrency: an outside check that the binding measures Redis
as Redis's own tool does.

    .venv/bin/python benchmarks/ycsb/crosscheck.py [--records 100000] [--operations 300000]
                                                    [--clients 8] [--out FILE]

YCSB's own `redis` binding is not served by the Maven mirror here, so the outside tool is
Redis's `redis-benchmark`. One Redis (embedded, no persistence) is loaded by YCSB's load
phase through the raw-hash binding (`HashClient`: one hash per record, fields named by
their xxHash32 as the project's layout names them) with ``insertorder=ordered`` and
``zeropadding=12``, so that the keys are ``u:user000000000000`` on, which is what
redis-benchmark's ``u:user__rand_int__`` expands to. Then, each with ``--clients``
connections, one command per round trip (no pipelining), unthrottled, keys drawn
uniformly:

- **HGETALL**: YCSB's core workload reading whole records (``readallfields=true``: the
  binding's HGETALL) against ``redis-benchmark -r N HGETALL u:user__rand_int__``;
- **HMGET**: reading one field (``readallfields=false``: the binding's HMGET of that field
  and the group's write time) against ``redis-benchmark HMGET`` of one such field and the
  write time.

For each, per call Redis served: the time it spent executing the command (``INFO
commandstats``), which must agree within ±15% (exit 1 otherwise); its whole CPU (utime +
stime of its process, /proc), which also pays its event loop's wakeups, so that it depends
on how fast the client sends; and how many calls each wakeup served (voluntary context
switches of its process). Each client runs ``--rounds`` times, in turn, each first every
other round; then redis-benchmark once more with fewer connections, about as fast as the
binding (the number of connections whose short runs came nearest its rate), to tell what
the request rate alone changes. Redis runs on one core and the clients on the others
(``--no-pin`` leaves them where the scheduler puts them): on a shared core the JVM's
threads and Redis take turns, and that, not the commands, is what would be measured.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
import xxhash

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import invoke  # noqa: E402
import servers  # noqa: E402
import ycsb_output  # noqa: E402

from feature_store.embedded import EmbeddedRedis, free_port  # noqa: E402

TOLERANCE = 0.15
FIELD = "field3"  # the one field redis-benchmark's HMGET asks for (YCSB's: any of ten)


def field(name: str) -> bytes:
    """A feature's field in the project's layout: its xxHash32, 4 bytes big-endian."""
    return xxhash.xxh32(name.encode(), seed=0).digest()


@dataclass
class Measured:
    calls: int
    cpu_s: float  # the process's, /proc
    usec: int  # INFO commandstats: the time Redis spent executing the command
    wall_s: float
    wakeups: int  # Redis's voluntary context switches: each a wait for the next command

    def __add__(self, other: Measured) -> Measured:
        return Measured(
            self.calls + other.calls,
            self.cpu_s + other.cpu_s,
            self.usec + other.usec,
            self.wall_s + other.wall_s,
            self.wakeups + other.wakeups,
        )

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s

    @property
    def calls_per_wakeup(self) -> float:
        return self.calls / self.wakeups if self.wakeups else float("nan")

    @property
    def us_per_call(self) -> float:
        return self.cpu_s / self.calls * 1e6 if self.calls else float("nan")

    @property
    def executing_us(self) -> float:
        return self.usec / self.calls if self.calls else float("nan")


def stats(client: redis.Redis, command: str) -> tuple[int, int]:
    """The calls of ``command`` so far, and the µs Redis spent executing them."""
    found = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(found.get("calls", 0)), int(found.get("usec", 0))


def wakeups(pid: int) -> int:
    """Redis's main thread's voluntary context switches so far (it sleeps in epoll_wait
    whenever no command is waiting)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise RuntimeError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def measured(pid: int, client: redis.Redis, command: str, run: Callable[[], None]) -> Measured:
    cpu0, (calls0, usec0), t0 = servers.cpu_seconds([pid]), stats(client, command), time.monotonic()
    woke0 = wakeups(pid)
    run()
    wall = time.monotonic() - t0
    calls1, usec1 = stats(client, command)
    return Measured(
        calls1 - calls0,
        servers.cpu_seconds([pid]) - cpu0,
        usec1 - usec0,
        wall,
        wakeups(pid) - woke0,
    )


PIN: list[str] = []  # taskset's prefix for the clients (--pin): the core Redis is not on


def ycsb(phase: str, props: dict[str, str], clients: int) -> None:
    cmd = PIN + invoke.ycsb_command("HashClient", phase, "single", props, clients, 0)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"YCSB {phase} exited {done.returncode}:\n{done.stderr[-2000:]}")
    expected = int(props["recordcount" if phase == "load" else "operationcount"])
    ycsb_output.check(done.stdout, expected, done.stderr)


def bench(port: int, clients: int, operations: int, records: int, *command: bytes) -> None:
    cmd = [a.encode() for a in PIN]
    cmd += [b"redis-benchmark", b"-p", str(port).encode(), b"-c", str(clients).encode()]
    cmd += [b"-n", str(operations).encode(), b"-r", str(records).encode(), b"-q", *command]
    done = subprocess.run(cmd, capture_output=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"redis-benchmark exited {done.returncode}: {done.stderr[-2000:]!r}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--operations", type=int, default=300_000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="runs of each client, in turn")
    p.add_argument("--out", type=Path, help="markdown results")
    p.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave Redis and the clients where the scheduler puts them (by default Redis is "
        "pinned to the first core and the clients to the others)",
    )
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) >= 2:
        PIN[:] = ["taskset", "-c", ",".join(str(c) for c in cores[1:])]
    invoke.build()
    fresh = field("__written_at__:ycsb")
    rows: list[tuple[str, Measured, Measured, int, Measured]] = []
    with tempfile.TemporaryDirectory() as tmp:
        own = EmbeddedRedis(Path(tmp) / "redis", port=free_port(), persistence=False)
        with own, redis.Redis(port=own.port or 0) as client:
            assert own.process is not None
            assert own.port is not None
            pid, port = own.process.pid, own.port
            if PIN:
                os.sched_setaffinity(pid, {cores[0]})
            props = {
                "redis.port": str(port),
                "recordcount": str(args.records),
                "operationcount": str(args.operations),
                "fs.prefix": "u",
                "fs.group": "ycsb",
            }
            print(f"loading {args.records:,} records through the binding ...", flush=True)
            ycsb("load", props, args.clients)
            if client.dbsize() != args.records or not client.exists("u:user000000000000"):
                raise SystemExit("the load did not write the keys redis-benchmark reads")
            for name, command, all_fields, shape in (
                ("HGETALL", "hgetall", "true", (b"HGETALL", b"u:user__rand_int__")),
                ("HMGET", "hmget", "false", (b"HMGET", b"u:user__rand_int__", field(FIELD), fresh)),
            ):
                run_props = {**props, "readallfields": all_fields}
                ours = theirs = Measured(0, 0.0, 0, 0.0, 0)
                for n in range(args.rounds):  # in turn, each first every other round
                    print(f"{name}: round {n + 1} of {args.rounds} ...", flush=True)
                    first, second = (0, 1) if n % 2 == 0 else (1, 0)
                    got: list[Measured] = [ours, theirs]
                    for which in (first, second):
                        if which == 0:
                            got[0] += measured(
                                pid, client, command,
                                lambda p=run_props: ycsb("run", p, args.clients),
                            )  # fmt: skip
                        else:
                            got[1] += measured(
                                pid, client, command,
                                lambda s=shape: bench(
                                    port, args.clients, args.operations, args.records, *s
                                ),
                            )  # fmt: skip
                    ours, theirs = got
                # redis-benchmark as slow as the binding: the number of connections whose
                # rate comes nearest the binding's, found by short runs
                probe = min(args.operations, 50_000)
                rates = {
                    c: measured(
                        pid, client, command,
                        lambda s=shape, c=c, n=probe: bench(port, c, n, args.records, *s),
                    ).rate
                    for c in range(1, args.clients + 1)
                }  # fmt: skip
                fewer = min(rates, key=lambda c: abs(rates[c] - ours.rate))
                slow = measured(
                    pid, client, command,
                    lambda s=shape, c=fewer: bench(port, c, args.operations, args.records, *s),
                )  # fmt: skip
                rows.append((name, ours, theirs, fewer, slow))
    load = os.getloadavg()
    given = "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    lines = [
        f"```\n$ .venv/bin/python benchmarks/ycsb/crosscheck.py{given}\n```",
        f"Load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} "
        f"cores. One Redis, {args.records:,} records of 10 fields x 100 bytes loaded by the "
        f"binding; runs of {args.operations:,} reads, {args.rounds} of each client in turn "
        "(summed below), one command per round trip, uniform keys.",
        "",
        "| command | client | calls | executing µs per call (commandstats) | ratio | Redis CPU µs "
        "per call (/proc) | ratio | calls per wakeup | reads/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    failed = []
    for name, ours, theirs, fewer, slow in rows:
        executing = ours.executing_us / theirs.executing_us
        cpu = ours.us_per_call / theirs.us_per_call
        if abs(executing - 1) > TOLERANCE:
            failed.append(name)
        for client, m, ratios in (
            (
                f"the binding, {args.clients} connections",
                ours,
                (f"{executing:.2f}x", f"{cpu:.2f}x"),
            ),
            (f"redis-benchmark, {args.clients} connections", theirs, ("1", "1")),
            (
                f"redis-benchmark, {fewer} (about the binding's rate)",
                slow,
                (
                    f"{slow.executing_us / theirs.executing_us:.2f}x",
                    f"{slow.us_per_call / theirs.us_per_call:.2f}x",
                ),
            ),
        ):
            lines.append(
                f"| {name} | {client} | {m.calls:,} | {m.executing_us:.2f} | {ratios[0]} | "
                f"{m.us_per_call:.2f} | {ratios[1]} | {m.calls_per_wakeup:.1f} | "
                f"{m.calls / m.wall_s:,.0f} |"
            )
    lines += [
        "",
        f"The time Redis spends executing each command agrees within ±{TOLERANCE:.0%}: "
        f"{'no, ' + ', '.join(failed) if failed else 'yes, every command'}. Its whole CPU per "
        "call (/proc: the command, the event loop, the socket reads and writes) depends on "
        "the clients' rate as well: a faster client leaves more commands waiting at each "
        "wakeup, and Redis pays the wakeup's system calls once for all of them (calls per "
        "wakeup), and the time a command takes grows when commands come further apart "
        "(its data has left the processor's caches meanwhile): the last row of each command "
        "is redis-benchmark with fewer connections, about as fast as the binding. So "
        "comparisons of Redis's CPU per call between bindings hold only at the same request "
        "rate. The reads/s are the clients' (a JVM's threads against a C event loop); the "
        "binding's runs include the JVM's start."
        + (
            f" Redis ran on core {cores[0]}, the clients on the others (taskset)."
            if PIN
            else " Redis and the clients shared the cores (--no-pin)."
        ),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(f"# YCSB's raw-hash binding against redis-benchmark\n\n{text}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
