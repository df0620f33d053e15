"""What every benchmark's results file starts with, and its plots (matplotlib, PNG)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class PerEntity:
    """What a serving benchmark's cell derives from its measured window, defined once for
    every benchmark: ``requests`` answered in ``seconds``, of ``batch`` entities each (a
    field of the cell, or a constant of its class), while the server and Redis spent
    ``server_cpu`` and ``redis_cpu`` seconds (read from /proc)."""

    requests: int
    seconds: float
    server_cpu: float
    redis_cpu: float
    batch: int

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds

    @property
    def entities(self) -> int:
        """Entities looked up in the window (at least one, to divide by)."""
        return max(1, self.requests * self.batch)

    def per_entity(self, cpu: float) -> float:
        """``cpu`` seconds as µs per entity looked up."""
        return cpu / self.entities * 1e6

    @property
    def server_us(self) -> float:
        return self.per_entity(self.server_cpu)

    @property
    def redis_us(self) -> float:
        return self.per_entity(self.redis_cpu)


def header(setup: str) -> list[str]:
    """The command that made the results and the machine's load, then ``setup``."""
    load = os.getloadavg()
    args = "".join(f" {a}" for a in sys.argv[1:])
    return [
        f"```\n$ python3 benchmarks/{Path(sys.argv[0]).name}{args}\n```",
        f"Load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{os.cpu_count()} cores. {setup}",
    ]


@contextlib.contextmanager
def worktree(rev: str, into: Path) -> Iterator[Path]:
    """An older revision checked out at ``into`` (a git worktree), removed afterwards: a
    `feature-store serve` started there (``ServingProcess(cwd=...)``) runs that code, with
    its own native extension (without one it would run the pure-Python reference)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True,
        capture_output=True,
    )
    try:
        native_extension(rev, into)
        yield into
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(into)],
            check=False,
            capture_output=True,
        )


def save(out: Path | None, title: str, lines: Sequence[str]) -> None:
    """Print the results, and write them as markdown to ``out`` if given."""
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(f"# {title}\n\n{text}\n")


def line_plot(
    path: Path, series: Mapping[str, Sequence[float]], title: str, xlabel: str, ylabel: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label, values in series.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(
    ax: Any,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str = "CPU µs per entity looked up",
    log: bool = False,
    fontsize: int = 7,
) -> None:
    """Grouped bars on ``ax`` (a matplotlib Axes): one group per label, one bar per series
    (the server's CPU beside Redis's, say), side by side."""
    width = 0.8 / len(series)
    xs = range(len(labels))
    for n, (name, values) in enumerate(series.items()):
        offset = (n - (len(series) - 1) / 2) * width
        ax.bar([x + offset for x in xs], list(values), width, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(list(xs), list(labels), fontsize=fontsize)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()


def native_extension(rev: str, tree: Path) -> None:
    """Put ``rev``'s extension into ``tree``'s package: this checkout's where ``native/``
    is the same in both, else built from ``rev``'s sources (maturin, a wheel unpacked)."""
    same = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", rev, "--", "native"])
    if same.returncode == 0:
        for built in (ROOT / "feature_store").glob("_native*.so"):
            shutil.copy2(built, tree / "feature_store" / built.name)
        return
    print(f"building {rev}'s native extension ...", flush=True)
    wheels = tree / "target-wheels"
    maturin = Path(sys.executable).with_name("maturin")
    subprocess.run(
        [str(maturin), "build", "--release", "--quiet", "--out", str(wheels)],
        cwd=tree,
        check=True,
    )
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("feature_store/_native") and name.endswith(".so"):
                (tree / name).write_bytes(archive.read(name))
