"""The package's imports form no circle, and its layers point one way: the core (registry,
layout, serialization, the store client) imports neither serving nor ingest, serving and
ingest never import each other, and inside serving the L1 (``l1``) is below the API
(``api``), which is below the native fronts' glue (``fronts``). Every import counts, at
module level, under ``TYPE_CHECKING`` or inside a function: a deferred import is still a
dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "feature_store"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports."""
    modules = {
        module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if "proto" not in p.relative_to(PACKAGE).parts  # generated
    }
    # the Rust extension, a leaf: its stub names it
    extensions = {module_name(p) for p in PACKAGE.glob("*.pyi")}
    graph: dict[str, set[str]] = {name: set() for name in extensions}
    for name, path in modules.items():
        found: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                # a submodule named is that module (its package's __init__ re-exports
                # aside); any other name is the module's own
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in modules or t in extensions] or [base]
            else:
                continue
            for target in targets:
                if (target in modules or target in extensions) and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, if there is any."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_imports_itself_in_a_circle() -> None:
    found = cycle(imports())
    assert found is None, " -> ".join(found or [])


def test_a_circle_is_found() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("feature_store.registry", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.layout", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.serialization", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.store", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.batch", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.client", ("feature_store.serving", "feature_store.ingest")),
        ("feature_store.serving", ("feature_store.ingest",)),
        # inside serving: the L1 below the API, the API below the fronts
        ("feature_store.serving.l1", ("feature_store.serving.api", "feature_store.serving.fronts")),
        ("feature_store.serving.api", ("feature_store.serving.fronts",)),
        ("feature_store.ingest", ("feature_store.serving",)),
    ],
)
def test_layers_point_one_way(layer: str, forbidden: tuple[str, ...]) -> None:
    graph = imports()
    wrong = {
        (module, target)
        for module, targets in graph.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if target.startswith(forbidden)
    }
    assert not wrong, sorted(wrong)
