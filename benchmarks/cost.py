"""Cost per lookup: server CPU per entity looked up, next to Redis's, with compiled loaders.

    python3 benchmarks/cost.py [--entities 100000] [--seconds 5] [--out FILE] [--tls]

One `feature-store serve` worker at a time (REST and gRPC; L1 off, and on after a warm-up),
batches of 10 and 100 entities x all 50 features of the standard shape, 8 connections.
The load comes from `wrk` (REST; a Lua script cycles through 1,000 zipfian batches) and
`h2load` (gRPC; one fixed batch, since h2load sends one body), both compiled, so that the
load generator does not eat the cores it measures. CPU is read from /proc/<pid>/stat of
the server and of redis-server over the measured window:

    CPU per entity = (utime + stime over the window) / (requests answered x batch)

The same run measures Redis's own cost per entity; the ratio server/Redis is the figure
to drive down. The figures feed `feature-store plan` (feature_store/capacity.py).

``--tls``: batch 10 only, each cell twice in the same run, in plaintext and with TLS on
both ports (a test CA's certificate made with openssl; wrk and h2load speak TLS, h2load
with ALPN h2; gRPC's TLS is the native front's rustls).
"""

from __future__ import annotations

import _project_env  # isort: skip  # noqa: F401  (first: re-runs this in the project .venv)

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from feature_store import sample
from feature_store.client import TlsConfig
from feature_store.embedded import EmbeddedRedis
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.process import ServingProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import PerEntity, bars, header, save
from serving import add_data_dir, ensure_data, id_batches

TICK = os.sysconf("SC_CLK_TCK")
CONNECTIONS = 8


def require_tools(*tools: str) -> None:
    """Stop with what to run when a load generator (or another tool) is not installed."""
    for tool in tools:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: run ./scripts/setup.sh")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss(pid: int) -> int:
    """The resident bytes of a process (VmRSS of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Cell(PerEntity):
    api: str
    l1: str
    tls: bool
    batch: int
    requests: int
    seconds: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int
    server_cpu: float
    redis_cpu: float


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)([a-z]+)", text)
    if m is None:
        raise ValueError(f"not a duration: {text!r}")
    value, unit = m.groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


TAIL_BOUND_US = 1_000_000  # requests slower than 1 s are counted (``tail_lua``)


def tail_lua(bound_us: int = TAIL_BOUND_US) -> str:
    """wrk's ``done``: the slowest request and how many took longer than ``bound_us``
    (found by bisecting wrk's percentiles; its timeouts are counted apart), printed as
    ``MAX_US``, ``PAST_BOUND`` and ``TIMEOUTS`` lines (``tail_of``)."""
    return f"""
done = function(summary, latency, requests)
  local past = 0
  if latency.max > {bound_us} then
    local lo, hi = 0.0, 100.0
    for _ = 1, 50 do
      local mid = (lo + hi) / 2
      if latency:percentile(mid) > {bound_us} then hi = mid else lo = mid end
    end
    past = math.floor((100 - hi) / 100 * summary.requests + 0.5)
  end
  io.write(string.format("MAX_US %d\\nPAST_BOUND %d\\nTIMEOUTS %d\\n",
    latency.max, past, summary.errors.timeout))
end
"""


def tail_of(out: str) -> tuple[float, int, int]:
    """The slowest request (ms), the count past the bound and wrk's timeouts, from the output
    of a script ending in ``tail_lua``."""
    found = [re.search(rf"{name} (\d+)", out) for name in ("MAX_US", "PAST_BOUND", "TIMEOUTS")]
    if any(m is None for m in found):
        raise SystemExit(f"unexpected wrk output:\n{out}")
    max_us, past, timeouts = (int(m.group(1)) for m in found if m is not None)
    return max_us / 1000, past, timeouts


def wrk_script(
    path: Path, bodies: list[bytes], at_random: bool = False, tail: bool = False
) -> Path:
    """A wrk Lua script that POSTs the JSON ``bodies`` in turn (or one drawn at random for
    each request); with ``tail``, ending with the slowest request and the count past 1 s
    (``tail_lua``)."""
    table = ",\n".join("[[" + b.decode() + "]]" for b in bodies)
    pick = "math.random(#bodies)" if at_random else "i"
    path.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"local bodies = {{\n{table}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #bodies + 1\n"
        f"  return wrk.format(nil, nil, nil, bodies[{pick}])\nend\n" + (tail_lua() if tail else "")
    )
    return path


def children_cpu() -> float:
    """CPU seconds of this process's finished children (the load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wrk(
    url: str, bodies: list[bytes], seconds: float, work: Path, connections: int = CONNECTIONS
) -> tuple[int, float, float, int]:
    script = wrk_script(work / "post.lua", bodies)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    latency = out[out.index("Latency Distribution") :]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", latency).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", latency).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return requests, p50, p99, int(bad.group(1)) if bad else 0


def h2load(
    target: str,
    body: bytes,
    seconds: float,
    work: Path,
    connections: int = CONNECTIONS,
    scheme: str = "http",
) -> tuple[int, float, float, int]:
    """Requests, p50 and p99 in ms (from h2load's per-request log), failures."""
    succeeded, failed, durations = h2load_log(target, body, seconds, work, connections, 1, scheme)
    return succeeded, percentile(durations, 50), percentile(durations, 99), failed


def h2load_log(
    target: str,
    body: bytes,
    seconds: float,
    work: Path,
    connections: int,
    streams: int = 1,
    scheme: str = "http",
    threads: int = 1,
) -> tuple[int, int, list[int]]:
    """GetFeatures with ``body`` for ``seconds``: requests succeeded and failed, and every
    request's duration in microseconds, sorted (h2load's per-request log)."""
    data = work / "request.bin"
    data.write_bytes(b"\x00" + len(body).to_bytes(4, "big") + body)  # gRPC message framing
    log = work / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends to it
    out = subprocess.run(
        [
            *("h2load", f"-c{connections}", f"-m{streams}", f"-t{min(threads, connections)}"),
            *("-D", f"{seconds:g}", "--data", str(data)),
            *("-H", "content-type: application/grpc", "-H", "te: trailers"),
            f"--log-file={log}",
            f"{scheme}://{target}/feature_store.v1.FeatureService/GetFeatures",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    assert m, out
    # one line per request: start (s), status, duration (us)
    durations = sorted(int(line.split()[2]) for line in log.read_text().splitlines() if line)
    return int(m.group(1)), int(m.group(2)), durations


def percentile(sorted_us: list[int], p: int) -> float:
    """The p-th percentile of sorted durations in microseconds, in milliseconds."""
    if not sorted_us:
        return 0.0
    return sorted_us[min(len(sorted_us) - 1, len(sorted_us) * p // 100)] / 1000


def make_pki(work: Path) -> tuple[list[str], TlsConfig]:
    """A test CA and a server certificate for 127.0.0.1: serve's TLS args, the client's."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=work, check=True, capture_output=True)

    key = ("-newkey", "rsa:2048", "-nodes", "-days", "1")
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ca")
    openssl("req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server")
    (work / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sign = ("-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "server.ext")
    openssl("x509", "-req", "-in", "server.csr", *sign, "-out", "server.pem", "-days", "1")
    args = ["--tls-cert", str(work / "server.pem"), "--tls-key", str(work / "server.key")]
    return args, TlsConfig(ca=str(work / "ca.pem"))


def measure(
    redis: EmbeddedRedis,
    api: str,
    l1: bool,
    batch: int,
    seconds: float,
    work: Path,
    tls: tuple[list[str], TlsConfig] | None = None,
) -> Cell:
    args = ["--cache-ttl", "3600"] if l1 else ["--no-cache"]
    if tls is not None:
        args += tls[0]
    env = {"FEATURE_SERVING_SHADOW_FRACTION": "0", "FEATURE_SERVING_WARM_START_KEYS": "0"}
    batches = id_batches(100_000, batch, count=1000)
    bodies = [
        orjson.dumps({"entity_type": sample.ENTITY, "ids": ids, "groups": [sample.GROUP]})
        for ids in batches
    ]
    grpc_body = pb.GetFeaturesRequest(
        entity_type=sample.ENTITY, int_ids=batches[0], groups=[sample.GROUP]
    ).SerializeToString()
    assert redis.process is not None
    client_tls = tls[1] if tls is not None else None
    with ServingProcess(
        redis.url, args=args, env=env, grpc=api == "grpc", tls=client_tls
    ) as server:
        assert server.process is not None
        scheme = "https" if tls is not None else "http"

        def load(window: float) -> tuple[int, float | None, float | None, int]:
            if api == "rest":
                return wrk(f"{server.rest_url}/v1/features/get", bodies, window, work)
            return h2load(server.grpc_target, grpc_body, window, work, scheme=scheme)

        if l1:
            load(2.0)  # fill the cache: the window measures hits
        s0, r0 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid)
        t0 = time.monotonic()
        requests, p50, p99, errors = load(seconds)
        elapsed = time.monotonic() - t0
        s1, r1 = cpu_seconds(server.process.pid), cpu_seconds(redis.process.pid)
    return Cell(
        api,
        "on" if l1 else "off",
        tls is not None,
        batch,
        requests,
        elapsed,
        p50,
        p99,
        errors,
        s1 - s0,
        r1 - r0,
    )


def plot(path: Path, cells: list[Cell]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c.api}{' TLS' if c.tls else ''}\nL1 {c.l1}\nbatch {c.batch}" for c in cells]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    bars(
        ax,
        labels,
        {
            "serving worker": [c.server_us for c in cells],
            "redis-server": [c.redis_us for c in cells],
        },
        title="Cost per lookup (standard shape, 8 connections)",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="markdown results; a PNG plot beside it")
    parser.add_argument(
        "--tls", action="store_true", help="batch 10, each cell in plaintext and with TLS"
    )
    add_data_dir(parser)
    args = parser.parse_args()
    require_tools("wrk", "h2load")
    cells = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(args.data_dir) as redis:
        ensure_data(redis.url, args.entities)
        pki = make_pki(Path(tmp)) if args.tls else None
        variants = [(10, None), (10, pki)] if pki else [(10, None), (100, None)]
        for api in ("rest", "grpc"):
            for l1 in (False, True):
                for batch, tls in variants:
                    cell = measure(redis, api, l1, batch, args.seconds, Path(tmp), tls)
                    print(
                        f"{api}{' TLS' if cell.tls else ''} L1 {cell.l1} batch {batch}: "
                        f"{cell.requests / cell.seconds:,.0f} "
                        f"req/s, server {cell.server_us:.1f} us/entity, "
                        f"Redis {cell.redis_us:.1f} us/entity",
                        flush=True,
                    )
                    cells.append(cell)
    lines = [
        *header(
            f"One worker; {CONNECTIONS} connections; wrk (REST), h2load (gRPC); "
            f"{args.seconds:g} s per cell."
        ),
        "",
        "| API | TLS | L1 | batch | req/s | p50 ms | p99 ms | errors | server µs/entity "
        "| Redis µs/entity | server / Redis |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        p50 = f"{c.p50_ms:.2f}" if c.p50_ms is not None else "-"
        p99 = f"{c.p99_ms:.2f}" if c.p99_ms is not None else "-"
        # with the L1 on Redis hardly works: no meaningful ratio
        ratio = f"{c.server_us / c.redis_us:.1f}x" if c.redis_us >= 0.5 else "-"
        lines.append(
            f"| {c.api} | {'yes' if c.tls else 'no'} | {c.l1} | {c.batch} | "
            f"{c.requests / c.seconds:,.0f} | {p50} | {p99} | "
            f"{c.errors} | {c.server_us:.1f} | {c.redis_us:.1f} | {ratio} |"
        )
    save(args.out, "Cost per lookup", lines)
    if args.out:
        plot(args.out.with_suffix(".png"), cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
