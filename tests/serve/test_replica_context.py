"""The OpenAI frontend's context length of the router, and of a model rendered as
replicas (builder/render/replicas.py), from the rendered repository: the replicas'
model.json, since `<model>` is the router's code and has none."""

from __future__ import annotations

from builder.plan.planner import plan_for_spec
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.render.validate import validate_repository
from builder.render.write import write_repository
from builder.serve.openai.repository import context_tokens
from builder.spec import parse_spec


def test_context_of_a_model_with_replicas_and_of_its_router(tmp_path):
    spec = parse_spec(
        {
            "name": "x",
            "models": [
                {
                    "name": "chat",
                    "engine": "vllm",
                    "model": "/m",
                    "instances": 2,
                    "engine_args": {"max_model_len": 2048},
                },
                {
                    "name": "one",
                    "engine": "sglang",
                    "model": "/n",
                    "engine_args": {"context_length": 1024},
                },
            ],
            "router": {"default": ["chat"]},
        },
        "test.yaml",
    )
    repo = tmp_path / "repo"
    write_repository(
        render_files(RenderContext(spec, {}, {}, plan_for_spec(spec))), repo, validate_repository
    )
    assert context_tokens(repo) == {
        "chat__r0": 2048,
        "chat__r1": 2048,
        "chat": 2048,
        "one": 1024,
        "router": 2048,
    }
