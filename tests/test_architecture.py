"""The shape of the code: the import graph between the project's modules has no cycle,
shipped code imports neither the tests nor their support package, every third-party
package it imports is declared in setup.cfg (or is one of the engines' own, listed
below), and no module grows past a size a reader can hold (a backstop for the rule that
a module has one responsibility, not a budget to fill).

Every module has one name, the dotted name of its path from the repository root, in
the builder, the tests and inside a stub alike (a rendered model folder holds its
packages under the same names: builder/render/context.py python_model). So this scan
sees every module and what it imports, the router's and the engine models' too, and no
shipped module is loaded by its file path. Function-level imports count too: a cycle
hidden inside a function is still a cycle.
"""

from __future__ import annotations

import ast
import configparser
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# A backstop, not a target. The rule is one responsibility per module (what changes
# together stays together); length only shows that a module may have grown a second
# job. Generous on purpose: ruff format's layout adds lines to the same code, and a cap
# near the typical size makes files end just under it, split by size, not by job.
MAX_LINES = 600
# What the wheel installs (setup.cfg's packages) and what it must never reach into.
SHIPPED = (
    "builder",
    "engine_cache",
    "bls",
    "trident_common",
    "python_backends",
    "model_repository_templates",
)
# The packages of importable modules (model_repository_templates holds templates only).
PACKAGES = ("builder", "engine_cache", "bls", "trident_common", "python_backends")
NEVER_SHIPPED = ("tests", "support")
# Imported by shipped code but declared by no extra of trident's: each runs only inside
# an engine's own environment, which brings it (NVIDIA's Triton containers, or the cpu
# profile's requirements.lock). Declaring them would let pip replace a container's CUDA
# builds (tests/packaging/test_install.py keeps them out of the container profile).
ENGINE_ENVIRONMENT = {
    # Not on any index: Triton's Python backend stub provides it to the models it runs.
    "triton_python_backend_utils": "every Python model (bls/, python_backends/)",
    "vllm": "python_backends/vllm, run by a stub where vLLM is installed",
    "sglang": "python_backends/sglang, run by a stub where SGLang is installed",
    # The TRT-LLM pre/postprocessing models' tokenizer (TensorRT-LLM's container has it),
    # and `trident assets`, which builds the embedded default's weights (cpu profile).
    "transformers": "python_backends/tensorrt_llm/common, builder/engines/assets.py",
    "torch": "builder/engines/assets.py (`trident assets`, cpu profile)",
    # The engines' grammar backend (SGLang's default, one of vLLM's): trident_common's
    # schema pre-check uses it where the engine brought it, and skips without it.
    "xgrammar": "trident_common/structured.py, optional",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that `name` (a dotted import) refers to."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `module` imports (with the packages whose __init__ runs first)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            inside = (module + ".").startswith(node.module + ".")
            if not inside or any(name not in modules for name in names):
                names.append(node.module)  # its __init__ runs (or provides the names)
        for name in names:
            target = _resolve(name, modules)
            if target is None or target == module:
                continue
            targets.add(target)
            parts = target.split(".")
            for end in range(1, len(parts)):  # parent packages initialise first...
                parent = ".".join(parts[:end])
                if parent in modules and not (module + ".").startswith(parent + "."):
                    targets.add(parent)  # ...unless we are already inside them
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_project_has_no_import_cycle():
    graph = import_graph()
    assert "builder.errors" in graph and "trident_common.request" in graph
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def test_the_scan_sees_the_router_and_the_engine_models_and_what_they_import():
    graph = import_graph()
    assert {"bls.relay", "bls.tenants", "trident_common.interface"} <= graph["bls.model"]
    assert "python_backends.vllm.stats" in graph["python_backends.vllm.model"]
    assert "trident_common.engine_model" in graph["python_backends.sglang.model"]
    tokenizing = "python_backends.tensorrt_llm.common.tokenizing"
    assert tokenizing in graph["python_backends.tensorrt_llm.postprocessing.model"]


def test_no_shipped_module_is_loaded_by_its_file_path():
    """Each module is imported by its dotted name: no importlib by path, no sys.path
    edits (the rendered model.py alone puts its own folder first: it is a template,
    python_model.py.j2, and what Triton itself loads by path)."""
    by_path = {
        str(path.relative_to(ROOT))
        for path in _shipped_sources()
        if any(
            word in path.read_text()
            for word in ("spec_from_file_location", "sys.path.insert", "sys.path.append")
        )
    }
    assert not by_path


def test_engine_cache_stands_alone():
    graph = import_graph()
    leaks = {
        module: sorted(t for t in targets if t.startswith("builder"))
        for module, targets in graph.items()
        if module.startswith("engine_cache")
    }
    assert not {m: t for m, t in leaks.items() if t}


def test_no_module_is_too_long():
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, (
        f"these modules passed {MAX_LINES} lines: {long}. Length is only the symptom of "
        "a module holding more than one responsibility: find the jobs in it and give each "
        "its own module (what changes together stays together), named for what it does. "
        "Do not split by size (part1/part2, helpers), raise the cap, or squeeze lines "
        "to fit under it"
    )


def _shipped_sources() -> list[Path]:
    return sorted(path for folder in SHIPPED for path in (ROOT / folder).rglob("*.py"))


# Top-level names an import resolves inside the project: its packages (the same in every
# file: no module is imported by a bare name found beside it).
LOCAL_NAMES = frozenset({*PACKAGES, *NEVER_SHIPPED})


def imported_tops(path: Path) -> set[str]:
    """The top-level name of every absolute import in a file (function level too)."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def third_party_imports(paths: list[Path]) -> dict[str, list[str]]:
    """Import name → the files importing it, for what is neither stdlib nor the project."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for top in imported_tops(path) - set(sys.stdlib_module_names) - LOCAL_NAMES:
            found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def declared_distributions(setup_cfg: Path) -> set[str]:
    """Canonical names of install_requires and of every extra in a setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    blocks = [cfg["options"]["install_requires"], *cfg["options.extras_require"].values()]
    return {
        canonicalize_name(Requirement(line).name)
        for block in blocks
        for raw in block.splitlines()
        if (line := raw.split("#")[0].strip())
    }


def undeclared(
    imports: dict[str, list[str]], declared: set[str], providers: dict[str, list[str]]
) -> dict[str, str]:
    """Import name → why it is not covered: no declared distribution provides it (a
    namespace such as `google` counts when any of its providers is declared)."""
    problems = {}
    for name, files in sorted(imports.items()):
        if name in ENGINE_ENVIRONMENT:
            continue
        dists = {canonicalize_name(d) for d in providers.get(name, ())}
        if not dists:
            problems[name] = (
                f"imported by {files[0]}, provided by no installed "
                "distribution: install it here and declare it in setup.cfg, "
                "or list it in ENGINE_ENVIRONMENT with the reason"
            )
        elif not dists & declared:
            problems[name] = (
                f"imported by {files[0]}: declare {' or '.join(sorted(dists))} "
                "in setup.cfg (install_requires, or the extra of the profile "
                "that runs it)"
            )
    return problems


def test_shipped_code_imports_neither_tests_nor_support():
    leaks = {
        str(path.relative_to(ROOT)): sorted(imported_tops(path) & set(NEVER_SHIPPED))
        for path in _shipped_sources()
    }
    assert not {p: t for p, t in leaks.items() if t}, "shipped code reaches the tests"


def test_the_scan_sees_a_leak_and_an_undeclared_import(tmp_path):
    """The two checks above and below on a made-up file: they must be able to fail."""
    module = tmp_path / "m.py"
    module.write_text(
        "import os\nfrom tests.helpers import x\n"
        "def f():\n    from support.redis_server import y\n    import fastapi\n"
    )
    assert imported_tops(module) == {"os", "tests", "support", "fastapi"}
    imports = {"fastapi": ["m.py"], "google": ["v.py"], "vllm": ["e.py"], "zzz": ["z.py"]}
    providers = {"fastapi": ["fastapi"], "google": ["protobuf", "googleapis-common-protos"]}
    problems = undeclared(imports, {"protobuf"}, providers)
    assert sorted(problems) == ["fastapi", "zzz"] and "declare fastapi" in problems["fastapi"]


def test_every_third_party_import_is_declared():
    imports = third_party_imports(_shipped_sources())
    assert {"click", "yaml", "fastapi", "vllm"} <= set(imports)  # the scan sees them
    stale = sorted(set(ENGINE_ENVIRONMENT) - set(imports))
    assert not stale, f"ENGINE_ENVIRONMENT lists what nothing imports any more: {stale}"
    problems = undeclared(
        imports, declared_distributions(ROOT / "setup.cfg"), metadata.packages_distributions()
    )
    assert not problems, "\n".join(f"{name}: {why}" for name, why in problems.items())


@pytest.mark.parametrize("extra", ["openai", "s3"])
def test_the_container_profile_holds_the_openai_and_s3_extras(extra):
    """`pip install .[container]` must run every `trident` command the container uses."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")

    def lines(name: str) -> set[str]:
        return {
            raw.split("#")[0].strip() for raw in cfg["options.extras_require"][name].splitlines()
        } - {""}

    assert lines(extra) <= lines("container"), lines(extra) - lines("container")
