"""Redis's errors as the project's: what they say, and which are tried again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis

from feature_store.connection import translate
from feature_store.errors import StoreTimeoutError, StoreUnavailableError
from feature_store.serving.l1.roundtrip import retried


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
