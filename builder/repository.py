"""`trident repo`: the I/O around the pure renderer.

Plan the placement (reads the topology), resolve what the models need on disk (builtin
weights, TRT-LLM engines from the cache), render, validate, swap into place.
"""
from __future__ import annotations

from pathlib import Path

from builder import assets, output_dir
from builder.planner import plan_for_spec
from builder.render import RenderContext, render_files, write_repository
from builder.spec import DeploymentSpec
from builder.validate import validate_repository


def resolve_models(spec: DeploymentSpec) -> dict[str, str]:
    return {m.name: assets.resolve(m.model) for m in spec.models if m.model}


def resolve_engines(spec: DeploymentSpec) -> dict[str, str]:
    """TRT-LLM model name → local engine directory, fetched from the engine cache."""
    trtllm = [m for m in spec.models if m.engine == "tensorrt_llm"]
    if not trtllm:
        return {}
    from builder import engines  # the cache is only touched when TRT-LLM models exist

    return engines.engines_for_repository(spec, trtllm)


def build_repository(spec: DeploymentSpec, out: Path) -> int:
    """Render spec into out (replacing it atomically); returns the number of files."""
    output_dir.check_target(out, [spec.file])   # before any slow work: a bad --out is cheap
    plan = plan_for_spec(spec)   # first: a placement error costs no model conversion
    ctx = RenderContext(spec, resolve_models(spec), resolve_engines(spec), plan)
    files = render_files(ctx)
    write_repository(files, out, validate_repository, spec_file=spec.file)
    return len(files)
