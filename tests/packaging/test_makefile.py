"""The Makefile's targets: `make test` brings what the suite needs on a fresh machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
def test_make_test_installs_redis_server_before_the_suite():
    # -n: print the recipes without running them; the tenants' tests start their own
    # Redis, so the redis-server target must come before pytest.
    result = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    redis = next(i for i, line in enumerate(lines) if "command -v redis-server" in line)
    pytest_line = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert redis < pytest_line
