"""The job's report: printed for people, written as JSON for schedulers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

import orjson


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    BAD_ROWS_OVER_THRESHOLD = "bad_rows_over_threshold"  # good rows written; exit code 1
    FAILED = "failed"  # the job stopped; the counts are partial; exit code 2


EXIT_CODES = {Outcome.SUCCEEDED: 0, Outcome.BAD_ROWS_OVER_THRESHOLD: 1, Outcome.FAILED: 2}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The run fails (exit 1) when bad rows exceed either bound; None means no bound."""

    max_bad_rows: int | None = 0
    max_bad_fraction: float | None = None

    def exceeded(self, bad: int, rows: int) -> str | None:
        """Why the bad rows are too many, or None."""
        if self.max_bad_rows is not None and bad > self.max_bad_rows:
            return f"{bad:,} bad rows is more than --max-bad-rows {self.max_bad_rows:,}"
        if self.max_bad_fraction is not None and rows and bad / rows > self.max_bad_fraction:
            return (
                f"{bad / rows:.4%} bad rows is more than --max-bad-fraction "
                f"{self.max_bad_fraction:g}"
            )
        return None


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds summed over all tasks, measured inside the Python workers."""

    read: float = 0.0  # waiting for Spark to hand over the next Arrow batch
    encode: float = 0.0
    redis: float = 0.0  # pipeline round trips, retries and backoff included


@dataclass(frozen=True, slots=True)
class IngestReport:
    outcome: Outcome
    group: str
    input: str
    target: str  # the Redis URL, password redacted
    rows_read: int
    entities_written: int
    values_written: int
    values_removed: int
    # rows not written: Redis holds a newer event time for their entity's group
    entities_skipped: int
    bad_rows: int
    bad_rows_by_reason: dict[str, int]
    elapsed_seconds: float
    values_per_second: float
    written_at: float  # the snapshot's event time: every row's without event_time_column
    event_time_column: str | None  # the column each row's event time came from
    # where written_at came from: "given" (--event-time), "input files" (their newest
    # modification time), "job start" (an input of no files, or a column's times instead)
    written_at_from: str
    ordered: bool  # the ordering guard was on (off: last writer wins)
    chunk_size: int
    chunks: int
    retries: int
    tasks: int
    quarantine: str | None  # where the bad rows are, if any
    task_seconds: Timings = field(default_factory=Timings)
    message: str | None = None  # why the run did not succeed
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.to_json() + b"\n")
        tmp.replace(path)  # a scheduler never reads half a report

    def summary(self) -> str:
        lines = [
            f"ingest {self.outcome.value}: group {self.group} from {self.input} to {self.target}",
            f"  rows read          {self.rows_read:>15,}",
            f"  entities written   {self.entities_written:>15,}",
            f"  values written     {self.values_written:>15,}",
            f"  values removed     {self.values_removed:>15,}  (null cells)",
            f"  entities skipped   {self.entities_skipped:>15,}  (Redis holds newer events)",
            f"  bad rows           {self.bad_rows:>15,}",
        ]
        for reason, count in sorted(self.bad_rows_by_reason.items()):
            lines.append(f"    {reason:<17}{count:>15,}")
        if self.quarantine:
            lines.append(f"  quarantine         {self.quarantine}")
        lines += [
            f"  elapsed            {self.elapsed_seconds:>14.1f}s",
            f"  values/s           {self.values_per_second:>15,.0f}",
            f"  chunks, retries    {self.chunks:>9,}, {self.retries:,}",
            f"  task time (s)      read {self.task_seconds.read:.1f}, "
            f"encode {self.task_seconds.encode:.1f}, redis {self.task_seconds.redis:.1f}",
        ]
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.message:
            lines.append(f"  {self.message}")
        return "\n".join(lines)
