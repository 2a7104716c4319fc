"""Spec → Triton model repository.

`render_files` is pure: (spec, resolved model paths) → {relative path: bytes}. Writing is
separate: `write_repository` puts the files into a temporary sibling directory, validates
them, and only then swaps the directory into place, so a failed render never leaves a
half-written repository behind.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import jinja2

from builder import placement as placement_mod
from builder.errors import TridentError
from builder.spec import DeploymentSpec, ModelSpec, thaw

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PROJECT_ROOT / "model_repository_templates"
BACKENDS_DIR = PROJECT_ROOT / "python_backends"
BLS_DIR = PROJECT_ROOT / "bls"
COMMON_PACKAGE = "trident_common"
VERSION = "1"

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "tensorrt_llm": "TensorRT-LLM"}


class RenderError(TridentError):
    """A repository could not be rendered (template error, failed validation)."""


@dataclass(frozen=True)
class RenderContext:
    spec: DeploymentSpec
    resolved_models: Mapping[str, str]      # model name → local path or id for the engine
    engines: Mapping[str, str]              # TRT-LLM model name → engine directory
    plan: Any = None                        # builder.planner.Plan; planned from spec if None


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(name: str, **values: Any) -> bytes:
    try:
        return _environment().get_template(name).render(**values).encode()
    except jinja2.TemplateError as e:
        raise RenderError(f"template {name}: {e}") from e


def copy_tree(source: Path, target: str) -> dict[str, bytes]:
    """Python sources of a backend directory, keyed by their path in the repository."""
    files = {}
    for path in sorted(source.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files[f"{target}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    return files


def _common_package(model_dir: str) -> dict[str, bytes]:
    return copy_tree(BACKENDS_DIR / COMMON_PACKAGE, f"{model_dir}/{VERSION}/{COMMON_PACKAGE}")


def _render_python_llm(ctx: RenderContext, model: ModelSpec) -> dict[str, bytes]:
    """vLLM and SGLang: a decoupled Python-backend model running the engine in its stub."""
    groups = placement_mod.instance_groups(model, ctx.plan)
    engine_args = {**thaw(model.engine_args),
                   **placement_mod.parallel_engine_args(model, ctx.plan),
                   **_model_path_arg(model, ctx)}
    view = {"name": model.name, "instance_groups": groups,
            "parameters": placement_mod.instance_parameters(model, ctx.plan)}
    files = {
        f"{model.name}/config.pbtxt": render_template(
            "python_llm/config.pbtxt.j2", model=view, spec_file=ctx.spec.file,
            engine_title=ENGINE_TITLES[model.engine]),
        f"{model.name}/{VERSION}/model.json": render_template(
            "python_llm/model.json.j2", engine_args=engine_args),
    }
    files.update(copy_tree(BACKENDS_DIR / model.engine, f"{model.name}/{VERSION}"))
    files.update(_common_package(model.name))
    return files


def _model_path_arg(model: ModelSpec, ctx: RenderContext) -> dict[str, str]:
    path = ctx.resolved_models.get(model.name, model.model)
    return {"model_path" if model.engine == "sglang" else "model": path}


def _render_router(ctx: RenderContext) -> dict[str, bytes]:
    from bls.policy import router_config  # the router owns the shape of its own config

    router = ctx.spec.router
    files = {
        f"{router.name}/config.pbtxt": render_template(
            "router/config.pbtxt.j2", router=router, spec_file=ctx.spec.file),
        f"{router.name}/{VERSION}/router.json": render_template(
            "router/router.json.j2", router_config=router_config(ctx.spec)),
    }
    files.update(copy_tree(BLS_DIR, f"{router.name}/{VERSION}"))
    files.update(_common_package(router.name))
    return files


def _render_tensorrt_llm(ctx: RenderContext, model: ModelSpec) -> dict[str, bytes]:
    from builder import trtllm_repo  # TRT-LLM's four-model layout lives in its own module

    return trtllm_repo.render(ctx, model)


ENGINE_RENDERERS: dict[str, Callable[[RenderContext, ModelSpec], dict[str, bytes]]] = {
    "vllm": _render_python_llm,
    "sglang": _render_python_llm,
    "tensorrt_llm": _render_tensorrt_llm,
}


def render_files(ctx: RenderContext) -> dict[str, bytes]:
    """Every file of the repository, keyed by relative path. Pure and deterministic
    given ctx.plan; without one, the spec is planned first (reading its topology file)."""
    if ctx.plan is None:
        from builder.planner import plan_for_spec  # reads the topology file, if any

        ctx = replace(ctx, plan=plan_for_spec(ctx.spec))
    files: dict[str, bytes] = {}
    for model in ctx.spec.models:
        for path, data in ENGINE_RENDERERS[model.engine](ctx, model).items():
            if path in files:
                raise RenderError(f"{path} is rendered twice (model {model.name})")
            files[path] = data
    if ctx.spec.router is not None:
        for path, data in _render_router(ctx).items():
            if path in files:
                raise RenderError(f"{path} is rendered twice (router)")
            files[path] = data
    return dict(sorted(files.items()))


def write_repository(files: Mapping[str, bytes], out_dir: Path,
                     validate: Callable[[Path], list[str]]) -> None:
    """Write into a temp dir beside out_dir, validate, then swap it in.

    The swap is two renames on one filesystem: the old repository (if any) moves aside,
    the new one moves in, the old one is removed. A failure before that leaves out_dir as
    it was (or absent) and removes the temp dir.
    """
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.rendering-", dir=out_dir.parent))
    try:
        for rel, data in files.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        problems = validate(tmp)
        if problems:
            raise RenderError("rendered repository is invalid:\n  " + "\n  ".join(problems))
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
