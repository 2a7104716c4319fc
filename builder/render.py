"""Spec → Triton model repository.

`render_files` is pure: (spec, resolved model paths) → {relative path: bytes}. Writing is
separate: `write_repository` puts the files into a temporary sibling directory, validates
them, and only then swaps the directory into place, so a failed render never leaves a
half-written repository behind.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import jinja2

from builder import escape, output_dir
from builder import placement as placement_mod
from builder.errors import TridentError, printable
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
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,   # each value is escaped for its own format (builder.escape)
    )
    env.filters.update(escape.FILTERS)
    return env


def render_template(name: str, **values: Any) -> bytes:
    try:
        return _environment().get_template(name).render(**values).encode()
    except (jinja2.TemplateError, escape.EscapeError) as e:
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
                     validate: Callable[[Path], list[str]],
                     spec_file: str | None = None) -> None:
    """Write into a temp dir beside out_dir, validate, then swap it in.

    out_dir must pass output_dir.check_target (absent, empty, or written by trident; not
    the spec nor a folder holding it). The swap is two renames on one filesystem: the old
    repository (if any) moves aside, the new one moves in, the old one is removed; signals
    wait until both renames are done. A failure before that leaves out_dir as it was (or
    absent), removes the temp dir and any parent folders this call created.
    """
    protect = [spec_file] if spec_file else []
    out_dir = output_dir.check_target(Path(out_dir), protect)
    output_dir.clean_stale(out_dir)
    files = {**files, output_dir.MARKER: output_dir.marker_text(spec_file or "")}
    created: list[Path] = []
    tmp = None
    try:
        created = output_dir.make_parents(out_dir)
        tmp = Path(tempfile.mkdtemp(prefix=output_dir.temp_prefix(out_dir, "rendering"),
                                    dir=out_dir.parent))
        _write_files(tmp, files)
        problems = validate(tmp)
        if problems:
            raise RenderError("rendered repository is invalid:\n  " + "\n  ".join(problems))
        _swap(tmp, out_dir)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        output_dir.remove_created(created)
        if isinstance(e, OSError):
            raise RenderError(f"{printable(out_dir)}: cannot write the repository: "
                              f"{e.strerror or e}") from None
        raise


def _write_files(root: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _swap(new: Path, out_dir: Path) -> None:
    """new replaces out_dir; SIGINT/SIGTERM are held back between the two renames, so an
    interrupted swap never leaves out_dir missing."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    old = None
    try:
        if out_dir.exists():
            old = out_dir.parent / (output_dir.temp_prefix(out_dir, "old") + "swap")
            os.rename(out_dir, old)
        os.rename(new, out_dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
