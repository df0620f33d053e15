"""Hosts on one machine: each in a network namespace of its own, on one bridge, with an
address that exists only inside its namespace; and the partitions between them.

    with NetRig(["client", "redis-0", "serve-a"]) as rig:
        rig.enter("client")                      # this process is the client host now
        rig.spawn("redis-0", ["redis-server", conf])
        rig.cut("serve-a", "redis-0")            # both ways: packets vanish silently
        rig.heal()

A partition is a neighbour entry in a host's namespace that gives the other host's
address a MAC no host has (``ip neigh replace ADDR lladdr 02:00:00:00:00:01 nud
permanent``): the bridge floods what the host sends there and nobody takes it, so the
packets vanish without an error anywhere. New connections hang in their connect and
in-flight ones in their reads, as in a real partition, and a link that comes back finds
its connections as it left them. (A blackhole route, tried first, makes the sender's own
connects fail at once with EINVAL, which no real partition does; this kernel has no
``netem`` qdisc, no tc drop action and no iptables or nft.) Latency and loss are a
proxy's: ``_linkproxy``.

Needs root and iproute2 (``ip netns``); ``available()`` says why not, for a caller to skip
with. Every namespace, the bridge and every process started on a host are removed on
``close`` (and a rig left behind by a process that died is removed by the next one).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

PREFIX = "fsrig"  # every namespace and link of a rig: fsrig<pid>-..., for the sweep
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/var/run/netns")
NOWHERE = "02:00:00:00:00:01"  # a locally administered MAC that no host of a rig has
STOP_SECONDS = 5.0  # a process asked to stop (SIGTERM) gets this long before SIGKILL


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and done.returncode != 0:
        raise RigError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


class RigError(RuntimeError):
    """The rig could not be built or changed (what ``ip`` said)."""


def available() -> str | None:
    """None where a rig can be built here; otherwise why not (for a test's skip)."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"{PREFIX}{os.getpid()}-probe"
    done = _ip("netns", "add", name, check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise RigError(f"setns: {os.strerror(ctypes.get_errno())}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no route or address of this host's namespace overlaps."""
    seen = _ip("-4", "route", "show", "table", "all").stdout + _ip("-4", "addr").stdout
    used = []
    for word in seen.split():
        with contextlib.suppress(ValueError):
            used.append(ipaddress.IPv4Network(word, strict=False))
    for third in range(200, 256):
        net = ipaddress.IPv4Network(f"10.{third}.{os.getpid() % 250}.0/24")
        if not any(u.overlaps(net) for u in used if u.prefixlen > 0):
            return net
    raise RigError("found no free /24 in 10.0.0.0/8")


def sweep() -> None:
    """Remove what rigs of processes that no longer run left behind: the processes still
    running on their hosts, the namespaces, the bridge and the veths."""
    names = [p.name for p in NETNS_DIR.glob(f"{PREFIX}*")] if NETNS_DIR.exists() else []
    # the bridge and the veths' outer ends (a namespace a socket still holds outlives its
    # deletion, and its veth with it)
    links = re.findall(rf"^\d+: ({PREFIX}\d+(?:br|v\d+))[:@]", _ip("-o", "link").stdout, re.M)
    for name in names + links:
        pid = re.match(rf"{PREFIX}(\d+)", name)
        if pid is None or Path(f"/proc/{pid[1]}").exists():
            continue
        if name in names:
            for left in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(left), signal.SIGKILL)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)


class NetRig:
    """Hosts by name, each a namespace with one address on the rig's bridge."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hosts = list(hosts)
        self.bridge = f"{self.tag}br"
        self.addresses: dict[str, str] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.cuts: set[tuple[str, str]] = set()  # (host, address it cannot reach)
        self._home: int | None = None  # this process's own namespace, while it is elsewhere

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def device(self, host: str) -> str:
        """``host``'s end of its link to the bridge, in its namespace."""
        return f"{self.tag}p{self.hosts.index(host)}"

    def outer(self, host: str) -> str:
        """The bridge's end of ``host``'s link (``sweep`` knows it by this name too)."""
        return f"{self.tag}v{self.hosts.index(host)}"

    def start(self) -> NetRig:
        sweep()
        try:
            net = _free_subnet()
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for i, host in enumerate(self.hosts):
                ns, outer, inner = self.ns(host), self.outer(host), self.device(host)
                address = str(net.network_address + 10 + i)
                _ip("netns", "add", ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.addresses[host] = address
        except BaseException:
            self.close()
            raise
        return self

    # --- this process and its children on the hosts ---------------------------------

    def enter(self, host: str) -> None:
        """Move this process's thread (call it before starting any other) into ``host``'s
        namespace: every socket it opens from now on is that host's."""
        if self._home is None:
            self._home = os.open("/proc/self/ns/net", os.O_RDONLY)
        fd = os.open(str(NETNS_DIR / self.ns(host)), os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def spawn(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        output: IO[bytes] | int | None = subprocess.DEVNULL,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` on ``host`` (``ip netns exec`` execs it: the pid is its own)."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(host), *argv],
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    # --- partitions -----------------------------------------------------------------

    def drop(self, host: str, to: str) -> None:
        """``host`` can no longer send to ``to`` (one way: ``to`` still reaches it)."""
        key = (host, self.addresses[to])
        if key not in self.cuts:
            _ip("-n", self.ns(host), "neigh", "replace", key[1], "lladdr", NOWHERE,
                "nud", "permanent", "dev", self.device(host))  # fmt: skip
            self.cuts.add(key)

    def cut(self, a: str, b: str) -> None:
        """No packet between ``a`` and ``b``, either way."""
        self.drop(a, b)
        self.drop(b, a)

    def isolate(self, host: str) -> None:
        """``host`` cut from every other host."""
        for other in self.hosts:
            if other != host:
                self.cut(host, other)

    def heal(self) -> None:
        """Every partition removed."""
        for host, address in sorted(self.cuts):
            # the entry goes; the next packet there asks for the address again (ARP)
            _ip("-n", self.ns(host), "neigh", "del", address, "dev", self.device(host), check=False)
        self.cuts.clear()

    # --- teardown -------------------------------------------------------------------

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a paused one must hear the TERM
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=STOP_SECONDS)

    def close(self) -> None:
        for process in reversed(self.processes):
            self.stop(process)
        self.processes.clear()
        if self._home is not None:
            _setns(self._home)
            os.close(self._home)
            self._home = None
        for host in self.hosts:
            _ip("netns", "del", self.ns(host), check=False)
            _ip("link", "del", self.outer(host), check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> NetRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
