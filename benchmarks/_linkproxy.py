"""A host's link, slowed or lossy on demand: a TCP proxy in front of a Redis node.

    python3 benchmarks/_linkproxy.py --listen 10.200.7.13 --ports 6379 16379 --control FILE

Run in the node's network namespace (``_netrig``), where Redis listens on 127.0.0.1 and
announces the host's address: every connection to the node (clients, its replica, the
other nodes' cluster bus) comes through here, and is passed on to 127.0.0.1 at the same
port. What the link does is read from ``--control`` (JSON, polled every 100 ms; absent or
empty: nothing):

- ``delay`` and ``jitter`` (seconds): each chunk the node sends back waits ``delay`` plus
  or minus up to ``jitter``, uniformly, and never overtakes the one before it (a link's
  latency adds to every round trip once);
- ``loss`` (a fraction): a chunk, either way, is held for one TCP retransmission time
  (``RTO``, Linux's 200 ms floor) with that probability, and those behind it wait too.
  This is what losing a segment costs a TCP connection; it is not packet loss itself,
  which this kernel cannot make without netem;
- ``freeze_subscribers`` (true): the connections that have sent a SUBSCRIBE are cut
  silently, both ways: what crosses them is lost (a pub/sub notice published meanwhile
  never arrives), nothing fails, the others pass as before. When it ends, they are
  closed, as a partition that outlasted TCP's patience leaves them.

``--upstream-port`` passes one port's connections to another (a proxy on the same host as
its Redis, outside a namespace).

Standard library only, so that it runs with whichever interpreter starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

RTO = 0.2  # seconds: a lost segment's retransmission (Linux's minimum RTO)
POLL = 0.1  # seconds between reads of the control file
CHUNK = 65536


class Conn:
    """One proxied connection: whether it subscribed, and its two writers."""

    def __init__(self) -> None:
        self.subscriber = False
        self.writers: list[asyncio.StreamWriter] = []

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class Link:
    def __init__(self, control: Path) -> None:
        self.control = control
        self.delay = self.jitter = self.loss = 0.0
        self.freeze = False
        self.frozen: set[Conn] = set()  # subscribers cut while ``freeze`` holds
        self._seen = 0.0

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                mtime = self.control.stat().st_mtime if self.control.exists() else 0.0
                if mtime != self._seen:
                    self._seen = mtime
                    said = json.loads(self.control.read_text() or "{}") if mtime else {}
                    self.delay = float(said.get("delay", 0.0))
                    self.jitter = float(said.get("jitter", 0.0))
                    self.loss = float(said.get("loss", 0.0))
                    self.freeze = bool(said.get("freeze_subscribers", False))
                    if not self.freeze:  # healed: what was cut is closed
                        for conn in self.frozen:
                            conn.close()
                        self.frozen.clear()
            await asyncio.sleep(POLL)

    def cut(self, conn: Conn) -> bool:
        """Whether what crosses ``conn`` now is lost (a subscriber while ``freeze``)."""
        if self.freeze and conn.subscriber:
            self.frozen.add(conn)
            return True
        return False

    def hold(self, back: bool) -> float:
        """Seconds a chunk waits: the delay (on the way back), a retransmission if lost."""
        held = 0.0
        if back and (self.delay or self.jitter):
            held += max(0.0, self.delay + random.uniform(-self.jitter, self.jitter))
        if self.loss and random.random() < self.loss:
            held += RTO
        return held


async def pipe(
    link: Link, conn: Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter, back: bool
) -> None:
    """Copy ``src`` to ``dst`` in order, each chunk released when the link says."""
    release = 0.0
    try:
        while chunk := await src.read(CHUNK):
            # a connection is told once: its chunks are not searched again after
            if not back and not conn.subscriber and b"SUBSCRIBE" in chunk.upper():
                conn.subscriber = True
            if link.cut(conn):
                continue
            held = link.hold(back)
            if held or release > time.monotonic():
                release = max(release, time.monotonic() + held)
                await asyncio.sleep(release - time.monotonic())
            dst.write(chunk)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()


async def serve(address: str, ports: list[int], control: Path, upstream: int | None = None) -> None:
    link = Link(control)

    def handler(port: int):  # type: ignore[no-untyped-def]
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream or port)
            except OSError:
                writer.close()
                return
            conn = Conn()
            conn.writers = [writer, up_writer]
            await asyncio.gather(
                pipe(link, conn, reader, up_writer, back=False),
                pipe(link, conn, up_reader, writer, back=True),
            )
            link.frozen.discard(conn)

        return handle

    servers = [await asyncio.start_server(handler(p), address, p) for p in ports]
    await asyncio.gather(link.watch(), *(s.serve_forever() for s in servers))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", required=True)
    p.add_argument("--ports", type=int, nargs="+", required=True)
    p.add_argument("--control", type=Path, required=True)
    p.add_argument("--upstream-port", type=int, help="with one --ports: pass it on to this one")
    args = p.parse_args()
    if args.upstream_port is not None and len(args.ports) != 1:
        p.error("--upstream-port takes one --ports")
    asyncio.run(serve(args.listen, args.ports, args.control, args.upstream_port))


if __name__ == "__main__":
    main()
