"""Rendering specs and starting real tritonservers for the server tests."""
from __future__ import annotations

from pathlib import Path

from builder.pipeline import build_repository
from builder.serve.server import Ports, TritonServer, free_port, start_on_free_ports
from builder.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


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
