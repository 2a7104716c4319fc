"""Loading a model's Python files as the stub would, under the pb_utils test double."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from tests.fakes import fake_pb_utils


@contextlib.contextmanager
def stub_imports(folder: Path, names: tuple[str, ...]):
    """For the block: `folder` first on sys.path, the modules `names` unloaded, and
    triton_python_backend_utils the test double. Afterwards every one of them is as it
    was, so later imports get the real modules again."""
    names = (*names, "triton_python_backend_utils")
    saved = {name: sys.modules.pop(name, None) for name in names}
    sys.modules["triton_python_backend_utils"] = fake_pb_utils
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module
