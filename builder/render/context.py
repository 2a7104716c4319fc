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
from builder import runtime_modules
from builder.errors import TridentError
from builder.plan.model import Plan
from builder.render import escape
from builder.spec import DeploymentSpec

# The templates and backend sources lie beside the packages in both layouts: at the
# repository root in the source tree, and in site-packages (or a --target folder) when
# installed, where setup.cfg ships them as top-level folders of the wheel.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TEMPLATES_DIR = PROJECT_ROOT / "model_repository_templates"
BACKENDS_DIR = PROJECT_ROOT / "python_backends"
BLS_DIR = PROJECT_ROOT / "bls"
COMMON_PACKAGE = "trident_common"
VERSION = "1"

INTERFACE_FILE = BACKENDS_DIR / COMMON_PACKAGE / "interface.py"


class RenderError(TridentError):
    """A repository could not be rendered (template error, failed validation)."""


@dataclass(frozen=True)
class RenderContext:
    spec: DeploymentSpec
    resolved_models: Mapping[str, str]  # model name → local path or id for the engine
    engines: Mapping[str, Any]  # TRT-LLM model name → engines.jobs.ServedEngine
    plan: Plan  # where each model runs (the renderer never plans)


def load_interface(path: Path = INTERFACE_FILE) -> ModuleType:
    """trident's tensor interface (trident_common/interface.py), for the templates
    (builder.runtime_modules says why from its file)."""
    return runtime_modules.load_file("trident_interface", path)


INTERFACE = load_interface()


@functools.cache  # one environment per (templates, interface): each template compiles once
def _environment(templates: Path, interface) -> jinja2.Environment:
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
        template = _environment(TEMPLATES_DIR, INTERFACE).get_template(name)
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
