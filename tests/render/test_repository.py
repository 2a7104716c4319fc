"""Rendering: deterministic, explicit, validated, and atomic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from builder.plan.planner import plan_for_spec
from builder.render import context as render_context
from builder.render.context import RenderContext, RenderError
from builder.render.repository import render_files
from builder.render.validate import parse_config, validate_repository
from builder.render.write import write_repository
from builder.spec import parse_spec

SPEC = {
    "models": [
        {
            "name": "chat",
            "engine": "vllm",
            "model": "/models/chat",
            "instances": 2,
            "engine_args": {"max_model_len": 1024, "enable_prefix_caching": True},
        },
        {
            "name": "rag",
            "engine": "vllm",
            "model": "/models/rag",
            "engine_args": {"max_model_len": 4096},
        },
    ],
    "router": {"default": ["chat", "rag"], "fallback": {"chat": ["rag"]}},
}


def files_of(repo: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*")) if p.is_file()
    }


def render_to(out: Path, data=SPEC) -> dict[str, bytes]:
    spec = parse_spec(data, "test.yaml")
    files = render_files(RenderContext(spec, {}, {}, plan_for_spec(spec)))
    write_repository(files, out, validate_repository)
    return files_of(out)


def test_render_is_byte_identical_twice(tmp_path):
    first = render_to(tmp_path / "a")
    second = render_to(tmp_path / "b")
    assert first == second
    assert render_to(tmp_path / "a") == first  # re-render in place too


def test_layout_and_explicit_interfaces(tmp_path):
    files = render_to(tmp_path / "repo")
    # chat has 2 instances behind the router: two replicas, and chat itself forwarding
    # to them with the router's code (builder/render/replicas.py).
    assert {
        "chat__r0/config.pbtxt",
        "chat__r0/1/model.py",
        "chat__r0/1/model.json",
        "chat__r0/1/trident_common/engine_model.py",
        "chat__r1/1/model.json",
        "chat/config.pbtxt",
        "chat/1/router.json",
        "chat/1/model.py",
        "rag/1/model.py",
        "router/1/model.py",
        "router/1/router.json",
        "router/1/bls/policy.py",
    } <= set(files)
    assert "chat/1/model.json" not in files
    for name in ("chat", "chat__r0", "chat__r1", "rag", "router"):
        config = parse_config(tmp_path / "repo" / name / "config.pbtxt")
        assert config.name == name and config.backend == "python"
        assert config.model_transaction_policy.decoupled
        assert {t.name for t in config.input} >= {
            "text_input",
            "messages",
            "stream",
            "sampling_parameters",
            "max_tokens",
        }
        assert {t.name for t in config.output} >= {"text_output", "finish_reason", "served_by"}
    for name in ("chat__r0", "chat__r1"):
        replica = parse_config(tmp_path / "repo" / name / "config.pbtxt")
        assert [(g.count, g.kind) for g in replica.instance_group] == [
            (1, replica.instance_group[0].KIND_CPU)
        ]
        assert b'"model": "/models/chat"' in files[f"{name}/1/model.json"]
    assert b'"max_model_len": 4096' in files["rag/1/model.json"]


def test_python_sources_are_copied_verbatim(tmp_path, root):
    files = render_to(tmp_path / "repo")
    assert files["chat__r0/1/python_backends/vllm/model.py"] == (
        (root / "python_backends/vllm/model.py").read_bytes()
    )
    assert files["chat/1/bls/model.py"] == (root / "bls/model.py").read_bytes()
    assert files["router/1/bls/breaker.py"] == (root / "bls/breaker.py").read_bytes()
    assert files["router/1/trident_common/interface.py"] == (
        (root / "trident_common/interface.py").read_bytes()
    )


def test_each_python_model_py_imports_its_model_by_the_one_dotted_name(tmp_path):
    """Triton loads model.py by its path; it is a shim naming the module the builder,
    the tests and mypy know by the same name, its own folder first on sys.path (an
    installed trident has the same package names)."""
    files = render_to(tmp_path / "repo")
    expected = {
        "router": "bls.model",
        "chat": "bls.model",  # the replicas' forwarder: the router's code
        "chat__r0": "python_backends.vllm.model",
        "rag": "python_backends.vllm.model",
    }
    for name, module in expected.items():
        shim = files[f"{name}/1/model.py"].decode()
        assert f"from {module} import TritonPythonModel" in shim
        assert "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))" in shim
        compile(shim, f"{name}/1/model.py", "exec")


def test_failed_validation_leaves_existing_repository_untouched(tmp_path):
    out = tmp_path / "repo"
    before = render_to(out)
    spec = parse_spec(SPEC, "test.yaml")
    with pytest.raises(RenderError, match="invalid"):
        write_repository(
            render_files(RenderContext(spec, {}, {}, plan_for_spec(spec))),
            out,
            lambda repo: ["chat/config.pbtxt: broken on purpose"],
        )
    assert files_of(out) == before
    assert sorted(os.listdir(tmp_path)) == ["repo"]  # no temp dirs left


def test_failed_first_render_creates_nothing(tmp_path):
    out = tmp_path / "repo"
    with pytest.raises(RenderError):
        write_repository({"m/config.pbtxt": b"name: 'm'"}, out, validate_repository)
    assert os.listdir(tmp_path) == []


def test_strict_undefined_template_variable_fails(tmp_path, monkeypatch):
    templates = tmp_path / "templates"
    (templates / "python_llm").mkdir(parents=True)
    (templates / "python_llm" / "config.pbtxt.j2").write_text('name: "{{ nonexistent }}"\n')
    monkeypatch.setattr(render_context, "TEMPLATES_DIR", templates)
    with pytest.raises(RenderError, match="nonexistent"):
        render_files(RenderContext(spec := parse_spec(SPEC, "t.yaml"), {}, {}, plan_for_spec(spec)))


def test_router_config_carries_policy(tmp_path):
    import json

    files = render_to(tmp_path / "repo")
    config = json.loads(files["router/1/router.json"])
    assert config["default"] == ["chat", "rag"]
    assert config["fallback"] == {"chat": ["rag"]}
    assert config["backends"]["rag"]["engine"] == "vllm"


def test_a_vllm_structured_outputs_config_reaches_the_engine_model(tmp_path):
    # The vLLM model keeps the spec's own structured_outputs_config and fills only what it
    # leaves unset (python_backends/vllm/model.py); the spec must be able to say it.
    own = {"backend": "guidance", "disable_any_whitespace": False}
    data = {
        "models": [
            {
                "name": "rag",
                "engine": "vllm",
                "model": "/models/rag",
                "engine_args": {"structured_outputs_config": own},
            }
        ]
    }
    files = render_to(tmp_path / "repo", data)
    assert json.loads(files["rag/1/model.json"])["structured_outputs_config"] == own
