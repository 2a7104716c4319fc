"""Which tritonserver to run and the environment it needs: the one on PATH (NVIDIA's
container), else the one bundled in the nvidia-pytriton wheel, whose Python-backend stub
must be put in place and whose stub needs libpython on the library path."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from builder.errors import TridentError


class ServeError(TridentError):
    """The server could not start or did not become ready; the message says why."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None  # None: the server's own default (NVIDIA's container)
    bundled: bool


def _bundled_root() -> Path | None:
    # find_spec, not import: the pytriton package itself is not used (installed --no-deps).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def find_tritonserver() -> TritonInstall:
    """tritonserver from PATH (e.g. NVIDIA's container) if present, else the bundled one."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None, bundled=False)
    root = _bundled_root()
    if root is None:
        raise ServeError(
            "no tritonserver on PATH and the nvidia-pytriton wheel is not "
            "installed (run `make install`)"
        )
    prepare_python_stub(root)
    return TritonInstall(root / "bin" / "tritonserver", root / "backends", bundled=True)


def prepare_python_stub(root: Path) -> None:
    """The bundled Python backend looks for its stub beside libtriton_python.so."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    target = root / "backends" / "python" / "triton_python_backend_stub"
    if not source.is_file():
        raise ServeError(f"the bundled Triton has no Python backend stub for Python {version}")
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        tmp = target.with_suffix(".tmp")
        shutil.copy2(source, tmp)
        os.replace(tmp, target)


def server_environment() -> dict[str, str]:
    """The stub takes its Python from PATH and needs libpython on the library path."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    return env


def needs_trtllm_orchestrator(repository: Path) -> bool:
    """TRT-LLM's orchestrator mode (several TRT-LLM models or multi-GPU engines in one
    server) is rendered as an executor_worker_path parameter and needs this variable."""
    return any(
        "executor_worker_path" in config.read_text() for config in repository.glob("*/config.pbtxt")
    )
