"""Writes that survive a failover, when asked: ``WAIT`` for replicas after the write.

Redis replicates asynchronously. A master answers a write as soon as it has applied it,
and sends it to its replicas afterwards; if the master dies (or is partitioned away and
its replica promoted) before a replica has the write, the write is gone after the
failover, although the client was told it succeeded. A master paused by the operating
system (SIGSTOP, a long GC-like stall of the VM) that resumes after its replica took over
goes on accepting writes on the connections it still has until it learns it was demoted,
and then drops them: the same loss.

``Durability(replicas=N, timeout_ms=T)`` (``FEATURE_STORE_WRITE_DURABILITY=replicas=N,timeout=T``,
or ``--write-durability`` on ``serve``, ``ingest`` and ``stream``) sends ``WAIT N T`` after
each master's share of a write, on the connection that wrote it: Redis answers how many
replicas acknowledged everything that connection wrote. Fewer than N within T
milliseconds raises ``NotDurableError`` (a ``StoreUnavailableError``: HTTP 503 and gRPC
UNAVAILABLE for a push write, retried by the jobs), never success. What it promises,
as Redis's own documentation for WAIT says: a write acknowledged under ``replicas=1`` is
held by the master and at least one replica's memory, so a failover that promotes one of
those replicas keeps it. It does not make Redis strongly consistent: a write reported not
durable may still have been applied (and may survive, or not), a failover may promote a
replica that was not among the N, and both sides losing power loses what neither had on
disk. The default, ``replicas=0``, sends no WAIT: Redis's asynchronous replication.
"""

from __future__ import annotations

from dataclasses import dataclass

from feature_store.errors import ConfigError, NotDurableError

DEFAULT_TIMEOUT_MS = 500


@dataclass(frozen=True, slots=True)
class Durability:
    """How many replicas must hold a write before it is acknowledged, and how long to wait."""

    replicas: int = 0
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ConfigError(f"write durability: replicas={self.replicas} must be 0 or more")
        if self.timeout_ms < 1:
            # WAIT's 0 waits forever: a replica gone would hang the write
            raise ConfigError(
                f"write durability: timeout={self.timeout_ms} must be at least 1 ms "
                "(Redis's WAIT with 0 waits forever)"
            )

    @classmethod
    def parse(cls, text: str | None) -> Durability:
        """``replicas=N[,timeout=MS]``; empty or None: asynchronous (replicas=0)."""
        if text is None or not text.strip():
            return cls()
        values: dict[str, int] = {}
        for item in text.split(","):
            name, eq, raw = item.strip().partition("=")
            name = name.strip().lower()
            if not eq or name not in ("replicas", "timeout"):
                raise ConfigError(
                    f"write durability {text!r}: expected replicas=N[,timeout=MS], "
                    f"not {item.strip()!r}"
                )
            if name in values:
                raise ConfigError(f"write durability {text!r}: {name} given twice")
            try:
                values[name] = int(raw.strip().removesuffix("ms"))
            except ValueError:
                raise ConfigError(
                    f"write durability {text!r}: {name}={raw.strip()!r} is not a whole number"
                ) from None
        if "replicas" not in values:
            raise ConfigError(f"write durability {text!r}: replicas=N is missing")
        return cls(values["replicas"], values.get("timeout", DEFAULT_TIMEOUT_MS))

    @property
    def asked(self) -> bool:
        return self.replicas > 0

    @property
    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)

    def check(self, reply: object, where: str) -> None:
        """Raise ``NotDurableError`` unless ``reply``, WAIT's answer from the master
        ``where``, counts at least ``replicas`` replicas."""
        if isinstance(reply, int) and not isinstance(reply, bool) and reply >= self.replicas:
            return
        if not isinstance(reply, int):
            # an error in WAIT's place (the node is a replica now: a failover demoted it),
            # where the write before it may have been refused too
            raise NotDurableError(
                f"the write could not be confirmed within {self.timeout_ms} ms: WAIT on "
                f"{where} answered {reply!s}; not durable, it may not even have been "
                "applied; send it again"
            )
        raise NotDurableError(
            f"the write was applied by {where} but confirmed by {reply} of {self.replicas} "
            f"replica(s) within {self.timeout_ms} ms: not durable, a failover may lose it; "
            "send it again"
        )

    def fits(self, socket_timeout: float) -> None:
        """The connection's socket timeout must outlast WAIT, or every slow replica would
        read as Redis gone."""
        if self.asked and self.timeout_ms >= socket_timeout * 1000:
            raise ConfigError(
                f"write durability timeout={self.timeout_ms} ms must be shorter than the "
                f"Redis socket timeout ({socket_timeout:g} s), which must outlast the WAIT"
            )

    def __str__(self) -> str:
        return f"replicas={self.replicas},timeout={self.timeout_ms}" if self.asked else "async"


ASYNCHRONOUS = Durability()  # the default: no WAIT, Redis's asynchronous replication
