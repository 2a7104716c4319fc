"""trident_common's pure modules, for the builder side of one fact.

trident_common is not an installed package: its sources are copied into each model
folder, where the stub imports them as a top-level package. The few modules the builder
needs too (the tensor interface, the error classes, the drain's files) import nothing
from trident, so each is loaded alone from its file, once per process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

COMMON_DIR = Path(__file__).resolve().parents[1] / "python_backends" / "trident_common"


def load(name: str) -> ModuleType:
    """trident_common/<name>.py, as the module `trident_common_<name>`."""
    alias = f"trident_common_{name}"
    return sys.modules.get(alias) or load_file(alias, COMMON_DIR / f"{name}.py")


def load_file(alias: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(alias, path)
    # A .py path always has a spec and a source loader (None is for unknown suffixes).
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module  # dataclasses look their module up while made
    spec.loader.exec_module(module)
    return module
