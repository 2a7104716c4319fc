"""The support package (support/) is shared by the tests and the benchmarks and is never
shipped: the benchmarks import nothing from tests/, and setup.cfg's package list leaves support/
out. That shipped code imports neither is tests/test_architecture.py's."""

from __future__ import annotations

import configparser
from pathlib import Path

from tests.test_architecture import imported_tops

ROOT = Path(__file__).resolve().parent.parent


def _importers(folders, top: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if top in imported_tops(path)
    )


def test_benchmarks_do_not_import_the_tests():
    assert _importers(["bench", "support"], "tests") == []


def test_support_is_not_installed():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    include = config["options.packages.find"]["include"].split()
    assert include and not [name for name in include if name.split(".")[0] == "support"]
