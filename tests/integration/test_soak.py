"""Two minutes of `benchmarks/soak.py`: mixed load on a Redis Cluster 3+3 through a master
SIGKILL, a serving worker SIGKILL, a SIGSTOPped master and the nightly Spark job.

The full run (10 minutes, results in benchmarks/results/soak.md) is the benchmark; this is
its short form, with the same oracle, held to what must never happen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_two_minutes_under_faults_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "soak.py"),
            *("--minutes", "2", "--entities", "2000", "--json", str(out)),
        ],
        capture_output=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    r = json.loads(out.read_text())
    # every answer checked, and none wrong
    assert r["values_checked"] > 1000
    assert r["wrong_entity_values"] == 0
    assert r["never_written_values"] == 0
    # no 500 anywhere, nothing failed before the first fault, every fault's window closes
    assert r["http_500"] == 0
    assert r["grpc_internal"] == 0
    assert r["failed_before_any_fault"] == 0
    assert [w["fault"].split()[0] for w in r["faults"]] == [
        "master",
        "serving",
        "master",
        "nightly",
    ]
    for w in r["faults"]:
        shown = json.dumps(w)  # the whole window, kinds included (pytest cuts a dict short)
        assert not w["detail"].startswith("FAILED"), shown
        # errors stop within 20 s of the fault's end: the cluster ok again after a master's
        # kill or stop, the nightly job finished (its Spark job shares the two cores with
        # everything else for about 40 s: a lone read past the adaptive timeout in it is a
        # 503 that the client may retry, not a 500)
        assert w["window"] is None or w["window"][1] < w["lasted"] + 20, shown
        assert w["lasted"] < 120, shown
    # every acknowledged write was served by both deployments within the bound
    assert r["writes"].get("200", 0) > 20
    assert r["unserved_writes"] == []
    assert r["freshness_s"]["A"]["count"] == r["writes"]["200"]
    # no leak: RSS flat after warm-up; open fds flat once the faults have settled. A
    # failover makes a worker's pools open connections to the promoted master: a step of
    # about ten descriptors across the run (12.8 seen in a two-minute run), not a trend,
    # so fds are compared within the stretch after the last fault that moves connections:
    # the most open in its first half against the most in its second. Redis pools also grow
    # by a connection when concurrency reaches a new peak, up to their bound (`ss` on a
    # worker: 7 to 10 connections to one master over 100 s, one at a time), which read as
    # 5.0 to 5.4 fds of growth in two of four runs: allowed up to 8 (about 6,000 requests
    # go through the stretch, so a leak of one fd per 500 of them still shows)
    for name in ("A", "B"):
        res = r["resources"][name]
        assert res["rss_drift"] <= 0.10, r["resources"]
        assert res["fds_settled"] is not None, r["resources"]
        first, second = res["fds_settled"]
        assert second - first <= max(8.0, 0.05 * first), r["resources"]
