"""What the driver tells each Spark task: plain, picklable data and no Spark objects.

A task rebuilds the registry from its text rather than receiving the parsed objects, so
the only things shipped to executors are strings and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from feature_store.durability import ASYNCHRONOUS, Durability


class Source(StrEnum):
    """How a column's cells reach the codec."""

    NATIVE = "native"  # a Spark type that maps onto the feature type
    TEXT = "text"  # a string column (CSV, or JSON text for lists) parsed per cell


# Kafka offsets per stream micro-batch unless --max-records-per-batch says otherwise: a
# backlog is read in steps, each bounded in the driver's and the executors' memory
MAX_RECORDS_PER_BATCH = 200_000


class BadReason(StrEnum):
    """Why a row was quarantined instead of written."""

    NULL_ID = "null_id"
    INVALID_ID = "invalid_id"  # not an int64 / empty string / unparseable int id text
    WRONG_EMBEDDING_DIM = "wrong_embedding_dim"
    UNPARSEABLE_VALUE = "unparseable_value"  # text that is not a number / JSON list / bool
    INVALID_VALUE = "invalid_value"  # parsed, but outside the type (int64 or float32 range)
    NULL_EVENT_TIME = "null_event_time"  # --event-time-column is null in this row
    # before 1970, unparseable text, or more than batch.MAX_FUTURE_SECONDS ahead
    INVALID_EVENT_TIME = "invalid_event_time"
    MALFORMED_RECORD = "malformed_record"  # a stream record that is not a JSON object
    UNKNOWN_FIELD = "unknown_field"  # a stream record's field that is no feature of the group
    # an aggregated group's event older than its entity's newest by more than the lateness
    TOO_LATE = "too_late"
    UNREADABLE_STATE = "unreadable_state"  # an entity's stored window tiles cannot be read


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One input column and the registry feature it feeds."""

    column: str
    feature: str
    source: Source = Source.NATIVE


@dataclass(frozen=True, slots=True)
class RetrySpec:
    """Exponential backoff with equal jitter for chunks that meet StoreUnavailableError.

    The n-th retry waits between half and all of ``min(max_delay, base_delay * 2**n)``
    seconds, so ``retries`` bounds both the attempts and the total wait.
    """

    retries: int = 8
    base_delay: float = 0.1
    max_delay: float = 10.0

    def max_total_wait(self) -> float:
        return float(
            sum(min(self.max_delay, self.base_delay * 2**n) for n in range(1, self.retries + 1))
        )


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a partition writer needs, sent once per task."""

    registry_text: str
    registry_source: str
    group: str
    id_column: str
    id_source: Source
    columns: tuple[ColumnSpec, ...]
    redis_url: str
    written_at: float  # unix seconds: the snapshot's event time, for every row without a column
    event_time_column: str | None = None  # each row's event time (see ingest.encode)
    ordered: bool = True  # False: no ordering guard, last writer wins (a first load)
    chunk_size: int = 500
    retry: RetrySpec = field(default_factory=RetrySpec)
    socket_timeout: float = 5.0
    connect_timeout: float = 1.0
    max_connections: int = 4
    redis_retries: int = 1
    durability: Durability = ASYNCHRONOUS  # replicas each chunk waits for
    profile_dir: str | None = None  # if set, each task writes a cProfile dump there
    aggregated: bool = False  # window aggregations: the input is events (ingest.backfill)
