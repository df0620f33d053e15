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
from collections.abc import Sequence
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


SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


def system_tool(name: str, package: str) -> str:
    """The path of an administration tool (runuser, useradd): on PATH, or in the sbin
    directories that a root shell's PATH may lack (``su`` without ``-``, some containers)."""
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SYSTEM_DIRS))
    if found is None:
        raise ServerError(
            f"{name} was not found on PATH or in {', '.join(SYSTEM_DIRS)}; it runs PostgreSQL "
            f"as its own user when we are root: install it (Debian/Ubuntu: "
            f"'apt-get install -y {package}')"
        )
    return found


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
            argv = [system_tool("runuser", "util-linux"), "-u", self.USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.dir / "postgres.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise ServerError(f"{cmd[0]} failed: {done.stderr.strip()}\n{tail}")

    def start(self) -> None:
        if self.as_root:
            exists = subprocess.run(["id", "-u", self.USER], capture_output=True).returncode == 0
            if not exists:
                useradd = system_tool("useradd", "passwd")
                subprocess.run(
                    [useradd, "--system", "--no-create-home", "--shell", "/bin/false", self.USER],
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
