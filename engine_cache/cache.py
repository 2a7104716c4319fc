"""EngineCache: the two tiers, one builder per key, stats, verify and gc.

lookup:        local entry (verified) → S3 entry (downloaded, every sha256 verified, then
               renamed into the local tier) → None.
get_or_build:  lookup; on a miss take the local file lock (one builder per machine), then the
               S3 lease (one builder per fleet); waiters poll until the holder publishes and
               fetch its result; the holder builds into a staging dir and publishes.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_cache.errors import CacheError, CorruptEntry, S3Unreachable
from engine_cache.key import is_engine_key
from engine_cache.lease import Lease
from engine_cache.local import LocalTier
from engine_cache.location import parse_s3_uri
from engine_cache.manifest import Manifest, manifest_for_dir
from engine_cache.stats import StatsFile
from engine_cache.tier import Tier

if TYPE_CHECKING:  # boto3 is needed only with an S3 tier
    from boto3.s3.transfer import TransferConfig

    from engine_cache.s3 import S3Tier

log = logging.getLogger("trident.engine_cache")
PUBLISHED_MARK = "published"  # in a local entry: S3 holds this key (ours or another's)


def _falls_back_to_local(method):
    """With local_only=True, an unreachable S3 endpoint is logged once and the operation
    (and every later one) runs on the local tier alone; otherwise it is a CacheError."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except S3Unreachable as e:
            if not self.local_only or self.s3 is None:
                raise
            log.warning("engine cache: %s; carrying on with the local tier only", e)
            self.s3 = None
            return method(self, *args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class EntryInfo:
    key: str
    size: int
    files: int
    created: float
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tier: str = "local"  # "local", "s3" or "local+s3"


class EngineCache:
    def __init__(
        self,
        local_dir: Path,
        s3_uri: str | None = None,
        endpoint_url: str | None = None,
        local_only: bool = False,
        clock: Callable[[], float] = time.time,
        *,
        sleep: Callable[[float], None] = time.sleep,
        lease_ttl_s: float = 600.0,
        poll_s: float = 5.0,
        wait_timeout_s: float | None = None,
        transfer_config: TransferConfig | None = None,
    ):
        """local_only=True: when the S3 endpoint is unreachable, warn and carry on with the
        local tier (by default that is a CacheError naming the endpoint). wait_timeout_s
        bounds how long a waiter waits for another builder (None: forever; a dead builder's
        lease expires after lease_ttl_s and a waiter takes over). transfer_config:
        boto3's, for S3 transfers (default: engine_cache.s3_client.DEFAULT_TRANSFER)."""
        if lease_ttl_s <= 0 or poll_s <= 0:
            raise CacheError("lease_ttl_s and poll_s must be positive", 2)
        self.clock, self.sleep = clock, sleep
        self.local = LocalTier(Path(local_dir), clock)
        self.stats_file = StatsFile(Path(local_dir) / "stats.json")
        self.local_only = local_only
        self.s3 = _open_s3(s3_uri, endpoint_url, transfer_config, clock) if s3_uri else None
        self.lease_ttl_s, self.poll_s, self.wait_timeout_s = lease_ttl_s, poll_s, wait_timeout_s

    # --- lookup ------------------------------------------------------------------------
    @_falls_back_to_local
    def lookup(self, key: str) -> Path | None:
        """A verified local entry, else one fetched and verified from S3, else None."""
        path, outcome = self._find(_checked(key))
        self._count_lookup(outcome)
        return path

    def _find(self, key: str) -> tuple[Path | None, str]:
        path = self.local.lookup(key)
        if path is not None:
            return path, "hit-local"
        if self.s3 is not None:
            path = self._fetch(self.s3, key)
            if path is not None:
                return path, "hit-s3"
        return None, "miss"

    def _count_lookup(self, outcome: str) -> None:
        counter = {"hit-local": "hits_local", "hit-s3": "hits_s3"}.get(outcome, "misses")
        self.stats_file.add({"lookups": 1, counter: 1})

    # The S3 steps take the tier they run on as an argument: self.s3 is None without S3,
    # and turns None when S3 stops answering under local_only.
    def _fetch(self, s3: S3Tier, key: str) -> Path | None:
        try:
            got = s3.get_manifest(key)
        except CorruptEntry as corrupt:
            self._quarantine_s3(s3, key, corrupt.problems, corrupt.etag)
            return None
        if got is None:
            return None
        manifest, etag = got
        staging = self.local.staging_dir()
        started = self.clock()
        try:
            problems = s3.fetch(manifest, staging / "files")
            if problems:
                self._quarantine_s3(s3, key, problems, etag)
                return None
            self.stats_file.add(
                {"fetch_bytes": manifest.size, "fetch_seconds": self.clock() - started}
            )
            (staging / PUBLISHED_MARK).touch()
            return self.local.commit(staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _quarantine_s3(self, s3: S3Tier, key: str, problems: list[str], etag: str | None) -> None:
        self.stats_file.add({"corrupt_entries": 1})
        s3.quarantine(key, problems, etag)

    # --- build -------------------------------------------------------------------------
    @_falls_back_to_local
    def get_or_build(
        self, key: str, build: Callable[[Path], None], metadata: dict
    ) -> tuple[Path, str]:
        """(engine dir, "hit-local" | "hit-s3" | "built"). build(dir) writes the engine
        files into dir; across processes and machines only one build runs per key."""
        key = _checked(key)
        path, outcome = self.local.lookup(key), "hit-local"
        if path is None:
            # Under the lock, so the processes of one machine fetch or build a key once.
            with self.local.lock(key):
                path, outcome = self._find(key)
                if path is None:
                    path, outcome = self._build_once(key, build, metadata)
        if outcome == "hit-local":
            self._publish_pending(key, must_succeed=False)
        if outcome != "built":
            self._count_lookup(outcome)
        return path, outcome

    def _build_once(
        self, key: str, build: Callable[[Path], None], metadata: dict
    ) -> tuple[Path, str]:
        if self.s3 is None:
            return self._build_and_publish(key, build, metadata), "built"
        with self._s3_lease(self.s3, key) as fetched:
            if fetched is not None:
                return fetched, "hit-s3"
            return self._build_and_publish(key, build, metadata), "built"

    @contextmanager
    def _s3_lease(self, s3: S3Tier, key: str) -> Iterator[Path | None]:
        """Hold the S3 build lease (yields None), or yield the entry another holder
        published while we waited."""
        lease = Lease(s3, key, self.lease_ttl_s, self.clock)
        waited_since = None
        while not lease.acquire():
            if waited_since is None:
                waited_since = self.clock()
                self.stats_file.add({"lease_waits": 1})
                log.info("engine cache: %s is being built by %s; waiting", key, lease.holder)
            fetched = self._fetch(s3, key) if s3.has_entry(key) else None
            if fetched is not None:
                yield fetched
                return
            if (
                self.wait_timeout_s is not None
                and self.clock() - waited_since > self.wait_timeout_s
            ):
                raise CacheError(
                    f"waited {self.wait_timeout_s:.0f} s for {lease.holder} to "
                    f"build {key}; giving up"
                )
            self.sleep(self.poll_s)
        lease.start_renewing()
        try:
            # The previous holder may have published just before releasing its lease.
            yield self._fetch(s3, key)
        finally:
            lease.release()

    def _build_and_publish(self, key: str, build: Callable[[Path], None], metadata: dict) -> Path:
        staging = self.local.staging_dir()
        started = self.clock()
        try:
            try:
                build(staging / "files")
            except BaseException:
                self.stats_file.add({"build_failures": 1})
                raise
            self.stats_file.add(
                {"builds": 1, "misses": 1, "lookups": 1, "build_seconds": self.clock() - started}
            )
            manifest = manifest_for_dir(key, staging / "files", self.clock(), metadata)
            path = self.local.commit(staging, manifest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._publish_pending(key)
        return path

    # --- publish -----------------------------------------------------------------------
    @_falls_back_to_local
    def publish(self, key: str, engine_dir: Path, metadata: dict) -> None:
        """Copy an engine directory into the local tier and, if configured, into S3."""
        self.local.publish_copy(_checked(key), Path(engine_dir), metadata)
        self._publish_pending(key)

    def _publish_pending(self, key: str, must_succeed: bool = True) -> None:
        """Upload a local entry S3 does not hold yet. A failed upload leaves the entry
        unmarked, so the next run retries instead of losing the result of a long build;
        on a mere local hit the failure is only logged (the engine is usable)."""
        mark = self.local.entry_dir(key) / PUBLISHED_MARK
        if self.s3 is None or mark.exists():
            return
        manifest = self.local.manifest(key)
        started = self.clock()
        try:
            published = self.s3.publish(manifest, self.local.files_dir(key))
        except CacheError as e:
            if isinstance(e, S3Unreachable) and self.local_only:
                log.warning("engine cache: %s; carrying on with the local tier only", e)
                self.s3 = None
                return
            if must_succeed:
                raise CacheError(
                    f"{key} is cached locally in {self.local.files_dir(key)} but "
                    f"publishing it failed: {e}"
                ) from e
            log.warning("engine cache: %s is not in S3 yet and uploading it failed: %s", key, e)
            return
        if published:
            self.stats_file.add(
                {"upload_bytes": manifest.size, "upload_seconds": self.clock() - started}
            )
        else:
            self.stats_file.add({"publish_conflicts": 1})
        mark.touch()

    # --- inspection and maintenance ----------------------------------------------------
    def _tiers(self) -> list[Tier]:
        return [self.local] + ([self.s3] if self.s3 is not None else [])

    @_falls_back_to_local
    def entries(self) -> list[EntryInfo]:
        """Every entry of both tiers (one row per key; tier says where it is)."""
        found: dict[str, tuple[Manifest, str]] = {}
        for tier in self._tiers():
            for key in tier.keys():
                if key in found:  # the same key: the first tier's manifest will do
                    found[key] = (found[key][0], f"{found[key][1]}+{tier.name}")
                    continue
                manifest = _readable_manifest(tier, key)
                if manifest is not None:
                    found[key] = (manifest, tier.name)
        return [
            EntryInfo(k, m.size, len(m.files), m.created, dict(m.metadata), tier)
            for k, (m, tier) in sorted(found.items(), key=lambda kv: kv[1][0].created)
        ]

    def stats(self) -> dict:
        counters = self.stats_file.read()
        keys = self.local.keys()
        manifests = [_readable_manifest(self.local, key) for key in keys]
        hits = counters["hits_local"] + counters["hits_s3"]
        return {
            **counters,
            "hit_rate": hits / counters["lookups"] if counters["lookups"] else None,
            "local_dir": str(self.local.root),
            "local_entries": len(keys),
            "local_bytes": sum(m.size for m in manifests if m is not None),
            "s3": self.s3.uri if self.s3 else None,
        }

    @_falls_back_to_local
    def verify(self, key: str | None = None) -> list[str]:
        """Problems found; damaged entries are quarantined (and will be rebuilt or fetched).
        Local entries are rehashed; S3 entries are checked without downloading (manifest,
        every object's presence and size, and the sha256 the server stored when it has one)."""
        keys = [self._existing(key)] if key is not None else None
        problems = []
        for tier in self._tiers():
            for k in keys if keys is not None else tier.keys():
                problems += [f"{tier.name} {k}: {p}" for p in tier.verify(k)]
        if problems:
            self.stats_file.add({"corrupt_entries": len({p.split(":")[0] for p in problems})})
        return problems

    def _existing(self, key: str) -> str:
        key = _checked(key)
        if not any(tier.has_entry(key) for tier in self._tiers()):
            raise CacheError(f"cache verify: no entry {key} in the cache", 2)
        return key

    @_falls_back_to_local
    def gc(
        self,
        keep_last: int | None = None,
        older_than_s: float | None = None,
        include_s3: bool = False,
    ) -> list[str]:
        """Remove local entries beyond the keep_last most recently used, and those unused
        for older_than_s seconds. Returns the removed keys. With include_s3 the same policy
        applies to the shared bucket (by creation time: S3 does not know last use), and
        upload folders abandoned for a day by killed publishers are deleted."""
        _check_gc_policy(keep_last, older_than_s)
        tiers = self._tiers() if include_s3 else [self.local]
        removed = []
        for tier in tiers:
            tier.remove_abandoned()
            removed += self._gc_tier(tier, keep_last, older_than_s)
        return sorted(set(removed))

    def _gc_tier(self, tier: Tier, keep_last: int | None, older_than_s: float | None) -> list[str]:
        used: dict[str, float] = {}
        for key in tier.keys():
            try:
                used[key] = tier.last_used(key)
            except CacheError:
                continue  # damaged: verify reports and quarantines it
        newest_first = sorted(used, key=used.__getitem__, reverse=True)
        return [
            key
            for key in self._expired(newest_first, used.__getitem__, keep_last, older_than_s)
            if tier.remove(key)
        ]

    def _expired(
        self,
        newest_first: list[str],
        timestamp: Callable[[str], float],
        keep_last: int | None,
        older_than_s: float | None,
    ) -> list[str]:
        now = self.clock()
        return [
            key
            for rank, key in enumerate(newest_first)
            if (keep_last is not None and rank >= keep_last)
            or (older_than_s is not None and now - timestamp(key) > older_than_s)
        ]


def _open_s3(
    uri: str,
    endpoint_url: str | None,
    transfer_config: TransferConfig | None,
    clock: Callable[[], float],
) -> S3Tier:
    parse_s3_uri(uri)  # a bad URI is bad input, with or without boto3
    try:
        from engine_cache.s3 import S3Tier
    except ImportError as e:
        raise CacheError(
            f"the S3 tier {uri} needs boto3, which is not installed ({e}); "
            "install it, or use the local tier alone"
        ) from e
    return S3Tier(uri, endpoint_url, transfer_config, clock)


def _readable_manifest(tier: Tier, key: str) -> Manifest | None:
    """The manifest, or None when absent or damaged (verify reports and quarantines it)."""
    try:
        return tier.read_manifest(key)
    except CacheError:
        return None


def _check_gc_policy(keep_last: int | None, older_than_s: float | None) -> None:
    if keep_last is None and older_than_s is None:
        raise CacheError("cache gc: give keep_last and/or older_than_s", 2)
    if keep_last is not None and keep_last < 0:
        raise CacheError(f"cache gc: keep_last must be >= 0, got {keep_last}", 2)
    if older_than_s is not None and older_than_s < 0:
        raise CacheError(f"cache gc: older_than_s must be >= 0, got {older_than_s}", 2)


def _checked(key: str) -> str:
    if not isinstance(key, str) or not is_engine_key(key):
        raise CacheError(
            f"{key!r} is not an engine cache key (64 lowercase hex digits; see engine_key())", 2
        )
    return key
