"""A redis-server of our own, for when no Redis URL is configured, for tests and benchmarks.

``EmbeddedRedis`` runs one ``redis-server`` child on a free loopback port with its data in
a directory of ours and AOF persistence on, so features written by one run are there for
the next. ``EmbeddedCluster`` runs several such nodes as a Redis Cluster.

Both write the same config as ``feature_store/redis.conf``, including the listpack
limits of ``layout.LISTPACK_SETTINGS``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_store.errors import EmbeddedRedisError
from feature_store.layout import LISTPACK_SETTINGS

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: "
    "'apt-get install -y redis-server'; macOS: 'brew install redis'), "
    "or point the feature store at a running Redis with FEATURE_STORE_REDIS_URL."
)
START_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port for a cluster node: at most 55535, with its bus port (+10000) free too."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)  # below the kernel's ephemeral range
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise EmbeddedRedisError("found no free port pair for a cluster node")


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise EmbeddedRedisError(INSTALL_HINT)
    return path


def server_config(
    port: int, data_dir: Path, *, persistence: bool = True, extra: Mapping[str, str] = {}
) -> dict[str, str]:
    """The redis.conf settings of an embedded node."""
    cfg = {
        "bind": "127.0.0.1",
        "port": str(port),
        "protected-mode": "yes",
        "daemonize": "no",
        "dir": str(data_dir),
        "logfile": "redis.log",
        "save": '""',  # AOF alone is the persistence; no RDB snapshots on a timer
        "appendonly": "yes" if persistence else "no",
        "appendfsync": "everysec",
        **LISTPACK_SETTINGS,
        **extra,
    }
    return cfg


class EmbeddedRedis:
    """One redis-server child process. Use as a context manager, or start() / stop().

    If ``data_dir`` already has a live server started by another EmbeddedRedis, start()
    attaches to it instead of starting a second one over the same files, and stop() leaves
    it running.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int | None = None,
        persistence: bool = True,
        extra_config: Mapping[str, str] = {},
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.persistence = persistence
        self.extra_config = dict(extra_config)
        self.process: subprocess.Popen[bytes] | None = None
        self._state = self.data_dir / "embedded.port"

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedRedisError("the embedded Redis is not started")
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> str:
        binary = redis_server_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            existing = self._live_port()
            if existing is not None:
                self.port = existing
                log.info("attached to the embedded Redis already running on port %d", existing)
                return self.url
            for attempt in range(3):  # the free port can be taken before redis binds it
                port = self.port if self.port is not None else free_port()
                try:
                    self._spawn(binary, port)
                    self._state.write_text(str(port))
                    return self.url
                except EmbeddedRedisError:
                    if self.port is not None or attempt == 2 or "in use" not in self._log_tail():
                        raise
        raise AssertionError("unreachable")

    def _spawn(self, binary: str, port: int) -> None:
        cfg = server_config(
            port, self.data_dir, persistence=self.persistence, extra=self.extra_config
        )
        conf = self.data_dir / "redis.conf"
        conf.write_text("".join(f"{k} {v}\n" for k, v in cfg.items()))
        with open(self.data_dir / "redis.stderr", "wb") as stderr:  # errors before the log opens
            self.process = subprocess.Popen(
                [binary, str(conf)], stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
            )
        self.port = port
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                raise EmbeddedRedisError(
                    f"redis-server exited at start; its output (in {self.data_dir}) "
                    f"ends with:\n{self._log_tail()}"
                )
            if _pings(port):
                log.info("embedded Redis on port %d, data in %s", port, self.data_dir)
                return
            time.sleep(0.02)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer within {START_TIMEOUT_S}s")

    def stop(self) -> None:
        """Shut the server down, flushing the AOF. Only the EmbeddedRedis that started it does."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            # SIGTERM is Redis's graceful shutdown (the AOF is flushed and fsynced), and unlike
            # the SHUTDOWN command it needs no password.
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(FileNotFoundError):
            self._state.unlink()

    def kill(self) -> None:
        """Kill the server without a clean shutdown (for fault tests)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        """Start again on the same port and data, after stop() or kill()."""
        port = self.port
        self.stop()
        self.port = port
        self.start()

    def wait_replica(self, timeout: float = 60.0) -> None:
        """Return once this server is a replica whose link to its master is up (a killed
        cluster master restarted rejoins as its replacement's replica)."""
        deadline = time.monotonic() + timeout
        with redis.Redis(port=self.port or 0, socket_timeout=2) as r:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    info = r.info("replication")
                    if info.get("role") == "slave" and info.get("master_link_status") == "up":
                        return
                time.sleep(0.1)
        raise EmbeddedRedisError(
            f"port {self.port} was not a synced replica within {timeout:.0f} s"
        )

    def _live_port(self) -> int | None:
        try:
            port = int(self._state.read_text())
        except (OSError, ValueError):
            return None
        return port if _pings(port) else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.data_dir / ".start.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _log_tail(self, lines: int = 8) -> str:
        tails = []
        for name in ("redis.stderr", "redis.log"):
            try:
                text = (self.data_dir / name).read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                tails.append("\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails) or "(no output)"

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pings(port: int) -> bool:
    client = redis.Redis(
        port=port, socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


CLUSTER_TIMEOUT_S = 60.0  # gossip among six nodes on a busy 2-core machine can take a while


class EmbeddedCluster:
    """A Redis Cluster on loopback: ``masters`` masters, each with ``replicas`` replicas.

    ``node_timeout_ms`` is Redis's ``cluster-node-timeout``: how long a master may be
    unreachable before its replica is promoted (failover tests use a short one).
    """

    def __init__(
        self,
        base_dir: str | Path,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
    ) -> None:
        if masters < 3:
            raise EmbeddedRedisError("Redis Cluster needs at least 3 masters")
        self.base_dir = Path(base_dir).resolve()
        self.masters = masters
        self.replicas = replicas
        self.nodes = [
            EmbeddedRedis(
                self.base_dir / f"node{i}",
                port=free_cluster_port(),
                persistence=False,
                extra_config={
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": str(node_timeout_ms),
                },
            )
            for i in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return f"{self.nodes[0].url}?cluster=true"

    def start(self) -> str:
        try:
            for node in self.nodes:
                node.start()
            self._create()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _create(self) -> None:
        clients = [redis.Redis(port=n.port or 0) for n in self.nodes]
        try:
            if clients[0].cluster("info").get("cluster_state") != "ok":
                self._assign(clients)
            self._await(
                clients,
                lambda infos: all(
                    i.get("cluster_state") == "ok" and int(i["cluster_known_nodes"]) == len(clients)
                    for i in infos
                ),
                "reach state ok",
            )
            if self.replicas:
                self._attach_replicas(clients)
        finally:
            for c in clients:
                c.close()

    def _assign(self, clients: list[redis.Redis]) -> None:
        masters = clients[: self.masters]
        per = 16384 // len(masters)
        for i, c in enumerate(masters):
            last = 16383 if i == len(masters) - 1 else (i + 1) * per - 1
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)  # type: ignore[no-untyped-call]
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)  # type: ignore[no-untyped-call]

    def _attach_replicas(self, clients: list[redis.Redis]) -> None:
        ids = [c.execute_command("CLUSTER", "MYID") for c in clients[: self.masters]]  # type: ignore[no-untyped-call]
        for i, c in enumerate(clients[self.masters :]):
            master_id = ids[i % self.masters]
            c.execute_command("CLUSTER", "REPLICATE", master_id)  # type: ignore[no-untyped-call]

        def replicated(infos: list[dict[str, str]]) -> bool:
            roles = [c.execute_command("ROLE")[0] for c in clients]  # type: ignore[no-untyped-call]
            links = [
                c.info("replication").get("master_link_status") for c in clients[self.masters :]
            ]
            return roles.count(b"slave") == len(clients) - self.masters and all(
                link == "up" for link in links
            )

        self._await(clients, replicated, "attach its replicas")

    @staticmethod
    def _await(
        clients: list[redis.Redis], done: Callable[[list[dict[str, str]]], bool], what: str
    ) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while time.monotonic() < deadline:
            if done([c.cluster("info") for c in clients]):
                return
            time.sleep(0.05)
        raise EmbeddedRedisError(f"the local Redis Cluster did not {what}")

    def master_nodes(self) -> list[EmbeddedRedis]:
        """The nodes that are masters now (a failover changes them)."""
        out = []
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with redis.Redis(port=node.port or 0, socket_timeout=1) as c:
                if c.execute_command("ROLE")[0] == b"master":
                    out.append(node)
        return out

    def replica_of(self, master_port: int) -> EmbeddedRedis:
        """A live replica of the master on ``master_port`` (as its ROLE names it)."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with redis.Redis(port=node.port or 0, socket_timeout=1) as c:
                role = c.execute_command("ROLE")
            if role[0] == b"slave" and int(role[2]) == master_port:
                return node
        raise EmbeddedRedisError(f"no live replica of the master on port {master_port}")

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT_S) -> float:
        """Wait until every live node sees the cluster ok and every shard has a live master
        (after a failover, a reshard); the seconds it took."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            states = []
            for node in self.nodes:
                if node.process is None or node.process.poll() is not None:
                    continue
                try:
                    with redis.Redis(port=node.port or 0, socket_timeout=0.5) as c:
                        states.append(c.cluster("info").get("cluster_state"))
                except redis.exceptions.RedisError:
                    states.append("unreachable")
            if (
                states
                and all(state == "ok" for state in states)
                and len(self.master_nodes()) == self.masters  # a dead one's replica took over
            ):
                return time.monotonic() - t0
            time.sleep(0.05)
        raise EmbeddedRedisError(f"the local Redis Cluster was not ok within {timeout:.0f} s")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
