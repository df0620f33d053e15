"""The user-facing scripts run on a machine whose ``python3`` has none of the project's packages.

A fresh machine's system interpreter is bare; the project's packages live in ``.venv``
(scripts/setup.sh). A script that runs ``python3`` from PATH passes on a developer's
machine that has packages installed by hand and fails for every new user. These tests put
a bare ``python3`` first on PATH (the base interpreter with ``-S``: no site-packages at
all) and run the scripts as the README and docs tell a user to.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_SCRIPTS = [
    *sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")),
    ROOT / "benchmarks" / "ycsb" / "histogram.py",
]

# the names a user types, python3 and python: both are the bare interpreter in these tests
BARE_NAMES = tuple(f"python{suffix}" for suffix in (sys.version_info.major, ""))

# A command that starts whatever python3/python PATH has: `exec python3`, a shell line or
# `$(...)` that begins with it, or a Python argv list whose first item is "python3".
_SHELL_BARE = re.compile(r"(^|[;&|(]\s*|\bexec\s+|\$\(\s*)python3?(\.\d+)?(\s|$)")
_PY_BARE = re.compile(r"""[\[(,]\s*["']python3?(\.\d+)?["']""")


def _bare_python_dir(tmp_path: Path) -> Path:
    """A directory whose python3 and python are the base interpreter without site-packages."""
    base = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    )
    assert base.exists(), base
    bindir = tmp_path / "bare-bin"
    bindir.mkdir()
    for name in BARE_NAMES:
        wrapper = bindir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{base}" -S "$@"\n')
        wrapper.chmod(0o755)
    probe = subprocess.run(
        [str(bindir / "python3"), "-c", "import redis"], capture_output=True, text=True
    )
    assert probe.returncode != 0, "the bare interpreter must not import the project's packages"
    return bindir


def _bare_env(bindir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return env


def _shell_lines(path: Path) -> list[tuple[int, str]]:
    return [
        (n, line)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if not line.lstrip().startswith("#")
    ]


def test_no_script_or_test_starts_a_bare_interpreter() -> None:
    """Static guard: scripts and tests name no `python3` from PATH (sys.executable or .venv)."""
    found: list[str] = []
    shell = [
        *(ROOT / "scripts").glob("*.sh"),
        ROOT / "benchmarks" / "ycsb" / "run",
        ROOT / "Makefile",
        ROOT / ".ci" / "run",
    ]
    for path in shell:
        found += [
            f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in _shell_lines(path)
            if _SHELL_BARE.search(line)
        ]
    python = [*(ROOT / "scripts").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    python += [p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__)]
    for path in python:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _PY_BARE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "bare interpreter names (use sys.executable or .venv):\n" + "\n".join(found)


def test_ycsb_run_uses_the_project_environment(tmp_path: Path) -> None:
    env = _bare_env(_bare_python_dir(tmp_path))
    done = subprocess.run(
        [str(ROOT / "benchmarks" / "ycsb" / "run"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("script", BENCHMARK_SCRIPTS, ids=lambda p: p.name)
def test_benchmark_scripts_run_from_a_bare_python3(script: Path, tmp_path: Path) -> None:
    """`python3 benchmarks/x.py` with the system python3 re-runs itself in the project's .venv."""
    bindir = _bare_python_dir(tmp_path)
    done = subprocess.run(
        [str(bindir / "python3"), str(script), "--help"],
        capture_output=True,
        text=True,
        env=_bare_env(bindir),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


def test_a_missing_environment_says_what_to_run(tmp_path: Path) -> None:
    """A checkout without .venv: each entry point exits 2 naming scripts/setup.sh."""
    bindir = _bare_python_dir(tmp_path)
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks" / "ycsb").mkdir(parents=True)
    for rel in ("benchmarks/_project_env.py", "benchmarks/memory.py", "benchmarks/ycsb/run"):
        shutil.copy2(ROOT / rel, checkout / rel)
    (checkout / "scripts").mkdir()
    for rel in ("scripts/demo.sh", "scripts/gen_proto.py"):
        shutil.copy2(ROOT / rel, checkout / rel)
    env = _bare_env(bindir)
    python3 = str(bindir / "python3")
    commands = {
        "benchmarks/ycsb/run": [str(checkout / "benchmarks" / "ycsb" / "run"), "--help"],
        "benchmarks/memory.py": [python3, str(checkout / "benchmarks" / "memory.py")],
        "scripts/demo.sh": ["bash", str(checkout / "scripts" / "demo.sh")],
        "scripts/gen_proto.py": [python3, str(checkout / "scripts" / "gen_proto.py")],
    }
    for name, command in commands.items():
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=checkout, timeout=60
        )
        assert done.returncode != 0, name
        assert re.search(r"setup\.sh|make proto", done.stderr), (name, done.stderr)
        assert "Traceback" not in done.stderr, (name, done.stderr)
