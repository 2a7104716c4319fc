"""The pipeline of `trident repo`, the one module that crosses stages:

    load (builder.spec) → plan (builder.plan) → engines (builder.engines)
        → render (builder.render.repository) → validate + write (builder.render)

Each stage only knows the ones before it through the objects it is handed: the renderer
takes the plan and never plans, the planner never renders.
"""

from __future__ import annotations

from pathlib import Path

from builder.engines import assets
from builder.engines import jobs as engines
from builder.plan.model import Plan
from builder.plan.planner import plan_for_spec
from builder.render import output_dir
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import validate_repository
from builder.render.write import write_repository
from builder.spec import DeploymentSpec, load_spec
from builder.spec.adapters import check_files as check_adapters


def resolve_models(spec: DeploymentSpec) -> dict[str, str]:
    """Model name → what its engine loads (builtin weights are built once, locally)."""
    return {m.name: assets.resolve(m.model) for m in spec.models if m.model}


def resolve_engines(spec: DeploymentSpec) -> dict[str, engines.ServedEngine]:
    """TRT-LLM model name → its local engine directory and key, from the engine cache."""
    trtllm = [m for m in spec.models if m.engine == "tensorrt_llm"]
    return engines.engines_for_repository(spec, trtllm) if trtllm else {}


def render(spec: DeploymentSpec, plan: Plan) -> dict[str, bytes]:
    """Every file of the repository (resolves models and engines on the way)."""
    models = resolve_models(spec)
    check_adapters(spec, models)  # the LoRA folders, before any engine is fetched
    return render_files(RenderContext(spec, models, resolve_engines(spec), plan))


def build_repository(spec: DeploymentSpec, out: Path) -> int:
    """Render spec into out (replacing it atomically); returns the number of files."""
    output_dir.check_target(out, [spec.file])  # before any slow work: a bad --out is cheap
    plan = plan_for_spec(spec)  # before the engines: a placement error costs no build
    files = render(spec, plan)
    write_repository(files, out, validate_repository, spec_file=spec.file)
    return len(files)


def repo_from_file(spec_file: str | Path, out: Path) -> tuple[DeploymentSpec, int]:
    """`trident repo`: load the spec, then build_repository; (spec, files written)."""
    spec = load_spec(spec_file)
    return spec, build_repository(spec, out)
