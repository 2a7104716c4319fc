"""What every renderer shares: where templates and backend sources live, the jinja
environment with the per-format escaping filters, and the RenderContext a renderer gets
(the spec, the plan, resolved model paths and engine directories)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2

from bls.router_config import RouterConfig, RouterConfigError
from builder.errors import TridentError
from builder.plan.model import Plan
from builder.render import escape
from builder.spec import DeploymentSpec
from trident_common import interface

# The templates and backend sources lie beside the packages in both layouts: at the
# repository root in the source tree, and in site-packages (or a --target folder) when
# installed, where setup.cfg ships them as top-level folders of the wheel.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = PROJECT_ROOT / "model_repository_templates"
VERSION = "1"
# The runtime packages a Python model's stub imports, by their dotted names.
ROUTER_PACKAGES = ("bls", "trident_common")
COMMON_PACKAGE = "trident_common"


class RenderError(TridentError):
    """A repository could not be rendered (template error, failed validation)."""


@dataclass(frozen=True)
class RenderContext:
    spec: DeploymentSpec
    resolved_models: Mapping[str, str]  # model name → local path or id for the engine
    engines: Mapping[str, Any]  # TRT-LLM model name → engines.jobs.ServedEngine
    plan: Plan  # where each model runs (the renderer never plans)


@functools.cache  # one environment per (templates, interface): each template compiles once
def _environment(templates: Path, interface: ModuleType) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # each value is escaped for its own format (builder.render.escape)
    )
    env.filters.update(escape.FILTERS)
    env.globals["interface"] = interface
    return env


def render_template(name: str, **values: Any) -> bytes:
    try:
        template = _environment(TEMPLATES_DIR, interface).get_template(name)
        return template.render(**values).encode()
    except (jinja2.TemplateError, escape.EscapeError) as e:
        raise RenderError(f"template {name}: {e}") from e


def render_router_json(config: RouterConfig) -> bytes:
    """A router.json file: what RouterConfig writes, read back by the router's own reader
    (bls/router_config.py), so what the router would refuse at load fails the render."""
    written = config.to_dict()
    try:
        RouterConfig.from_dict(written)
    except RouterConfigError as e:
        raise RenderError(f"{config.name}: {e}") from None
    return render_template("router/router.json.j2", router_config=written)


def python_model(version_dir: str, module: str, packages: tuple[str, ...]) -> dict[str, bytes]:
    """A Python model's code in its version folder: `model.py`, the file Triton loads by
    its path, takes TritonPythonModel from `module`; `packages` (dotted names, `module`'s
    own among them) are copied beside it by those names, so the stub imports every
    module by the one name the builder, the tests and mypy use."""
    files = {f"{version_dir}/model.py": render_template("python_model.py.j2", module=module)}
    for package in packages:
        folder = package.replace(".", "/")
        files.update(copy_tree(PROJECT_ROOT / folder, f"{version_dir}/{folder}"))
    return files


def copy_tree(source: Path, target: str) -> dict[str, bytes]:
    """Python sources of a backend directory, keyed by their path in the repository."""
    if not source.is_dir():  # else a model would be rendered without its model.py
        raise RenderError(
            f"{source}: backend sources are missing (an install without trident's package data?)"
        )
    files = {}
    for path in sorted(source.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files[f"{target}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    return files
