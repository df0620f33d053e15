"""Run a benchmark script in the project's environment, whichever ``python`` started it.

Imported first by every script in this folder (``import _project_env``), before any
third-party import. A user types ``python3 benchmarks/serving.py`` with the system
interpreter, which has none of the project's packages; this re-runs the script with the
interpreter that has them instead of failing at ``import redis``:

1. the running interpreter, if it imports the project (an activated or custom environment);
2. else ``.venv/bin/python`` at the top of the checkout, which ``scripts/setup.sh`` builds;
3. else ``$VIRTUAL_ENV/bin/python``;
4. else exit 2 with what to run.

Standard library only: it must run on a bare interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("feature_store", "redis", "orjson")
SETUP_HINT = "run ./scripts/setup.sh (or make setup) at the top of the checkout first"


def has_project(modules: tuple[str, ...] = NEEDED) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def candidates(root: Path = ROOT) -> list[Path]:
    found = [root / ".venv" / "bin" / "python"]
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        found.append(Path(venv) / "bin" / "python")
    return [p for p in found if os.access(p, os.X_OK)]


def ensure(root: Path = ROOT) -> None:
    """Return if this interpreter has the project; else exec one that has it, or exit 2."""
    if has_project():
        return
    script = Path(sys.argv[0]).resolve()
    for python in candidates(root):
        # compared by prefix: a venv's python is a symlink to the base interpreter
        if Path(sys.prefix).resolve() == python.parent.parent.resolve():
            break  # already that environment, and it lacks the project: setup is incomplete
        os.execv(python, [str(python), str(script), *sys.argv[1:]])
    missing = ", ".join(m for m in NEEDED if importlib.util.find_spec(m) is None)
    sys.stderr.write(
        f"{script.name}: the project's environment is missing ({sys.executable} lacks "
        f"{missing}, and there is no {root / '.venv'}): {SETUP_HINT}\n"
    )
    raise SystemExit(2)


ensure()
