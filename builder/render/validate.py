"""`trident validate DIR`: check a model repository before a server ever sees it.

Each config.pbtxt must parse as Triton's ModelConfig (the schema that ships in
tritonclient), name its own directory, declare inputs and outputs explicitly (so the
repository loads with --disable-auto-complete-config), be decoupled when it streams, and
have its code where the backend looks for it. No file may carry a template leftover.
The router's router.json must be what the router's own reader (bls/router_config.py)
accepts: the router would otherwise fail to load, after tritonserver had started.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bls.router_config import RouterConfig, RouterConfigError
from builder import textfile

# ${name} (TRT-LLM's fill_template) and {{ ... }} / {% ... %} (jinja) leftovers.
_LEFTOVER = re.compile(r"\$\{[^}\n]*\}|\{\{.*?\}\}|\{%.*?%\}")
_TEXT_SUFFIXES = {".pbtxt", ".py", ".json", ".yaml", ".yml", ".txt", ".j2", ".cfg"}


MAX_CONFIG_BYTES = 4 << 20  # a rendered config.pbtxt or router.json is a few KiB
ROUTER_FILE = "router.json"  # beside the router's code, which reads it at load
ROUTER_READER = "bls/router_config.py"  # the router's code: a model directory holding it routes


def parse_config(path: Path) -> model_config_pb2.ModelConfig:
    """config.pbtxt as a ModelConfig; textfile.NotText when it is not a UTF-8 file."""
    text = textfile.read_text(path, MAX_CONFIG_BYTES)
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def validate_repository(repo: Path) -> list[str]:
    """All problems found, as 'model/file: reason' lines; empty when the repository is good."""
    repo = Path(repo)
    if not repo.is_dir():
        return [f"{repo}: not a directory"]
    problems: list[str] = []
    model_dirs = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not model_dirs:
        problems.append(f"{repo}: no model directories")
    for model_dir in model_dirs:
        problems.extend(validate_model(model_dir))
    problems.extend(_leftovers(repo))
    return problems


def validate_model(model_dir: Path) -> list[str]:
    name = model_dir.name
    config_path = model_dir / "config.pbtxt"
    if not config_path.is_file():
        return [f"{name}: missing config.pbtxt"]
    try:
        config = parse_config(config_path)
    except text_format.ParseError as e:
        return [f"{name}/config.pbtxt: not a valid ModelConfig: {e}"]
    except textfile.NotText as e:
        return [f"{name}/config.pbtxt: {e}"]
    problems = []
    where = f"{name}/config.pbtxt"
    if config.name != name:
        problems.append(f"{where}: name {config.name!r} does not match directory {name!r}")
    is_ensemble = config.platform == "ensemble"
    if not config.backend and not config.platform:
        problems.append(f"{where}: neither backend nor platform is set")
    if not config.input:
        problems.append(f"{where}: declares no inputs (auto-complete is disabled)")
    if not config.output:
        problems.append(f"{where}: declares no outputs (auto-complete is disabled)")
    for tensor in list(config.input) + list(config.output):
        if not tensor.dims and not config.max_batch_size:
            problems.append(f"{where}: tensor {tensor.name!r} has no dims")
        if tensor.data_type == model_config_pb2.TYPE_INVALID:
            problems.append(f"{where}: tensor {tensor.name!r} has no data_type")
    streams = any(t.name == "stream" for t in config.input)
    if streams and not config.model_transaction_policy.decoupled and not is_ensemble:
        problems.append(
            f"{where}: has a 'stream' input but is not decoupled "
            "(model_transaction_policy {{ decoupled: true }})"
        )
    if config.backend == "python":
        versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        if not versions:
            problems.append(f"{name}: no version directory (e.g. {name}/1/)")
        for version in versions:
            if not (version / "model.py").is_file():
                problems.append(f"{name}/{version.name}: missing model.py")
            elif _is_router(version):
                problems.extend(_check_router(version, model_dir.parent))
    if is_ensemble:
        problems.extend(_check_ensemble(where, config))
    return problems


def _is_router(version: Path) -> bool:
    """The version directory holds a router.json, or the router's code that reads one
    (so a deleted router.json is reported too)."""
    return os.path.lexists(version / ROUTER_FILE) or os.path.lexists(version / ROUTER_READER)


def _check_router(version: Path, repo: Path) -> list[str]:
    """router.json parses, is what the router's reader accepts, and names as backends
    only models of this repository."""
    where = f"{version.parent.name}/{version.name}/{ROUTER_FILE}"
    try:
        config = json.loads(textfile.read_text(version / ROUTER_FILE, MAX_CONFIG_BYTES))
    except FileNotFoundError:
        return [f"{where}: missing (the router's model.py reads it at load)"]
    except OSError as e:
        return [f"{where}: {e.strerror or e}"]
    except textfile.NotText as e:
        return [f"{where}: {e}"]
    except json.JSONDecodeError as e:
        return [f"{where}: not JSON: line {e.lineno}, column {e.colno}: {e.msg}"]
    except RecursionError:
        return [f"{where}: not JSON the router can load: nested too deep"]
    try:
        typed = RouterConfig.from_dict(config)
    except RouterConfigError as e:
        return [f"{where}: {e.detail}"]
    called = set(typed.backends)
    for entry in typed.backends.values():  # a backend with replicas is called through them
        called.update(entry.replicas)
    return [
        f"{where}: backend {b!r} is not a model of this repository"
        for b in sorted(called)
        if not (repo / b / "config.pbtxt").is_file()
    ]


def _check_ensemble(where: str, config: model_config_pb2.ModelConfig) -> list[str]:
    """Every ensemble input/output must be produced or consumed by some step."""
    produced = {t.name for t in config.input}
    consumed = set()
    for step in config.ensemble_scheduling.step:
        produced.update(step.output_map.values())
        consumed.update(step.input_map.values())
    problems = [
        f"{where}: ensemble tensor {t!r} is consumed but never produced"
        for t in sorted(consumed - produced)
    ]
    problems += [
        f"{where}: ensemble output {t.name!r} is never produced"
        for t in config.output
        if t.name not in produced
    ]
    return problems


def _leftovers(repo: Path) -> list[str]:
    """One problem per file that still holds a template placeholder (first one shown)."""
    problems = []
    for path in sorted(repo.rglob("*")):
        if not path.is_file() or path.suffix not in _TEXT_SUFFIXES:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = _LEFTOVER.search(line)
            if match:
                problems.append(
                    f"{path.relative_to(repo)}:{number}: unfilled placeholder {match.group(0)!r}"
                )
                break
    return problems
