"""The SGLang test double as the stub imports it: a `sglang.py` written beside the
rendered model, so the real trident SGLang model runs against tests/fakes/fake_sglang."""
from tests.helpers.servers import ROOT

# Slower and longer than the unit-test default so a cancel lands mid-stream.
SHIM = f'''"""Test-only stand-in for sglang inside the stub (written by tests/helpers/sglang_double.py)."""
import asyncio
import sys

sys.path.insert(0, {str(ROOT)!r})
from tests.fakes import fake_sglang  # noqa: E402

fake_sglang.REPLY = " ".join(f"w{{i}}" for i in range(300))
__version__ = "test-double"


class Engine(fake_sglang.Engine):
    async def _generate(self, *args):
        async for chunk in super()._generate(*args):
            await asyncio.sleep(0.005)
            yield chunk
'''
