"""Redis connections: one URL form for every deployment, and redis-py errors translated.

Accepted URLs (redis-py's, plus one query option of ours):

    redis://[[user]:password@]host:port/db      plain TCP, optional ACL user and password
    rediss://...                                 TLS (ssl_cert_reqs, ssl_ca_certs... as query)
    unix:///path/to/redis.sock?password=...      unix socket
    redis://host:port?cluster=true               Redis Cluster: any node, the rest discovered
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from feature_store.durability import ASYNCHRONOUS, Durability
from feature_store.errors import (
    ConfigError,
    EntityDataError,
    StoreError,
    StorePermissionError,
    StoreTimeoutError,
    StoreUnavailableError,
)

SyncClient: TypeAlias = redis.Redis | redis.cluster.RedisCluster
AsyncClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis URL: where to connect, and whether it is a cluster."""

    url: str  # without our own query options, ready for redis-py
    cluster: bool
    socket_timeout: float
    connect_timeout: float
    max_connections: int
    retries: int = 1
    # more cluster nodes to start from (``?nodes=host:port,...``): the URL's own node may
    # be the one that died
    seeds: tuple[tuple[str, int], ...] = ()
    # replicas each write waits for (``feature_store.durability``); default none
    durability: Durability = ASYNCHRONOUS

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        max_connections: int = 64,
        retries: int = 1,
        durability: Durability = ASYNCHRONOUS,
    ) -> RedisTarget:
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"Redis URL {_redact(url)!r}: scheme must be redis://, rediss:// or unix://"
            )
        query = parse_qsl(parts.query, keep_blank_values=True)
        cluster = False
        seeds: list[tuple[str, int]] = []
        kept = []
        for k, v in query:
            if k == "cluster":
                if v.lower() not in _TRUE | _FALSE:
                    raise ConfigError(f"Redis URL option cluster={v!r}: expected true or false")
                cluster = v.lower() in _TRUE
            elif k == "nodes":
                seeds += _seeds(v)
            else:
                kept.append((k, v))
        if seeds and not cluster:
            raise ConfigError("Redis URL option nodes= is for a cluster (add cluster=true)")
        if cluster and parts.scheme == "unix":
            raise ConfigError("Redis Cluster needs redis:// or rediss:// node addresses")
        clean = (
            url if len(kept) == len(query) else urlunsplit(parts._replace(query=urlencode(kept)))
        )
        durability.fits(socket_timeout)
        return cls(
            clean,
            cluster,
            socket_timeout,
            connect_timeout,
            max_connections,
            retries,
            tuple(seeds),
            durability,
        )

    def with_seeds(self, nodes: Iterable[tuple[str, int]]) -> str:
        """This cluster's URL naming ``nodes`` as more places to start from."""
        listed = ",".join(f"{h}:{p}" for h, p in dict.fromkeys([*self.seeds, *nodes]))
        query = urlencode([("cluster", "true"), ("nodes", listed)])
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(query=f"{parts.query}&{query}" if parts.query else query))

    def sync_client(self) -> SyncClient:
        if self.cluster:
            with translated_errors():  # a cluster client asks a node for the layout at once
                return self._sync_cluster()
        return redis.Redis.from_url(
            self.url, max_connections=self.max_connections, **self.connection_options()
        )

    def _sync_cluster(self) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster.from_url(
            self.url,
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in self.seeds],  # type: ignore[no-untyped-call]
            max_connections=self.max_connections,
            **self.connection_options(),
        )

    def async_client(self) -> AsyncClient:
        if self.cluster:
            return redis.asyncio.cluster.RedisCluster.from_url(
                self.url,
                startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in self.seeds],
                max_connections=self.max_connections,
                **self.connection_options(),
            )
        return redis.asyncio.Redis.from_url(
            self.url, max_connections=self.max_connections, **self.connection_options()
        )

    def connection_options(self) -> dict[str, Any]:
        """What every connection to this target is opened with (redis-py's keywords): its
        socket and connect timeouts and its quick retries."""
        return {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "retry": self._retry(),
        }

    def _retry(self) -> Retry:
        # redis-py 8 retries 10 times with exponential backoff by default: about 5 s before
        # a dead Redis surfaces. One quick retry covers a pooled connection that went stale
        # across a Redis restart; callers that want more (the Spark job) retry on their own.
        return Retry(ConstantBackoff(0.01), self.retries)

    def __str__(self) -> str:
        return _redact(self.url) + (" (cluster)" if self.cluster else "")


@dataclass(frozen=True, slots=True)
class RedisOptions:
    """What a URL is opened with (``FEATURE_STORE_SOCKET_TIMEOUT``, ``…_CONNECT_TIMEOUT``,
    ``…_MAX_CONNECTIONS``, ``…_REDIS_RETRIES``, ``…_WRITE_DURABILITY``): sent to Spark's
    tasks beside the URL."""

    socket_timeout: float = 1.0
    connect_timeout: float = 1.0
    max_connections: int = 64
    retries: int = 1
    durability: Durability = ASYNCHRONOUS

    def target(self, url: str) -> RedisTarget:
        return RedisTarget.parse(
            url,
            socket_timeout=self.socket_timeout,
            connect_timeout=self.connect_timeout,
            max_connections=self.max_connections,
            retries=self.retries,
            durability=self.durability,
        )


def close_client(client: SyncClient) -> None:
    """Close a client and its sockets. A cluster client's ``close`` leaves open the pools
    of the nodes it learned and of the seeds it has since replaced; they are disconnected
    here too (they open again when used)."""
    client.close()
    if isinstance(client, redis.cluster.RedisCluster):
        manager = client.nodes_manager
        for node in (*manager.startup_nodes.values(), *manager.nodes_cache.values()):
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()


def _seeds(text: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"Redis URL option nodes: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    return out


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


_TLS_HINT = (
    " (a TLS mismatch fails like this too: rediss:// needs a server port that speaks TLS, "
    "redis:// one that does not)"
)


def translate(
    error: redis.exceptions.RedisError | redis.exceptions.RedisClusterException,
) -> StoreError:
    """The project's error for a redis-py error."""
    # AuthenticationError is a ConnectionError in redis-py: check it first
    if isinstance(error, redis.exceptions.AuthenticationError):
        return StoreError(f"Redis refused the credentials: {error}")
    if isinstance(error, redis.exceptions.NoPermissionError):
        return StorePermissionError(
            f"the Redis user may not run this command (its ACL rules refuse it): {error}"
        )
    text = _message(error)
    if isinstance(error, redis.exceptions.TimeoutError):
        hint = _TLS_HINT if "connecting" in text.lower() else ""
        return StoreTimeoutError(f"Redis did not answer in time: {text}{hint}")
    if "SSL" in text or "TLS" in text:
        return StoreUnavailableError(f"Redis is unavailable: {text}{_TLS_HINT}")
    if isinstance(
        error,
        redis.exceptions.ConnectionError
        | redis.exceptions.ClusterDownError
        | redis.exceptions.TryAgainError
        | redis.exceptions.BusyLoadingError,
    ):
        return StoreUnavailableError(f"Redis is unavailable: {text}")
    if isinstance(error, redis.exceptions.RedisClusterException | redis.exceptions.ClusterError):
        # no reachable node, slots not covered, a topology still settling (ClusterError:
        # redirections and errors past the client's limit for one command): retry later
        return StoreUnavailableError(f"Redis Cluster is unavailable: {text}")
    return StoreError(f"Redis error: {text}")


def is_key_error(error: BaseException) -> bool:
    """An error reply about one key's data (WRONGTYPE), not about Redis or the cluster."""
    return isinstance(error, redis.exceptions.ResponseError) and str(error).startswith("WRONGTYPE")


def missing_script(replies: Sequence[object]) -> list[int]:
    """Where a pipeline's replies say NOSCRIPT: Redis restarted, flushed its scripts, or is
    a promoted replica. The caller sends those commands again with the script's text
    (``layout.with_script``)."""
    return [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]


def read_replies(key_of: Sequence[bytes], replies: Sequence[object]) -> list[object]:
    """A read pipeline's replies (run with ``raise_on_error=False``) with each WRONGTYPE
    reply as its key's ``EntityDataError``; any other error reply raises, translated."""
    out = list(replies)
    for i, reply in enumerate(out):
        if isinstance(reply, Exception):
            if not is_key_error(reply):
                with translated_errors():
                    raise reply
            key = key_of[i].decode(errors="replace")
            out[i] = EntityDataError(f"{key}: Redis answered {reply}", "wrong_type")
    return out


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    try:
        yield
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as e:
        raise translate(e) from e
    except TimeoutError:  # a deadline of the caller's (asyncio.timeout): it names the budget
        raise
    except OSError as e:  # a socket error that redis-py did not wrap
        raise StoreUnavailableError(f"Redis is unavailable: {_message(e)}") from e


def _message(error: BaseException) -> str:
    """What an error says; its class where it says nothing (some of redis-py's errors, a
    ConnectionError() of the cluster client, carry no message)."""
    return str(error) or type(error).__name__
