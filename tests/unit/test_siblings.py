"""Readiness across the workers of ``serve --workers N`` (serving/siblings.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from feature_store.serving.siblings import Siblings


def test_ready_when_every_live_worker_has_joined(tmp_path: Path) -> None:
    me = Siblings(tmp_path, workers=2)
    assert me.serving() == 0
    me.join()
    assert (me.serving(), me.all_serving()) == (1, False)
    # a worker that died without leaving (SIGKILL): its pid is gone, and so is its file
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / str(dead.pid)).touch()
    (tmp_path / "notes.txt").touch()  # not a worker's
    assert me.serving() == 1
    assert not (tmp_path / str(dead.pid)).exists()
    # a live one (this test's parent process stands in for the other worker)
    (tmp_path / str(Path("/proc/self/stat").read_text().split()[3])).touch()
    assert (me.serving(), me.all_serving()) == (2, True)
    me.leave()
    me.leave()  # twice is fine (a stop after a failed start)
    assert (me.serving(), me.all_serving()) == (1, False)
