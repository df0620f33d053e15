"""Run ``feature-store serve`` as a child process on free loopback ports.

For tests and benchmarks, which need a real server in its own process (its own event loop
and GIL), and for trying the API from a script:

    with ServingProcess(redis_url, registry="sample") as server:
        FeatureClient(server.rest_url).get(...)

The server's output goes to ``log_path`` when one is given. Otherwise its last
``OUTPUT_TAIL_BYTES`` are kept in memory, so that a server which exits or never gets ready
says why in the error, and a load that makes it log millions of lines costs no disk.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from feature_store.client import TlsConfig
from feature_store.embedded import free_port
from feature_store.errors import FeatureStoreError

START_TIMEOUT_S = 30.0
OUTPUT_TAIL_BYTES = 64 * 1024  # of a server's output kept without a log_path
ERROR_TAIL_CHARS = 2000  # of its output quoted in an error


class OutputTail:
    """The last ``limit`` bytes (or a little more: whole reads are kept) written to
    ``pipe``, read on a daemon thread until the writer closes it."""

    def __init__(self, pipe: IO[bytes], limit: int = OUTPUT_TAIL_BYTES) -> None:
        self.limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._read, args=(pipe,), name="serve-output", daemon=True
        )
        self._thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        with pipe:
            while chunk := pipe.read1(65536):  # type: ignore[attr-defined]
                with self._lock:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size - len(self._chunks[0]) >= self.limit:
                        self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._chunks)
        return data[-self.limit :].decode(errors="replace")

    def wait(self, timeout: float) -> None:
        """Until everything the writer wrote is read (it has closed the pipe)."""
        self._thread.join(timeout)


PORT_TRIES = 3
PORT_IN_USE = "the port is in use"  # what serve says when a port it was given is taken


class ServingProcess:
    def __init__(
        self,
        redis_url: str,
        *,
        registry: str | Path = "sample",
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        grpc: bool = True,
        log_path: Path | None = None,
        ready_path: str = "/healthz",
        start_timeout: float = START_TIMEOUT_S,
        cwd: Path | None = None,
        python: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.registry = str(registry)
        self.args = list(args)
        self.env = dict(env or {})
        self.grpc = grpc
        self.log_path = log_path
        self.ready_path = ready_path  # "/readyz" also waits until Redis answers
        self.start_timeout = start_timeout
        self.cwd = cwd  # `python -m` imports from here first: another checkout's package
        self.python = python or sys.executable  # another environment's (an installed wheel)
        self.tls = tls  # the server runs with TLS (its --tls-* args); how to check it
        self.port = free_port()
        self.grpc_port = free_port() if grpc else None
        self.process: subprocess.Popen[bytes] | None = None
        self.output: OutputTail | None = None  # without a log_path

    @property
    def rest_url(self) -> str:
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        if self.grpc_port is None:
            raise FeatureStoreError("this server runs without gRPC")
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> ServingProcess:
        """Start the server and wait until it is ready. The ports were free when chosen,
        but another process may take one before the server binds it: then the server says
        so and exits, and it is started again on other ports (at most ``PORT_TRIES``)."""
        for attempt in range(PORT_TRIES):
            try:
                return self._start()
            except FeatureStoreError as e:
                if PORT_IN_USE not in str(e) or attempt == PORT_TRIES - 1:
                    raise
                self.port = free_port()
                self.grpc_port = free_port() if self.grpc else None
        raise AssertionError("unreachable")

    def _start(self) -> ServingProcess:
        command = [
            self.python,
            "-m",
            "feature_store.cli",
            "serve",
            "--registry",
            self.registry,
            "--redis-url",
            self.redis_url,
            "--port",
            str(self.port),
            *(["--grpc-port", str(self.grpc_port)] if self.grpc_port else ["--no-grpc"]),
            *self.args,
        ]
        # Settings come from ``env`` alone, and so does a metrics directory: two servers
        # started from one process must not share one (importing Feast's SDK sets
        # PROMETHEUS_MULTIPROC_DIR in the importing process, for instance)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FEATURE_SERVING_", "FEATURE_STORE_"))
            and k != "PROMETHEUS_MULTIPROC_DIR"
        }
        env.update(self.env)
        out = open(self.log_path, "wb") if self.log_path else subprocess.PIPE  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child has its own descriptor
        if self.process.stdout is not None:
            self.output = OutputTail(self.process.stdout)
        # with --workers N, /healthz answers once the first worker does: wait for all N
        # (/readyz answers 200 only then)
        workers = 1 if self.ready_path == "/readyz" else self._workers()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if self.output is not None:
                    self.output.wait(timeout=5.0)  # what it wrote before it exited
                raise FeatureStoreError(
                    f"feature-store serve exited with {self.process.returncode}: {command}"
                    + self._log_tail()
                )
            verify = True if self.tls is None else self.tls.ssl_context()
            try:
                url = f"{self.rest_url}{self.ready_path}"
                if httpx.get(url, timeout=1.0, verify=verify).status_code == 200 and (
                    workers <= 1 or self._every_worker_serves(workers, verify)
                ):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise FeatureStoreError(
            f"feature-store serve was not ready ({self.ready_path}) within "
            f"{self.start_timeout:.0f} s" + self._log_tail()
        )

    def _every_worker_serves(self, workers: int, verify: bool | ssl.SSLContext) -> bool:
        """Whether all ``workers`` listen on the ports (/readyz's "n of N", whatever
        Redis's state). Until then a connection reaches the first worker alone, and a load
        started then would measure one worker."""
        body = httpx.get(f"{self.rest_url}/readyz", timeout=1.0, verify=verify).json()
        return bool(body.get("workers") == f"{workers} of {workers}")

    def _workers(self) -> int:
        args = self.args
        for i, arg in enumerate(args):
            if arg == "--workers" and i + 1 < len(args):
                return int(args[i + 1])
            if arg.startswith("--workers="):
                return int(arg.split("=", 1)[1])
        return int(self.env.get("FEATURE_SERVING_WORKERS", "1"))

    def log_text(self) -> str:
        """The server's output so far: its log file's, or the tail kept in memory."""
        if self.log_path is not None:
            return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "" if self.output is None else self.output.text()

    def _log_tail(self) -> str:
        text = self.log_text()
        if not text:
            return "\n(the server wrote nothing)"
        return "\nthe server's output ends with:\n" + text[-ERROR_TAIL_CHARS:]

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> ServingProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
