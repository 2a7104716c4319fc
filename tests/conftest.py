"""Shared test fixtures: paths, rendering, and real tritonserver instances.

Tests that start a tritonserver are marked `server` (and `vllm` when a real vLLM engine
loads); `make test-fast` skips them.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.s3_fixtures"]   # the real SeaweedFS S3 server fixtures
sys.path.insert(0, str(ROOT / "python_backends"))   # trident_common, as in the stub

from builder.pipeline import build_repository  # noqa: E402
from builder.serve.server import (Ports, TritonServer, free_port,  # noqa: E402
                                  start_on_free_ports)
from builder.spec import load_spec, parse_spec  # noqa: E402


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def free_ports() -> Ports:
    return Ports(free_port(), free_port(), free_port())


def render(spec_path_or_data, out: Path) -> Path:
    """Render a spec file (path) or spec data (dict) into out; returns out."""
    if isinstance(spec_path_or_data, dict):
        spec = parse_spec(spec_path_or_data, "<test>")
    else:
        spec = load_spec(spec_path_or_data)
    build_repository(spec, out)
    return out


def start_server(repo: Path, log_dir: Path, load_models=None, timeout_s=240.0,
                 extra_args=()) -> TritonServer:
    """A started and ready tritonserver on free ports; the caller stops it."""
    return start_on_free_ports(Path(repo), Path(log_dir) / "tritonserver.log",
                               load_models=load_models, timeout_s=timeout_s,
                               extra_args=tuple(extra_args))


@pytest.fixture(scope="session")
def default_server(tmp_path_factory):
    """The embedded default (SmolLM2 on vLLM behind `router`), one per test session."""
    tmp = tmp_path_factory.mktemp("default")
    repo = render(ROOT / "deploy" / "default.yaml", tmp / "repo")
    server = start_server(repo, tmp)
    yield server
    server.stop()


os.environ.setdefault("HF_HUB_OFFLINE", "1")
# `kill -USR1 <pytest pid>` prints every thread's stack: the way to see what a hung run
# waits for.
faulthandler.register(signal.SIGUSR1, all_threads=True)
