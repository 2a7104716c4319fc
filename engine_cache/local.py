"""The local tier: verified entries in a directory on this machine.

Layout under the cache root:
  entries/<key>/manifest.json   what the entry holds (sha256 + size of every file)
  entries/<key>/files/...       the engine files (what lookup returns)
  entries/<key>/stamp.json      (size, mtime, ctime, inode) of each file when last verified
  entries/<key>/last_used       touched on every hit (gc keeps the most recently used)
  tmp/                          staging; an entry appears only by one rename from here
  quarantine/<key>-<time>-<id>/ corrupt entries, moved aside with a reason.txt
  locks/<key>.lock              one builder per key on this machine
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from engine_cache.errors import CacheError, CorruptEntry
from engine_cache.key import is_engine_key
from engine_cache.manifest import (
    MANIFEST_NAME,
    Manifest,
    manifest_for_dir,
    parse_manifest,
    problems_in_dir,
)

log = logging.getLogger("trident.engine_cache")
STAMP_NAME = "stamp.json"
LAST_USED_NAME = "last_used"


def stat_stamp(files_dir: Path, manifest: Manifest) -> dict[str, list[int]]:
    stamp = {}
    for record in manifest.files:
        st = (files_dir / record.path).stat()
        stamp[record.path] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return stamp


class LocalTier:
    """The machine's own tier (an engine_cache.tier.Tier, plus staging and commit)."""

    name = "local"

    def __init__(self, root: Path, clock: Callable[[], float] = time.time):
        self.root = Path(root)
        self.clock = clock
        for name in ("entries", "tmp", "quarantine", "locks"):
            try:
                (self.root / name).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CacheError(f"local cache {self.root}: cannot create {name}/ ({e})") from e

    # --- paths -------------------------------------------------------------------------
    def entry_dir(self, key: str) -> Path:
        return self.root / "entries" / key

    def files_dir(self, key: str) -> Path:
        return self.entry_dir(key) / "files"

    def lock(self, key: str) -> FileLock:
        return FileLock(str(self.root / "locks" / f"{key}.lock"))

    def keys(self) -> list[str]:
        return sorted(
            p.name
            for p in (self.root / "entries").iterdir()
            if is_engine_key(p.name) and (p / MANIFEST_NAME).is_file()
        )

    def has_entry(self, key: str) -> bool:
        return self.entry_dir(key).exists()

    # --- reading -----------------------------------------------------------------------
    def read_manifest(self, key: str) -> Manifest | None:
        """None when absent; CorruptEntry when present but unreadable."""
        if not (self.entry_dir(key) / MANIFEST_NAME).is_file():
            return None
        try:
            return self.manifest(key)
        except (CacheError, OSError) as e:
            raise CorruptEntry(key, [str(e)]) from e

    def manifest(self, key: str) -> Manifest:
        path = self.entry_dir(key) / MANIFEST_NAME
        return parse_manifest(path.read_bytes(), key, str(path))

    def lookup(self, key: str) -> Path | None:
        """The entry's files directory if present and intact; a damaged entry is quarantined.

        Files unchanged since their last verification (same size, mtime, ctime and inode) are
        trusted without rehashing, so a hit on a multi-GB engine costs a few stat calls; any
        write changes the ctime, even one that puts the mtime back."""
        entry = self.entry_dir(key)
        if not (entry / MANIFEST_NAME).is_file():
            return None
        problems = self._problems(key, trust_stamp=True)
        if problems:
            self.quarantine(key, problems)
            return None
        (entry / LAST_USED_NAME).write_text(f"{self.clock()}\n")
        return self.files_dir(key)

    def verify(self, key: str) -> list[str]:
        """Rehash every file; a damaged entry is quarantined. Returns the problems found
        (none for an absent entry)."""
        if not self.has_entry(key):
            return []
        problems = self._problems(key, trust_stamp=False)
        if problems:
            self.quarantine(key, problems)
        return problems

    def _problems(self, key: str, trust_stamp: bool) -> list[str]:
        try:
            manifest = self.manifest(key)
        except (CacheError, OSError) as e:
            return [str(e)]
        files = self.files_dir(key)
        stamp_path = self.entry_dir(key) / STAMP_NAME
        shallow = problems_in_dir(manifest, files, deep=False)
        if shallow:
            return shallow
        if trust_stamp and self._stamp_matches(stamp_path, files, manifest):
            return []
        problems = problems_in_dir(manifest, files, deep=True)
        if not problems:
            stamp_path.write_text(json.dumps(stat_stamp(files, manifest)))
        return problems

    @staticmethod
    def _stamp_matches(stamp_path: Path, files: Path, manifest: Manifest) -> bool:
        try:
            return json.loads(stamp_path.read_text()) == stat_stamp(files, manifest)
        except (OSError, ValueError):
            return False

    def last_used(self, key: str) -> float:
        entry = self.entry_dir(key)
        try:
            return float((entry / LAST_USED_NAME).read_text())
        except (OSError, ValueError):
            return self.manifest(key).created

    # --- writing -----------------------------------------------------------------------
    def staging_dir(self) -> Path:
        """A fresh private directory under tmp/ (same filesystem: the commit is one rename)."""
        path = self.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        (path / "files").mkdir(parents=True)
        return path

    def commit(self, staging: Path, manifest: Manifest) -> Path:
        """Move a staged, verified entry into place atomically. If the key already exists
        (another process won), the existing entry is kept and the staging is dropped."""
        files = staging / "files"
        (staging / MANIFEST_NAME).write_bytes(manifest.to_json())
        (staging / STAMP_NAME).write_text(json.dumps(stat_stamp(files, manifest)))
        (staging / LAST_USED_NAME).write_text(f"{self.clock()}\n")
        target = self.entry_dir(manifest.key)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / MANIFEST_NAME).is_file():
                raise
            shutil.rmtree(staging, ignore_errors=True)
        return self.files_dir(manifest.key)

    def publish_copy(self, key: str, engine_dir: Path, metadata: dict) -> Manifest:
        """Copy an engine directory into the tier; the manifest hashes the copy we keep."""
        engine_dir = Path(engine_dir)
        if not engine_dir.is_dir():
            raise CacheError(f"engine directory {engine_dir} does not exist", 2)
        staging = self.staging_dir()
        try:
            shutil.copytree(engine_dir, staging / "files", dirs_exist_ok=True, symlinks=True)
            manifest = manifest_for_dir(key, staging / "files", self.clock(), metadata)
            self.commit(staging, manifest)
            return manifest
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def quarantine(self, key: str, problems: list[str]) -> None:
        """Move a damaged entry aside (kept for inspection, never served)."""
        target = self.root / "quarantine" / f"{key}-{int(self.clock())}-{uuid.uuid4().hex[:6]}"
        try:
            os.rename(self.entry_dir(key), target)
        except FileNotFoundError:
            return  # another process quarantined or removed it first
        (target / "reason.txt").write_text("\n".join(problems) + "\n")
        log.warning(
            "engine cache: local entry %s is damaged (%s); moved to %s",
            key,
            "; ".join(problems),
            target,
        )

    def remove(self, key: str) -> bool:
        """Delete an entry: first renamed out of entries/ so no reader sees a partial one."""
        doomed = self.root / "tmp" / f"gc-{key}-{uuid.uuid4().hex[:6]}"
        try:
            os.rename(self.entry_dir(key), doomed)
        except FileNotFoundError:
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def remove_abandoned(self) -> list[str]:
        """Staging left by a killed process on this machine (its files never became an
        entry). Staging names start with the owner's pid; a live owner's staging is kept."""
        removed = []
        for path in (self.root / "tmp").iterdir():
            owner = path.name.split("-", 1)[0]
            if owner.isdigit() and not _pid_alive(int(owner)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
