"""What a YCSB row's runs give, as the runner fills them and the report and the sweeps read
them: each run's measured output (``MeasuredLike``), the run's settings (``SettingsLike``)
and a row's results (``RowResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import ycsb_output

BATCH = "BATCH_READ"


class MeasuredLike(Protocol):
    output: ycsb_output.Output
    store_cpu_s: float
    api_cpu_s: float | None
    wall_s: float
    threads: int
    target: int
    client_cpu_s: float


class SettingsLike(Protocol):
    records: int
    operations: int
    target: int
    threads: int
    batch_keys: int
    batch_fields: int
    seconds: int | None
    sweep: tuple[int, ...]
    workloads: tuple[str, ...]
    bound_ms: int


@dataclass
class RowResult:
    name: str
    label: str
    load: MeasuredLike | None = None
    runs: dict[str, MeasuredLike] = field(default_factory=dict)
    not_run: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    reads: str | None = None  # a row that loads nothing: the row whose records it reads
    # each workload's runs of a sweep: unthrottled at each thread count, then fixed rates
    sweeps: dict[str, list[MeasuredLike]] = field(default_factory=dict)
    memory_per_record: float | None = None  # Redis's used_memory after the load, per record

    def batch(self, run: str) -> ycsb_output.Operation | None:
        m = self.runs.get(run)
        return None if m is None else m.output.operations.get(BATCH)

    def cpu_us_per_lookup(self, run: str, lookups_per_batch: int) -> float | None:
        m, op = self.runs.get(run), self.batch(run)
        if m is None or op is None:
            return None
        return m.store_cpu_s * 1e6 / (sum(op.returns.values()) * lookups_per_batch)
