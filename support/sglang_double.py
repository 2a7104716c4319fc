"""trident's SGLang model against the SGLang double (support/fake_sglang.py) inside a real
tritonserver. The stub imports `sglang` from the model's version folder, so a `sglang.py`
written there (the texts below) is what trident's real model code gets.

MODEL and deployment() are the SGLang GPU check's (tests/gpu/check_sglang.py): the server
tests and the benchmarks render the same repository and swap the engine."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "qwen"


def deployment(model_path: str, gpu: str) -> dict:
    return {
        "name": "sglang-gpu-check",
        "hardware": {"gpu": gpu, "count": 1},
        "models": [
            {
                "name": MODEL,
                "engine": "sglang",
                "model": model_path,
                "family": "qwen",
                "tasks": ["chat"],
                "placement": {"devices": [0]},
                "engine_args": {
                    "tp_size": 1,
                    "context_length": 4096,
                    "mem_fraction_static": 0.5,
                    "max_running_requests": 16,
                    "schedule_policy": "lpm",
                },
            }
        ],
        "router": {"default": [MODEL]},
    }


# Slower and longer than the unit-test default so a cancel lands mid-stream.
SHIM = f'''"""Test-only stand-in for sglang inside the stub (written by
support/sglang_double.py)."""
import asyncio
import sys

sys.path.insert(0, {str(ROOT)!r})
from support import fake_sglang  # noqa: E402

fake_sglang.REPLY = " ".join(f"w{{i}}" for i in range(300))
__version__ = "test-double"


class Engine(fake_sglang.Engine):
    async def _generate(self, *args):
        async for chunk in super()._generate(*args):
            await asyncio.sleep(0.005)
            yield chunk
'''


def zero_cost_shim(tokens: int) -> str:
    """A `sglang.py` whose engine makes `tokens` words at no cost (bench/zero_cost.py)."""
    return (
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from support import fake_sglang\n"
        f"fake_sglang.REPLY = ' '.join(f'w{{i}}' for i in range({tokens}))\n"
        "Engine = fake_sglang.Engine\n"
    )


def paced_shim(control: Path, tokens: int = 1024) -> str:
    """A `sglang.py` whose engine makes up to `tokens` words at the rate in the control
    file (support/pacing.py; support/vllm_double.write_rate writes it)."""
    return (
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from support import fake_sglang\nfrom support.pacing import RateSource\n"
        f"fake_sglang.REPLY = ' '.join(f'w{{i}}' for i in range({tokens}))\n"
        f"fake_sglang.PACE = RateSource(control={str(control)!r})\n"
        "Engine = fake_sglang.Engine\n"
    )
