"""The manifest of one cache entry: what files it holds, their sizes and sha256 digests.

A manifest is what makes an entry exist: in S3 it is written last (conditionally), locally it
is renamed into place with the files. Everything read back from a manifest is untrusted
until checked here.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_cache.errors import CacheError
from engine_cache.key import CACHE_FORMAT_VERSION, file_sha256, is_engine_key, regular_files

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class FileRecord:
    path: str  # posix path relative to the engine directory
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    key: str
    files: tuple[FileRecord, ...]
    created: float
    metadata: Mapping[str, Any] = field(default_factory=dict)
    upload_id: str = ""  # S3 only: the publisher's private folder under files/

    @property
    def size(self) -> int:
        return sum(record.size for record in self.files)

    def to_json(self) -> bytes:
        data = {
            "format": CACHE_FORMAT_VERSION,
            "key": self.key,
            "created": self.created,
            "metadata": dict(self.metadata),
            "upload_id": self.upload_id,
            "files": [{"path": r.path, "size": r.size, "sha256": r.sha256} for r in self.files],
        }
        return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()

    def with_upload_id(self, upload_id: str) -> Manifest:
        return Manifest(self.key, self.files, self.created, self.metadata, upload_id)


def safe_relative_path(text: Any) -> str:
    """A manifest path that stays inside the entry (no absolute paths, no '..')."""
    if not isinstance(text, str) or not text or text.startswith("/") or "\\" in text:
        raise ValueError(f"unsafe file path {text!r}")
    normal = posixpath.normpath(text)
    if normal != text or normal.startswith("../") or normal == "..":
        raise ValueError(f"unsafe file path {text!r}")
    return normal


def parse_manifest(raw: bytes, expected_key: str, source: str) -> Manifest:
    """Parse and check a manifest; CacheError names the source and what is wrong."""
    try:
        data = json.loads(raw)
        if data.get("format") != CACHE_FORMAT_VERSION:
            raise ValueError(f"format {data.get('format')!r}, expected {CACHE_FORMAT_VERSION}")
        if data.get("key") != expected_key:
            raise ValueError(f"key {data.get('key')!r} does not match the entry {expected_key}")
        files = tuple(_parse_record(item) for item in data["files"])
        if not files:
            raise ValueError("no files")
        if len({r.path for r in files}) != len(files):
            raise ValueError("duplicate file paths")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("metadata is not an object")
        return Manifest(
            expected_key, files, float(data["created"]), metadata, str(data.get("upload_id", ""))
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CacheError(f"{source}: invalid manifest ({e})") from e


def _parse_record(item: Mapping[str, Any]) -> FileRecord:
    size, sha = item["size"], item["sha256"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"bad size {size!r}")
    if not isinstance(sha, str) or not is_engine_key(sha):
        raise ValueError(f"bad sha256 {sha!r}")
    return FileRecord(safe_relative_path(item["path"]), size, sha)


def manifest_for_dir(
    key: str, engine_dir: Path, created: float, metadata: Mapping[str, Any]
) -> Manifest:
    """Hash every file of a freshly built engine directory."""
    files = tuple(
        FileRecord(rel, path.stat().st_size, file_sha256(path))
        for rel, path in regular_files(engine_dir)
    )
    if not files:
        raise CacheError(f"engine directory {engine_dir} holds no files: nothing to cache")
    try:
        json.dumps(dict(metadata))
    except (TypeError, ValueError) as e:
        raise CacheError(f"cache metadata must be JSON-able: {e}", 2) from e
    return Manifest(key, files, created, dict(metadata))


def problems_in_dir(manifest: Manifest, engine_dir: Path, deep: bool = True) -> list[str]:
    """What differs between a directory and its manifest (missing, extra, size, content).

    deep=False compares only the file list and sizes (a truncation check, no hashing)."""
    problems = []
    try:
        present = {rel: path for rel, path in regular_files(engine_dir)}
    except (CacheError, OSError) as e:
        return [str(e)]
    for record in manifest.files:
        path = present.pop(record.path, None)
        if path is None:
            problems.append(f"{record.path}: missing")
        elif path.stat().st_size != record.size:
            problems.append(
                f"{record.path}: size {path.stat().st_size}, manifest says {record.size}"
            )
        elif deep and file_sha256(path) != record.sha256:
            problems.append(f"{record.path}: sha256 differs from the manifest")
    problems.extend(f"{rel}: not in the manifest" for rel in sorted(present))
    return problems
