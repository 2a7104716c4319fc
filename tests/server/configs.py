"""The server tests' configurations, each defined once: what makes one shared server
differ from another (its spec, the edits to its rendered repository, the models it
loads). tests/server/conftest.py gives each a session fixture of the same name and
orders the tests by them; tests/README.md says when to add one.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from support import sglang_double
from support.lora import write_adapter
from support.pacing import Rate
from tests.helpers.pool import ServerConfig, check_distinct

ROOT = Path(__file__).resolve().parents[2]


def _spec_file(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def default_spec(folder: Path) -> dict:
    """The embedded default, with tenants: their limits and prefix-cache salts are the
    router's, so the default's own tests (no tenant, or one not listed) see no change."""
    spec = _spec_file(ROOT / "deploy" / "default.yaml")
    spec["tenants"] = {
        "limits": {
            "limited": {"requests_per_minute": 2},  # test_vllm_clients: the 429
            "bob": {},
            "erin": {},  # test_tenant_cache: erin and bob are isolated
            "carol": {},
            "dave": {},  # carol and dave share their prefix cache
        },
        "share_prefix_cache": ["carol", "dave"],
    }
    return spec


def _health_check(model: str):
    def edit(repo: Path) -> None:
        with open(repo / model / "config.pbtxt", "a") as config:
            config.write(
                'parameters: { key: "ENABLE_VLLM_HEALTH_CHECK" value: { string_value: "true" } }\n'
            )

    return edit


def _adapters(folder: Path) -> None:
    # The three greedy answers to test_lora's prompt must differ. Scale 1.0 (the delta
    # grows with its square): at 0.75, paris gave the base answer in the full run of
    # 2026-12-03 (it had differed alone); seed 1 at 0.5 did on 2026-12-01.
    write_adapter(folder / "adapters" / "paris", seed=4, scale=1.0)
    write_adapter(folder / "adapters" / "france", seed=2, scale=1.0)


def fallback_spec(folder: Path) -> dict:
    """deploy/examples/cpu-fallback.yaml, with two random PEFT adapters on `primary`
    (test_lora: `backup`, tiny-llama, holds none, so the router must pick a holder)."""
    spec = _spec_file(ROOT / "deploy" / "examples" / "cpu-fallback.yaml")
    primary = next(model for model in spec["models"] if model["name"] == "primary")
    primary["adapters"] = {name: str(folder / "adapters" / name) for name in ("paris", "france")}
    primary["lora"] = {"max_loras": 2, "max_lora_rank": 8}
    return spec


def _shim(text: str, model: str = "qwen"):
    """An edit writing `text` as the model's `sglang` module (the stub imports it from the
    model's version folder): what makes trident's SGLang model run on a double."""

    def edit(repo: Path) -> None:
        (repo / model / "1" / "sglang.py").write_text(text)

    return edit


DEFAULT = ServerConfig("default_server", default_spec, real_vllm=True)
# deploy/examples/cpu-fallback.yaml: SmolLM2 as `primary`, with the LoRA tests' two
# adapters, and tiny-llama as `backup`, both on real vLLM, behind `router`. backup has
# vllm_backend's health check (test_vllm_metrics kills its engine last, and it unloads
# itself). The adapters ride on this server rather than a third real-vLLM one: one
# engine load and one tritonserver start fewer per run (tests/helpers/ledger.py).
FALLBACK = ServerConfig(
    "fallback_server",
    fallback_spec,
    before=(("adapters paris (seed 4, 1.0) and france (seed 2, 1.0)", _adapters),),
    prepare=(("ENABLE_VLLM_HEALTH_CHECK on backup", _health_check("backup")),),
    real_vllm=True,
)


# -- SGLang doubles: trident's real SGLang model, its engine the double ----------------------


def sglang_deployment() -> dict:
    """One SGLang model, `qwen`, behind `router` (the OpenAI conformance cases' double)."""
    return {
        "name": "conformance",
        "hardware": {"gpu": "cpu", "count": 1},
        "models": [
            {
                "name": "qwen",
                "engine": "sglang",
                "model": "/models/test-double",
                "family": "qwen",
                "tasks": ["chat"],
                "placement": {"devices": [0]},
                # Four at a time: more wait in SGLang's queue (its load gauges show it).
                # The router then admits 8 in flight (2 x the engine's concurrency), the
                # structured-output test's eight at a time.
                "engine_args": {
                    "tp_size": 1,
                    "context_length": 4096,
                    "mem_fraction_static": 0.4,
                    "max_running_requests": 4,
                },
            }
        ],
        "router": {"default": ["qwen"]},
    }


def _tools_deployment(folder: Path) -> dict:
    spec = sglang_deployment()
    spec["models"][0]["engine_args"]["tool_call_parser"] = "qwen25"
    return spec


# The stub imports `sglang` from the model's version folder: these make it the double.
CONFORMANCE_SHIM = (
    f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
    "from support import fake_sglang\nEngine = fake_sglang.Engine\n"
)
# The tools double's answer to every unconstrained request: a call in Qwen 2.5's format.
AUTO_REPLY = (
    'Let me check . <tool_call> {"name": "get_weather", "arguments": '
    '{"city": "Paris", "unit": "celsius"}} </tool_call>'
)
TOOLS_SHIM = (
    f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
    "from support import fake_sglang, fake_sglang_tools\n"
    "fake_sglang_tools.install()\n"
    f"fake_sglang.REPLY = {AUTO_REPLY!r}\n"
    "Engine = fake_sglang.Engine\n"
)
SGLANG = ServerConfig(
    "sglang_server",
    lambda folder: sglang_deployment(),
    prepare=(("the plain SGLang double for qwen", _shim(CONFORMANCE_SHIM)),),
    timeout_s=90,
)
SGLANG_TOOLS = ServerConfig(
    "sglang_tools_server",
    _tools_deployment,
    prepare=(("the tool-calling SGLang double for qwen", _shim(TOOLS_SHIM)),),
    timeout_s=90,
)


def _check_double_and_relays(repo: Path) -> None:
    from support import bls_floor

    _shim(sglang_double.SHIM, sglang_double.MODEL)(repo)
    bls_floor.install(repo, sglang_double.MODEL)  # the benchmarks' bare BLS relays in front of qwen


def _check_deployment(folder: Path) -> dict:
    spec = sglang_double.deployment("/models/test-double", "cpu")
    # test_router_trust's tenants: the router sets their cache salt and priority.
    spec["tenants"] = {"limits": {"alice": {"tier": "premium"}, "bob": {"tier": "batch"}}}
    return spec


# The SGLang GPU check's deployment (support/sglang_double.py) on the slower, longer
# double, with tenants, and the benchmarks' bare BLS relays beside the router. The
# router-trust, reload, BLS-floor and refused-request tests share it.
SGLANG_CHECK = ServerConfig(
    "sglang_check_server",
    _check_deployment,
    prepare=(
        ("the GPU check's SGLang double for qwen, and the BLS relays", _check_double_and_relays),
    ),
    timeout_s=90,
)


# -- trident's vLLM model on the paced AsyncLLM double (support/vllm_double.py) ------------

VLLM_DOUBLE_MODEL = "smollm2"
VLLM_DOUBLE_PACE = Rate(ttft_s=0.2, tokens_per_s=50)


def double_rate_file(server) -> Path:
    """The file the double reads its pace from (support.vllm_double.write_rate)."""
    return Path(server.repository).parent / "rate.json"


def _vllm_double(repo: Path) -> None:
    from support.vllm_double import make_environment, use_double

    folder = repo.parent
    use_double(
        repo,
        VLLM_DOUBLE_MODEL,
        make_environment(folder / "env"),
        folder / "rate.json",
        VLLM_DOUBLE_PACE,
    )


# deploy/default.yaml with its vLLM model's engine the double: what bench/gpu_rate.py
# stands on, and where the vLLM model's reloads are tried without vLLM's ~45 s start.
VLLM_DOUBLE = ServerConfig(
    "vllm_double_server",
    lambda folder: _spec_file(ROOT / "deploy" / "default.yaml"),
    prepare=(("the paced AsyncLLM double for smollm2 (0.2 s, 50 tokens/s)", _vllm_double),),
    timeout_s=60,
)
CONFIGS = [DEFAULT, FALLBACK, SGLANG, SGLANG_TOOLS, SGLANG_CHECK, VLLM_DOUBLE]
check_distinct(CONFIGS)
