"""Reading YCSB's text output, and refusing to trust it blindly.

YCSB exits 0 even when every operation failed, or when a binding's init() failed and its
threads never ran. ``check`` therefore fails unless every ``Return=`` line is OK and the
operations add up to the count that was asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

READ_MODIFY_WRITE = "READ-MODIFY-WRITE"
LINE = re.compile(r"^\[([^\]]+)\], ([^,]+), (.+)$")


class YCSBRunFailed(Exception):
    """A YCSB run had failed, missing or unexpected operations."""

    def __init__(self, message: str, output: Output | None = None) -> None:
        super().__init__(message)
        self.output = output  # what the run did measure, if it finished


@dataclass
class Operation:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    returns: dict[str, int] = field(default_factory=dict)

    def ms(self, metric: str) -> float:
        """A latency metric given in microseconds, in milliseconds."""
        return self.metrics[metric] / 1000.0


@dataclass
class Output:
    operations: dict[str, Operation]

    @property
    def runtime_s(self) -> float:
        return self.operations["OVERALL"].metrics["RunTime(ms)"] / 1000.0

    @property
    def throughput(self) -> float:
        return self.operations["OVERALL"].metrics["Throughput(ops/sec)"]

    def count(self, name: str) -> int:
        op = self.operations.get(name)
        return 0 if op is None else sum(op.returns.values())

    @property
    def done(self) -> int:
        """Operations the workload made: every ``Return=``, less one per read-modify-write,
        whose read and update return under READ and UPDATE (it has no ``Return=`` of its own).
        """
        returned = sum(sum(op.returns.values()) for op in self.operations.values())
        rmw = self.operations.get(READ_MODIFY_WRITE)
        return returned - (int(rmw.metrics.get("Operations", 0)) if rmw else 0)


def parse(text: str) -> Output:
    ops: dict[str, Operation] = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m is None:
            continue
        name, metric, value = m.groups()
        op = ops.setdefault(name, Operation(name))
        if metric.startswith("Return="):
            op.returns[metric[len("Return=") :]] = int(value)
        else:
            try:
                op.metrics[metric] = float(value)
            except ValueError:
                continue
    return Output(ops)


def check(text: str, expected_ops: int | None, stderr: str = "") -> Output:
    """The parsed output, or YCSBRunFailed saying what went wrong. ``expected_ops`` None: a
    run bounded by its time (``maxexecutiontime``), which must have done some operations."""
    out = parse(text)
    problems = []
    if "OVERALL" not in out.operations:
        problems.append("no [OVERALL] section: YCSB did not finish")
    for op in out.operations.values():
        if op.name.endswith("-FAILED"):
            problems.append(f"[{op.name}] has measurements: operations failed")
        for status, n in op.returns.items():
            if status != "OK" and n > 0:
                problems.append(f"[{op.name}] Return={status}, {n}")
    done = out.done
    if expected_ops is None and done == 0:
        problems.append("no operation returned within the run's time")
    elif expected_ops is not None and done != expected_ops:
        problems.append(f"{done} operations returned, {expected_ops} were asked for")
    if problems:
        # YCSB's DBWrapper prints one banner per thread: without them, the bindings' reasons
        lines = [x for x in stderr.strip().splitlines() if not x.startswith("DBWrapper:")]
        tail = "\n".join(lines[-15:])
        detail = f"\nstderr ends with:\n{tail}" if tail else ""
        finished = out if "OVERALL" in out.operations else None
        raise YCSBRunFailed("; ".join(problems) + detail, finished)
    return out
