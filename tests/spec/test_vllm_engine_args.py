"""builder/spec/engine_args.py's vLLM table against the installed vLLM: every name the
spec passes through verbatim is a field of vLLM's AsyncEngineArgs, so a spec that renders
also loads (a name vLLM has dropped would fail only at load, inside Triton)."""

from __future__ import annotations

import dataclasses

from builder.spec.engine_args import VLLM_ARGS

# trident's vLLM model takes this one out before it builds AsyncEngineArgs.
NOT_ENGINE_ARGS = {"tool_call_parser"}


def test_every_vllm_argument_is_an_async_engine_args_field():
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    assert set(VLLM_ARGS) - NOT_ENGINE_ARGS <= fields
