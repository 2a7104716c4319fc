"""The OpenAI SDK's client matrix: which engine runs which client mode of a case.

What a client mode changes (sync or async SDK, a streamed answer or a whole one) is the
frontend's work, and the SGLang double answers in milliseconds, so every mode of every
case runs there. Real vLLM (SmolLM2, the session's default_server) keeps one mode per
case, streamed through the async SDK, so every field is still proven on a real engine;
each of its cases costs seconds of generation on this CPU.
"""

from __future__ import annotations

import pytest

MODES = [("sync", False), ("sync", True), ("async", False), ("async", True)]
REAL_MODE = ("async", True)  # the one client mode real vLLM runs of each case
REAL_SERVER = "default_server"


def _param(engine: str, server: str, *values):
    mode = "-".join("stream" if v is True else "whole" if v is False else str(v) for v in values)
    return pytest.param(
        engine, *values, marks=pytest.mark.uses_server(server), id=f"{engine}-{mode}"
    )


def engine_modes(double_server: str) -> list:
    """(engine, mode, stream): every mode on the double, REAL_MODE on real vLLM."""
    return [_param("sglang", double_server, *mode) for mode in MODES] + [
        _param("vllm", REAL_SERVER, *REAL_MODE)
    ]


def engine_streams(double_server: str) -> list:
    """(engine, stream): streamed and whole on the double, streamed on real vLLM."""
    return [_param("sglang", double_server, s) for s in (False, True)] + [
        _param("vllm", REAL_SERVER, True)
    ]


def real_modes() -> list:
    """(engine, mode, stream) for a case only a real model can answer (a seed)."""
    return [_param("vllm", REAL_SERVER, *REAL_MODE)]
