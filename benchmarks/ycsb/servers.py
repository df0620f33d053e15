"""The servers a YCSB run measures, each started by the harness on loopback and stopped after.

- PostgreSQL: a throwaway cluster (initdb into a temporary directory, ``pg_ctl start`` on a
  free 127.0.0.1 port). initdb refuses to run as root, so as root the cluster belongs to the
  ``postgres`` system user (created if missing) and its commands run through ``runuser``.
- Redis: the project's ``EmbeddedRedis`` and ``EmbeddedCluster`` (imported by the runner).
- The serving API: ``feature-store serve`` on a free port, if that command exists.

Missing packages (postgresql, redis-server) are installed with apt-get when running as root
on Debian/Ubuntu, and otherwise named in a clear error.

CPU is read from /proc/<pid>/stat: utime + stime of a process and of its live descendants,
plus the cutime + cstime of the root (the CPU of children it has already reaped, such as
PostgreSQL backends of connections that closed during the run).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ServerError(Exception):
    """A server of the harness could not be installed or started."""


def apt_install(package: str, binary_hint: str) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ServerError(
            f"{binary_hint} was not found; install it (Debian/Ubuntu: "
            f"'sudo apt-get install -y {package}')"
        )
    print(f"installing {package} with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", package]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise ServerError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")


def ensure_redis_server() -> None:
    if shutil.which("redis-server") is None:
        apt_install("redis-server", "redis-server")


# --- CPU accounting ----------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after its closing one
    return raw[raw.rindex(")") + 2 :].split()


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def cpu_seconds(roots: Sequence[int]) -> float:
    """CPU seconds used so far by the process trees under ``roots``."""
    tree = _children()
    ticks = 0
    for root in roots:
        fields = _stat(root)
        if fields is None:
            raise ServerError(f"process {root} is gone")
        # fields from index 0 = state: utime, stime, cutime, cstime are fields 14-17 of stat
        ticks += sum(int(x) for x in fields[11:15])
        stack = list(tree.get(root, []))
        while stack:
            pid = stack.pop()
            child = _stat(pid)
            if child is not None:
                ticks += int(child[11]) + int(child[12])
                stack.extend(tree.get(pid, []))
    return ticks / CLOCK_TICKS


# --- PostgreSQL ----------------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    def find() -> Path | None:
        dirs = sorted(
            glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2] or 0)
        )
        for d in reversed(dirs):
            if Path(d, "initdb").exists():
                return Path(d)
        initdb = shutil.which("initdb")
        return Path(initdb).parent if initdb else None

    found = find()
    if found is None:
        apt_install("postgresql", "PostgreSQL (initdb)")
        found = find()
    if found is None:
        raise ServerError("PostgreSQL was installed but initdb is not under /usr/lib/postgresql")
    return found


class Postgres:
    """A PostgreSQL cluster of our own in a temporary directory."""

    USER = "postgres"

    def __init__(self, port: int, settings: dict[str, str]) -> None:
        self.port = port
        self.settings = settings
        self.bin = postgres_bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="ycsb-postgres-"))
        self.data = self.dir / "data"
        self.as_root = os.geteuid() == 0

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        argv = [str(self.bin / cmd[0]), *cmd[1:]]
        if self.as_root:
            argv = ["runuser", "-u", self.USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.dir / "postgres.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise ServerError(f"{cmd[0]} failed: {done.stderr.strip()}\n{tail}")

    def start(self) -> None:
        if self.as_root:
            exists = subprocess.run(["id", "-u", self.USER], capture_output=True).returncode == 0
            if not exists:
                subprocess.run(
                    ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", self.USER],
                    check=True,
                )
            shutil.chown(self.dir, self.USER, self.USER)
        self._run(
            "initdb", "-D", str(self.data), "-U", self.USER, "--auth=trust", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'",
            **self.settings,
        }
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("".join(f"{k} = {v}\n" for k, v in conf.items()))
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"), "-w", "-t", "60",
            "start",
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def version(self) -> str:
        done = subprocess.run([str(self.bin / "postgres"), "--version"], capture_output=True)
        return done.stdout.decode().strip()

    def stop(self) -> None:
        with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Postgres:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- the serving API ---------------------------------------------------------------------


def serving_help() -> tuple[str | None, str]:
    """(the help text of ``feature-store serve``, or None if there is no such command; why)."""
    exe = shutil.which("feature-store")
    if exe is None:
        return None, "the feature-store command is not installed"
    try:
        done = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "'feature-store serve --help' did not answer within 60 s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"'feature-store serve' is not available ({last})"
    return done.stdout, "available"


def serving_command(
    help_text: str, port: int, registry: Path, redis_url: str, workers: int
) -> list[str]:
    """``feature-store serve`` with the options its help lists (the rest go by env vars)."""
    cmd = [shutil.which("feature-store") or "feature-store", "serve"]
    wanted = {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--registry": str(registry),
        "--redis-url": redis_url,
        "--workers": str(workers),
    }
    for option, value in wanted.items():
        if option in help_text:
            cmd += [option, value]
    if "--no-grpc" in help_text:  # the bindings speak REST; a gRPC port could collide
        cmd.append("--no-grpc")
    elif "--grpc-port" in help_text:
        from feature_store.embedded import free_port

        cmd += ["--grpc-port", str(free_port())]
    return cmd


class Serving:
    """``feature-store serve`` as a child process, ready once GET /readyz answers 200."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str], log: Path) -> None:
        self.cmd = cmd
        self.port = port
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 60.0) -> None:
        with open(self.log, "wb") as fh:
            self.process = subprocess.Popen(
                self.cmd,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(
                    f"feature-store serve exited with {self.process.returncode}:\n"
                    + self.log.read_text(errors="replace")[-2000:]
                )
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerError(
            f"feature-store serve was not ready within {timeout_s:.0f} s:\n"
            + self.log.read_text(errors="replace")[-2000:]
        )

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @contextlib.contextmanager
    def running(self) -> Iterator[Serving]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
