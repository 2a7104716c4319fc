"""The vLLM model's settings on a CPU instance (python_backends/vllm/model.py's
cpu_engine_defaults): trident's 1 GiB KV cache only where neither the spec's
`kv_cache_memory_bytes` nor the operator's VLLM_CPU_KVCACHE_SPACE sizes it, and the spec's
size kept even where the stub inherited the variable (vLLM lets the variable win)."""

from __future__ import annotations

from tests.python_backends.test_vllm_structured_defaults import module  # noqa: F401 (fixture)

SPACE = "VLLM_CPU_KVCACHE_SPACE"


def test_nothing_sized_gets_one_gib_and_eager(module):  # noqa: F811
    config, environ = {}, {}
    module.cpu_engine_defaults(config, environ)
    assert environ[SPACE] == "1"
    assert environ["VLLM_CACHE_ROOT"]
    assert config == {"enforce_eager": True}


def test_the_operators_size_is_kept(module):  # noqa: F811
    environ = {SPACE: "4", "VLLM_CACHE_ROOT": "/cache"}
    module.cpu_engine_defaults({}, environ)
    assert environ == {SPACE: "4", "VLLM_CACHE_ROOT": "/cache"}


def test_the_specs_size_wins_over_an_inherited_variable(module):  # noqa: F811
    config = {"kv_cache_memory_bytes": 276_480_000, "enforce_eager": False}
    environ = {SPACE: "1", "VLLM_CACHE_ROOT": "/cache"}
    module.cpu_engine_defaults(config, environ)
    assert SPACE not in environ
    assert config == {"kv_cache_memory_bytes": 276_480_000, "enforce_eager": False}
