"""engine_cache stands alone: nothing of builder/, no boto3 until an S3 tier is opened, its
own error base that the trident CLI still prints as one line with the same exit code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from builder.cli import main as cli
from builder.errors import TridentError
from engine_cache import CacheError

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter where boto3, botocore, s3transfer and builder cannot be
# imported at all (a meta-path hook), so a stray import anywhere fails loudly.
WITHOUT_BOTO3 = r"""
import sys, tempfile
from pathlib import Path

BLOCKED = ("boto3", "botocore", "s3transfer", "builder")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked in this test: {name}")
        return None

sys.meta_path.insert(0, Block())
from engine_cache import CacheError, EngineCache, EngineInputs, engine_key

def build(out):
    (out / "rank0.engine").write_bytes(b"ENGINE")

key = engine_key(EngineInputs("a" * 64, {"max_batch_size": 8}, "90", "0.20.0", "10.10.0"))
root = Path(tempfile.mkdtemp())
cache = EngineCache(root / "c")
assert cache.get_or_build(key, build, {})[1] == "built"
assert cache.get_or_build(key, build, {})[1] == "hit-local"
assert cache.verify() == [] and [e.tier for e in cache.entries()] == ["local"]
assert cache.gc(keep_last=0) == [key]
try:
    EngineCache(root / "c", "s3://bucket/engines")
except CacheError as e:
    assert "needs boto3" in str(e), e
else:
    raise AssertionError("an S3 tier without boto3 must be a CacheError")
print("loaded:", sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED)))
"""


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_engine_cache_imports_nothing_of_builder():
    offenders = {
        f"{path.name}: {name}"
        for path in (ROOT / "engine_cache").glob("*.py")
        for name in _imported_modules(path)
        if name.split(".")[0] == "builder"
    }
    assert not offenders


def test_local_use_without_boto3_or_builder(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_BOTO3], cwd=ROOT, text=True, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded: []"


def test_cache_error_is_its_own_base_with_exit_codes():
    assert not issubclass(CacheError, TridentError)
    assert CacheError("failed").exit_code == 1
    assert CacheError("bad input", 2).exit_code == 2


def test_cli_prints_a_cache_error_as_one_line(tmp_path, capsys):
    code = cli.main(["cache", "verify", "not-a-key", "--local-cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: 'not-a-key' is not an engine cache key") and err.count("\n") == 1
