"""Cache keys: a hash of everything that makes a TensorRT-LLM engine valid.

Pure functions of their inputs (plus reading the checkpoint's bytes). TRT-LLM's own build
cache keys on version + build config + path; ours keys on checkpoint *content*, every build
argument, the target SM architecture and both library versions, so an engine is reused
exactly when it would be valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from engine_cache.errors import CacheError

# Bump when the entry layout or key recipe changes: old entries then simply stop matching.
CACHE_FORMAT_VERSION = 1
HASH_CHUNK_BYTES = 4 << 20
_SM_PATTERN = re.compile(r"^[0-9]{2,3}[a-z]?$")


@dataclass(frozen=True)
class EngineInputs:
    """Everything that makes an engine valid; two equal inputs give one engine."""

    checkpoint_digest: str
    build_args: Mapping[str, Any]
    target_sm: str
    trtllm_version: str
    tensorrt_version: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", str(self.checkpoint_digest)):
            raise CacheError(
                f"engine inputs: checkpoint_digest {self.checkpoint_digest!r} "
                "is not a sha256 hex digest (use checkpoint_digest(path))",
                2,
            )
        if not _SM_PATTERN.match(str(self.target_sm)):
            raise CacheError(
                f"engine inputs: target_sm {self.target_sm!r} is not an SM "
                "architecture such as '90' or '89'",
                2,
            )
        for field in ("trtllm_version", "tensorrt_version"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise CacheError(
                    f"engine inputs: {field} must be a non-empty version string, got {value!r}", 2
                )
        if not isinstance(self.build_args, Mapping):
            raise CacheError("engine inputs: build_args must be a mapping of argument → value", 2)
        _check_json_value(self.build_args, "build_args")

    def canonical(self) -> dict[str, Any]:
        return {
            "cache_format": CACHE_FORMAT_VERSION,
            "checkpoint_digest": self.checkpoint_digest,
            "build_args": self.build_args,
            "target_sm": str(self.target_sm),
            "trtllm_version": self.trtllm_version.strip(),
            "tensorrt_version": self.tensorrt_version.strip(),
        }


def _check_json_value(value: Any, where: str) -> None:
    """Reject what canonical JSON cannot represent unambiguously, naming the field."""
    if isinstance(value, Mapping):
        for name, item in value.items():
            if not isinstance(name, str):
                raise CacheError(f"engine inputs: {where} has a non-string key {name!r}", 2)
            _check_json_value(item, f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json_value(item, f"{where}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise CacheError(f"engine inputs: {where} is {value}, which has no JSON form", 2)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise CacheError(
            f"engine inputs: {where} has a {type(value).__name__} value "
            f"({value!r}); build arguments must be JSON values",
            2,
        )


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def engine_key(inputs: EngineInputs) -> str:
    """sha256 hex of the canonical JSON of the inputs and the cache format version."""
    return hashlib.sha256(canonical_json(inputs.canonical())).hexdigest()


def is_engine_key(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{64}", text))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def regular_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, path) of every file under root, sorted; symlinks are refused
    because what they point at is not part of the content being hashed or cached."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise CacheError(
                f"{path}: symbolic links are not supported in checkpoints or "
                "engine directories (copy the file instead)"
            )
        if path.is_file():
            yield path.relative_to(root).as_posix(), path


def checkpoint_digest(path: Path, memo_file: Path | None = None) -> str:
    """sha256 over the sorted (relative path, size, sha256 of content) of every file.

    Renaming, adding, removing or changing any file changes the digest; where the checkpoint
    lives (its absolute path) does not. With memo_file, each file's sha256 is remembered
    against its (device, inode, size, mtime, ctime), so a warm run over a checkpoint of
    hundreds of GB costs a few stat calls instead of rehashing it (ctime changes on every
    write, even one that restores the mtime).
    """
    path = Path(path)
    if path.is_file():
        listing = [(path.name, path)]
    elif path.is_dir():
        listing = list(regular_files(path))
    else:
        raise CacheError(f"checkpoint {path}: no such file or directory", 2)
    if not listing:
        raise CacheError(f"checkpoint {path}: the directory holds no files", 2)
    memo = DigestMemo(Path(memo_file)) if memo_file is not None else None
    records = [
        [rel, file.stat().st_size, memo.sha256(file) if memo else file_sha256(file)]
        for rel, file in listing
    ]
    if memo is not None:
        memo.save()
    return hashlib.sha256(canonical_json(records)).hexdigest()


class DigestMemo:
    """sha256 of files by their stat identity, kept in one JSON file (shared by processes)."""

    def __init__(self, path: Path):
        self.path = path
        self._known = self._load()
        self._learned: dict[str, list] = {}

    def _load(self) -> dict[str, list]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # absent or damaged: everything is simply rehashed

    @staticmethod
    def _identity(file: Path) -> list[int]:
        st = file.stat()
        return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def sha256(self, file: Path) -> str:
        name = str(file.resolve())
        identity = self._identity(file)
        known = self._known.get(name)
        if isinstance(known, list) and known[:-1] == identity:
            return known[-1]
        digest = file_sha256(file)
        if self._identity(file) == identity:  # unchanged while we hashed it
            self._learned[name] = [*identity, digest]
        return digest

    def save(self) -> None:
        if not self._learned:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            merged = {**self._load(), **self._learned}
            temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(merged))
            os.replace(temporary, self.path)
        self._learned.clear()
