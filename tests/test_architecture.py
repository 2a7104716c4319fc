"""The shape of the code: the import graph between the project's modules has no cycle,
and no module grows past a size a reader can hold.

Modules are named as Python imports them: `builder.*` and `engine_cache.*` from the
repository root, `trident_common.*` from python_backends/, and the router's siblings
(`from policy import ...` inside bls/) as `bls.*`. Function-level imports count too: a
cycle hidden inside a function is still a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 420   # "about 400": a module past this should be split


def _modules() -> dict[str, Path]:
    found = {}
    for base, prefix in ((ROOT, ""), (ROOT / "python_backends", "")):
        for package in ("builder", "engine_cache", "bls", "trident_common"):
            top = base / package
            if not top.is_dir():
                continue
            for path in top.rglob("*.py"):
                parts = path.relative_to(base).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[prefix + ".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that `name` (a dotted import) refers to."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `module` imports (with the packages whose __init__ runs first)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            inside = (module + ".").startswith(node.module + ".")
            if not inside or any(name not in modules for name in names):
                names.append(node.module)   # its __init__ runs (or provides the names)
            if module.startswith("bls.") and f"bls.{node.module}" in modules:
                names.append(f"bls.{node.module}")     # a sibling in the router's folder
        for name in names:
            target = _resolve(name, modules)
            if target is None or target == module:
                continue
            targets.add(target)
            parts = target.split(".")
            for end in range(1, len(parts)):   # parent packages initialise first...
                parent = ".".join(parts[:end])
                if parent in modules and not (module + ".").startswith(parent + "."):
                    targets.add(parent)        # ...unless we are already inside them
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}   # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_project_has_no_import_cycle():
    graph = import_graph()
    assert "builder.errors" in graph and "trident_common.request" in graph
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def test_engine_cache_stands_alone():
    graph = import_graph()
    leaks = {module: sorted(t for t in targets if t.startswith("builder"))
             for module, targets in graph.items() if module.startswith("engine_cache")}
    assert not {m: t for m, t in leaks.items() if t}


def test_no_module_is_too_long():
    long = {str(path.relative_to(ROOT)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"
