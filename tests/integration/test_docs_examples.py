"""The docs as tests: every code block of README.md and docs/*.md that a user would run.

- each registry in a ``yaml`` block loads;
- each ``feature-store …`` command line of a ``sh``/``bash`` block (and a ``$ feature-store``
  line of a plain block) parses with the CLI's own parser (as cheap as ``--help``);
- each ``python`` block runs, in a directory with the sample registry as ``features.yaml``,
  against an embedded Redis holding the demo's data and a server serving it;
- README's serving steps run as written: ``feature-store serve``, the ``curl`` lookup (whose
  answer must be the one shown, ages aside) and the Python client.

A block that is not meant to run says so in its first line, a comment with the word
"excerpt", and is skipped. The examples name the default addresses (Redis on
``127.0.0.1:6379``, REST on ``8000``, gRPC on ``50051``); the tests put the free ports of
their own servers in their place, and nothing else.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from feature_store import sample
from feature_store.cli import build_parser
from feature_store.embedded import free_port
from feature_store.registry import parse_registry

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
DEMO_ENTITIES = 200


def feature_log(work: Path) -> list[str]:
    """The server logs what it serves, for the serving log's examples (docs/logging.md)."""
    return ["--feature-log", f"file://{work / 'feature-log'}", "--feature-log-roll-seconds", "1"]


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def excerpt(self) -> bool:
        first = self.text.lstrip().splitlines()[0] if self.text.strip() else ""
        return first.startswith(("#", "//")) and "excerpt" in first.lower()


def blocks(path: Path) -> list[Block]:
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            out.append(Block(path, i + 1, lines[i][3:].strip(), "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]


def _ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


REGISTRIES = [
    b for b in ALL if b.lang == "yaml" and re.search(r"^(entities|feature_groups):", b.text, re.M)
]
PYTHON = [b for b in ALL if b.lang == "python"]


def command_lines(block: Block) -> list[str]:
    """The ``feature-store`` command lines of a block, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", block.text).splitlines()
    out = []
    for line in joined:
        line = line.strip()
        if block.lang in ("sh", "bash"):
            line = line.removeprefix(".venv/bin/")
        elif block.lang == "":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        else:
            continue
        if line.startswith("feature-store "):
            out.append(line)
    return out


COMMANDS = [(b, line) for b in ALL for line in command_lines(b)]


def test_the_docs_have_the_examples_these_tests_run() -> None:
    # a change in how blocks are found must not leave these tests checking nothing
    assert len(REGISTRIES) >= 4
    assert len(PYTHON) >= 8
    assert len(COMMANDS) >= 15
    assert {b.path.name for b in PYTHON} >= {"README.md", "serving.md", "ingest.md"}


@pytest.mark.parametrize("block", REGISTRIES, ids=_ids(REGISTRIES))
def test_each_registry_example_loads(block: Block) -> None:
    if block.excerpt:
        pytest.skip("marked as an excerpt")
    registry = parse_registry(block.text, source=block.where)
    assert registry.groups, block.where


@pytest.mark.parametrize(
    ("block", "line"), COMMANDS, ids=[f"{b.where}:{line.split()[1]}" for b, line in COMMANDS]
)
def test_each_documented_command_line_parses(block: Block, line: str) -> None:
    argv = shlex.split(line, comments=True)
    parser = build_parser()
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"{block.where}: {line!r} does not parse (exit {e.code})")
    assert callable(getattr(args, "func", None)), f"{block.where}: {line!r} names no command"


# --- the Python blocks and README's serving steps, on the demo's data -------------------


@dataclass(frozen=True)
class Served:
    env: dict[str, str]
    work: Path
    redis_url: str
    rest_port: int
    grpc_port: int

    def localized(self, text: str) -> str:
        """An example with this test's ports for the documented defaults."""
        text = text.replace("redis://127.0.0.1:6379", self.redis_url)
        text = text.replace("/var/lib/feature-log", str(self.work / "feature-log"))
        text = re.sub(r"(127\.0\.0\.1|localhost):8000\b", rf"\g<1>:{self.rest_port}", text)
        return re.sub(r"(127\.0\.0\.1|localhost):50051\b", rf"\g<1>:{self.grpc_port}", text)


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _serve_line() -> str:
    (line,) = [
        line for b in blocks(ROOT / "README.md") for line in command_lines(b) if " serve " in line
    ]
    return line


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``feature-store demo`` then README's ``feature-store serve`` line, as a user on a
    fresh machine: the default data directory (under a temporary XDG_DATA_HOME), no URL."""
    work = tmp_path_factory.mktemp("docs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATURE_")}
    env["XDG_DATA_HOME"] = str(work / "data")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    (work / "features.yaml").write_text(sample.registry_text())
    demo = _run([str(BIN / "feature-store"), "demo", "--entities", str(DEMO_ENTITIES)], env, work)
    assert demo.returncode == 0, demo.stderr
    rest, grpc = free_port(), free_port()
    argv = shlex.split(_serve_line(), comments=True)
    argv[0] = str(BIN / "feature-store")
    log = work / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--port", str(rest), "--grpc-port", str(grpc), *feature_log(work)],
            env=env,
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{rest}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the README's serve line did not get ready"
            time.sleep(0.2)
        port = int((work / "data" / "feature-store" / "redis" / "embedded.port").read_text())
        yield Served(env, work, f"redis://127.0.0.1:{port}", rest, grpc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _without_ages(answer: dict[str, object]) -> dict[str, object]:
    results = answer["results"]
    assert isinstance(results, list)
    return {**answer, "results": [{**r, "ages": sorted(r["ages"])} for r in results]}


def test_readme_curl_lookup_answers_as_shown(served: Served) -> None:
    readme = blocks(ROOT / "README.md")
    (curl,) = [b for b in readme if b.lang == "sh" and b.text.startswith("curl ")]
    shown = readme[readme.index(curl) + 1]
    assert shown.lang == "json", f"{curl.where}: the answer should follow the curl line"
    run = subprocess.run(
        ["bash", "-c", served.localized(curl.text)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    answer = orjson.loads(run.stdout)
    assert _without_ages(answer) == _without_ages(orjson.loads(shown.text))
    for result in answer["results"]:
        assert set(result["ages"]) == {sample.GROUP}


def _python_data(work: Path) -> None:
    """``data/consumers.parquet``: the sample rows as ``feature-store generate`` writes them."""
    from feature_store.ingest.generate import _arrow_fields, _generate

    ids = pa.record_batch([pa.array(range(DEMO_ENTITIES), pa.int64())], names=["id"])
    (batch,) = _generate(0, pa.schema(_arrow_fields()), iter([ids]))
    (work / "data").mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_batches([batch]), work / "data" / "consumers.parquet")


def _served_log(served: Served) -> None:
    """Some lookups, and the serving log's first file rolled."""
    logged = served.work / "feature-log" / "entity_type=consumer"
    body = {"entity_type": "consumer", "ids": list(range(10)), "groups": [sample.GROUP]}
    deadline = time.monotonic() + 60
    while not list(logged.rglob("*.parquet")):
        answer = httpx.post(f"http://127.0.0.1:{served.rest_port}/v1/features/get", json=body)
        assert answer.status_code == 200, answer.text
        assert time.monotonic() < deadline, "the serving log wrote no file"
        time.sleep(0.5)


@pytest.mark.parametrize("block", PYTHON, ids=_ids(PYTHON))
def test_each_python_example_runs(block: Block, served: Served) -> None:
    if block.excerpt:
        pytest.skip("marked as an excerpt")
    if "data/consumers.parquet" in block.text:
        _python_data(served.work)
    if "/var/lib/feature-log" in block.text:
        _served_log(served)
    if "consumer_features-2026-11-27.parquet" in block.text:  # the nightly job's input
        _python_data(served.work)
        (served.work / "data" / "consumers.parquet").rename(
            served.work / "consumer_features-2026-11-27.parquet"
        )
    run = _run([sys.executable, "-c", served.localized(block.text)], served.env, served.work)
    assert run.returncode == 0, f"{block.where} failed:\n{run.stdout}\n{run.stderr}"


def test_readme_python_client_prints_the_curl_answer(served: Served) -> None:
    (client,) = [b for b in blocks(ROOT / "README.md") if "FeatureClient(" in b.text]
    run = _run([sys.executable, "-c", served.localized(client.text)], served.env, served.work)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["0", "1", "-1"]
    assert lines[2].endswith("['missing', 'missing', 'missing']")


def test_readme_go_and_java_clients_print_what_is_shown(served: Served) -> None:
    readme = blocks(ROOT / "README.md")
    runs = [b for b in readme if b.lang == "sh" and b.text.startswith("cd clients/")]
    assert [b.text.split()[1] for b in runs] == ["clients/go", "clients/java"]
    shown = readme[readme.index(runs[-1]) + 1]
    assert shown.lang == "json", f"{runs[-1].where}: the output should follow the commands"
    expected = [orjson.loads(line) for line in shown.text.splitlines()]
    for block in runs:
        run = subprocess.run(
            ["bash", "-c", served.localized(block.text)],
            cwd=ROOT,
            env=served.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert run.returncode == 0, f"{block.where}: {run.stderr}"
        assert [orjson.loads(line) for line in run.stdout.splitlines()] == expected, block.where


def test_the_documented_load_generator_runs_against_the_served_data(served: Served) -> None:
    (block,) = [
        b
        for b in blocks(ROOT / "docs" / "serving.md")
        if b.lang == "sh" and "go run ./cmd/feature-load" in b.text
    ]
    text = served.localized(block.text).replace("/tmp/batches.txt", str(served.work / "b.txt"))
    run = subprocess.run(
        ["bash", "-c", text], cwd=ROOT, env=served.env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, f"{block.where}: {run.stderr}"
    done = orjson.loads(run.stdout)
    assert done["requests"] > 0, done
    assert done["errors"] == 0, done


def test_every_command_of_the_cli_is_documented() -> None:
    """``feature-store --help`` and the docs agree: each command is shown in README.md or
    docs/ (the lines that name them parse, above)."""
    import argparse

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    text = " ".join(p.read_text(encoding="utf-8") for p in DOCS)
    missing = [name for name in commands.choices if f"feature-store {name}" not in text]
    assert not missing, f"commands no doc shows: {missing}"
    assert len(commands.choices) >= 10
