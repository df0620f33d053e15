"""Redis's errors as the project's: what they say, and which are tried again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.asyncio

from feature_store.connection import translate
from feature_store.errors import StoreTimeoutError, StoreUnavailableError
from feature_store.serving.l1.roundtrip import closed_under, retried


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (
            redis.exceptions.ConnectionError("Connection refused"),
            StoreUnavailableError,
            "Redis is unavailable: Connection refused",
        ),
        # redis-py's cluster client raises some without a message: the class names them
        (
            redis.exceptions.ConnectionError(),
            StoreUnavailableError,
            "Redis is unavailable: ConnectionError",
        ),
        (
            redis.exceptions.TryAgainError(),
            StoreUnavailableError,
            "Redis is unavailable: TryAgainError",
        ),
        (
            redis.exceptions.TimeoutError(),
            StoreTimeoutError,
            "Redis did not answer in time: TimeoutError",
        ),
        (
            redis.exceptions.RedisClusterException(),
            StoreUnavailableError,
            "Redis Cluster is unavailable: RedisClusterException",
        ),
        (
            redis.exceptions.ClusterError(),
            StoreUnavailableError,
            "Redis Cluster is unavailable: ClusterError",
        ),
    ],
)
def test_redis_errors_are_translated_with_a_message(
    error: Exception, kind: type[Exception], message: str
) -> None:
    translated = translate(error)
    assert type(translated) is kind
    assert str(translated) == message


def _exchange(*failures: BaseException) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """An exchange that raises ``failures`` in turn, then answers; and its call count."""
    calls = [0]

    async def exchange() -> str:
        calls[0] += 1
        if calls[0] <= len(failures):
            raise failures[calls[0] - 1]
        return "replies"

    return calls, exchange


def test_a_connection_error_is_tried_once_more_and_a_deadline_is_not() -> None:
    calls, exchange = _exchange(redis.exceptions.ConnectionError("reset"))
    assert asyncio.run(retried(exchange)) == "replies"
    assert calls == [2]
    calls, exchange = _exchange(*[redis.exceptions.ConnectionError("reset")] * 2)
    with pytest.raises(StoreUnavailableError, match="Redis is unavailable: reset"):
        asyncio.run(retried(exchange))
    assert calls == [2]
    # the caller's deadline passed (asyncio.timeout): not tried again, which would cost a
    # hung Redis's caller two deadlines, and left for the caller to name its budget
    calls, exchange = _exchange(TimeoutError())
    with pytest.raises(TimeoutError):
        asyncio.run(retried(exchange))
    assert calls == [1]


def _write_on_dropped_writer() -> Exception:
    """What redis-py's own send raises on a connection whose writer a concurrent close
    already dropped (the reshard-under-load 503, "the read failed: AttributeError")."""
    connection = redis.asyncio.Connection()
    try:
        asyncio.run(connection._send_packed_command([b"*1\r\n$4\r\nPING\r\n"]))
    except Exception as e:
        return e
    raise AssertionError("a send without a writer did not fail")


def test_a_write_on_a_connection_closed_under_the_client_is_a_connection_error() -> None:
    # redis-py before 8.2 wrote on the writer the close had dropped: an AttributeError; 8.2
    # checks first and raises a ConnectionError, which is retried as any connection error
    raised = _write_on_dropped_writer()
    assert isinstance(raised, redis.exceptions.ConnectionError) or closed_under(raised)
    dropped = AttributeError("'NoneType' object has no attribute 'writelines'")
    dropped.name, dropped.obj = "writelines", None  # as the interpreter sets them
    assert closed_under(dropped)
    assert closed_under(
        RuntimeError("unable to perform operation on <TCPTransport>; the handler is closed")
    )
    # any other AttributeError or RuntimeError is a bug: not retried
    assert not closed_under(AttributeError("'Entry' object has no attribute 'values'"))
    with pytest.raises(AttributeError) as bug:
        getattr(None, "values")  # noqa: B009 (a bug's AttributeError on None, not a writer's)
    assert not closed_under(bug.value)
    assert not closed_under(RuntimeError("dictionary changed size during iteration"))
