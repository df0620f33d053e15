"""Feast's own processes and answers, for the benchmarks that compare with them
(``feast_compat.py``): its CLI and ``feast serve`` run from the project's environment,
their CPU over a process tree, and a Feast HTTP answer read as columns."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import numpy as np
import orjson
from cost import TICK

FEAST = str(Path(sys.executable).parent / "feast")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (``feast serve``'s workers), the ones
    that ended too: a worker that gunicorn recycles (every 1,000 requests by default)
    is counted in its parent's cutime and cstime once reaped."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    family, total = {pid}, 0.0
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    for p in family:
        with suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def feast(*args: str, cwd: Path) -> None:
    done = subprocess.run([FEAST, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"feast {' '.join(args)} failed:\n{done.stderr[-2000:]}")


@contextmanager
def feast_serve(repo: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = subprocess.Popen(
        [FEAST, "serve", "-h", "127.0.0.1", "-p", str(port), "--no-access-log"],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("feast serve did not start")
            time.sleep(0.5)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def as_float32(value: object) -> object:
    if isinstance(value, float):
        return np.float32(value)
    if isinstance(value, list) and value and isinstance(value[0], float):
        return list(np.float32(value))
    return value


def answer_columns(url: str, body: bytes) -> dict[str, list[object]]:
    answer = httpx.post(
        url,
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    answer.raise_for_status()
    doc = orjson.loads(answer.content)
    return {
        name: [as_float32(v) for v in column["values"]]
        for name, column in zip(doc["metadata"]["feature_names"], doc["results"], strict=True)
    }


def non_200(base_url: str) -> str:
    """This server's requests answered with another code than 200, from its /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    found = []
    for m in re.finditer(
        r'feature_serving_request_seconds_count\{api="(\w+)",code="(\d+)",method="(\w+)"\} (\S+)',
        text,
    ):
        api, code, method, count = m.groups()
        if code != "200" and float(count) > 0:
            found.append(f"{api} {method} {code}: {float(count):.0f}")
    return ", ".join(found)
