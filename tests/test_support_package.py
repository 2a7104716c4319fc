"""The support package (support/) is shared by the tests and the benchmarks and is never
shipped: the benchmarks import nothing from tests/, shipped code imports neither, and
setup.cfg's package list leaves support/ out."""
from __future__ import annotations

import ast
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("builder", "bls", "engine_cache", "python_backends")


def _imported_tops(path: Path) -> set[str]:
    """The top-level package of every absolute import in a file (function level too)."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def _importers(folders, top: str) -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for folder in folders
                  for path in (ROOT / folder).rglob("*.py") if top in _imported_tops(path))


def test_benchmarks_do_not_import_the_tests():
    assert _importers(["bench", "support"], "tests") == []


def test_shipped_code_imports_neither_support_nor_tests():
    assert _importers(SHIPPED, "support") == []
    assert _importers(SHIPPED, "tests") == []


def test_support_is_not_installed():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    include = config["options.packages.find"]["include"].split()
    assert include and not [name for name in include if name.split(".")[0] == "support"]
