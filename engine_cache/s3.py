"""The S3 tier: entries shared by every machine, on AWS or any S3-compatible server.

Layout under s3://bucket/prefix:
  <key>/files/<upload_id>/<path>   one private folder per publisher, so two publishers of
                                   one key never overwrite each other's bytes
  <key>/manifest.json              written LAST with If-None-Match: * : the entry exists
                                   exactly when this object does, and only one publisher wins
  <key>/lease.json                 the build lease (engine_cache.lease)
  quarantine/<key>/<time>/...      corrupt entries moved aside, with reason.txt

Every botocore failure becomes a CacheError naming the endpoint, the object and the reason
(engine_cache.s3_client). EngineCache imports this module only for an s3:// cache.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import botocore.exceptions
from boto3.s3.transfer import TransferConfig, create_transfer_manager

from engine_cache.errors import CacheError, CorruptEntry
from engine_cache.key import is_engine_key
from engine_cache.location import parse_s3_uri
from engine_cache.manifest import MANIFEST_NAME, FileRecord, Manifest, parse_manifest
from engine_cache.s3_client import (  # noqa: F401
    CONFLICT,
    DEFAULT_TRANSFER,
    NOT_FOUND,
    MiB,
    S3Client,
    error_code,
    wait_all,
)
from engine_cache.verified_file import VerifyingFile

log = logging.getLogger("trident.engine_cache")
ABANDONED_UPLOAD_S = 24 * 3600  # an unpublished upload folder this old lost its publisher


class S3Tier:
    """The shared tier (an engine_cache.tier.Tier, plus publish/fetch and leases)."""

    name = "s3"

    def __init__(
        self,
        uri: str,
        endpoint_url: str | None = None,
        transfer_config: TransferConfig | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.location = parse_s3_uri(uri)
        self.uri = uri
        s3 = S3Client(endpoint_url)
        self.client, self.endpoint, self._call = s3.client, s3.endpoint, s3.call
        self.transfer_config = transfer_config or DEFAULT_TRANSFER
        self.clock = clock

    def _where(self, object_key: str) -> str:
        return f"s3://{self.location.bucket}/{object_key}"

    # --- small objects -----------------------------------------------------------------
    def _get(self, object_key: str) -> tuple[bytes, str] | None:
        with self._call(f"reading {self._where(object_key)}"):
            try:
                response = self.client.get_object(Bucket=self.location.bucket, Key=object_key)
            except botocore.exceptions.ClientError as e:
                if error_code(e) in NOT_FOUND:
                    return None
                raise
            return response["Body"].read(), response["ETag"]

    def _put_conditional(self, object_key: str, body: bytes, **condition) -> str | None:
        """Put with If-None-Match/If-Match; the new etag, or None if the condition failed."""
        with self._call(f"writing {self._where(object_key)}"):
            try:
                response = self.client.put_object(
                    Bucket=self.location.bucket, Key=object_key, Body=body, **condition
                )
            except botocore.exceptions.ClientError as e:
                if error_code(e) in CONFLICT or error_code(e) in NOT_FOUND:
                    return None
                raise
            return response["ETag"]

    def _delete(self, object_key: str, **condition) -> None:
        with self._call(f"deleting {self._where(object_key)}"):
            try:
                self.client.delete_object(Bucket=self.location.bucket, Key=object_key, **condition)
            except botocore.exceptions.ClientError as e:
                if error_code(e) not in CONFLICT | NOT_FOUND:
                    raise

    # --- manifests ---------------------------------------------------------------------
    def manifest_key(self, key: str) -> str:
        return self.location.object_key(key, MANIFEST_NAME)

    def has_entry(self, key: str) -> bool:
        """The entry exists exactly when its manifest does."""
        with self._call(f"looking up {self._where(self.manifest_key(key))}"):
            try:
                self.client.head_object(Bucket=self.location.bucket, Key=self.manifest_key(key))
            except botocore.exceptions.ClientError as e:
                if error_code(e) in NOT_FOUND:
                    return False
                raise
            return True

    def get_manifest(self, key: str) -> tuple[Manifest, str] | None:
        """(manifest, etag), None when absent; CorruptEntry when present but unusable."""
        got = self._get(self.manifest_key(key))
        if got is None:
            return None
        raw, etag = got
        try:
            manifest = parse_manifest(raw, key, self._where(self.manifest_key(key)))
        except CacheError as e:
            raise CorruptEntry(key, [str(e)], etag) from e
        if not manifest.upload_id or "/" in manifest.upload_id:
            raise CorruptEntry(
                key, [f"manifest has no valid upload_id ({manifest.upload_id!r})"], etag
            )
        return manifest, etag

    def read_manifest(self, key: str) -> Manifest | None:
        got = self.get_manifest(key)
        return got[0] if got else None

    def last_used(self, key: str) -> float:
        """The creation time: S3 does not know when an entry was last used."""
        got = self.get_manifest(key)
        if got is None:
            raise CacheError(f"no entry {key} in {self.uri}")
        return got[0].created

    def _subfolders(self, prefix: str) -> list[str]:
        """Names of the 'folders' directly under prefix (which ends with '/')."""
        names = []
        with self._call(f"listing s3://{self.location.bucket}/{prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                names += [
                    common["Prefix"][len(prefix) :].rstrip("/")
                    for common in page.get("CommonPrefixes", [])
                ]
        return names

    def key_folders(self) -> list[str]:
        """Every key with objects in S3, published or not (uploads in progress, abandoned)."""
        prefix = self.location.object_key("") + ("/" if self.location.prefix else "")
        return sorted(name for name in self._subfolders(prefix) if is_engine_key(name))

    def keys(self) -> list[str]:
        """Keys that have a manifest (entries in progress or abandoned have none)."""
        return [k for k in self.key_folders() if self.has_entry(k)]

    def remove_abandoned(self) -> list[str]:
        """Upload folders of publishers killed before their manifest, a day on."""
        return [
            f"{key}/files/{upload_id}"
            for key in self.key_folders()
            for upload_id in self.sweep_abandoned_uploads(key, ABANDONED_UPLOAD_S)
        ]

    def sweep_abandoned_uploads(self, key: str, older_than_s: float) -> list[str]:
        """Delete upload folders of key that no manifest names and that were started more
        than older_than_s ago (a publisher killed before its manifest; younger ones may
        still be uploading). Returns the upload ids removed."""
        try:
            got = self.get_manifest(key)
        except CorruptEntry:
            return []  # verify quarantines it first
        live = got[0].upload_id if got else None
        now, removed = self.clock(), []
        for upload_id in self._subfolders(self.location.object_key(key, "files") + "/"):
            started = upload_id.split("-", 1)[0]
            if upload_id != live and started.isdigit() and now - int(started) > older_than_s:
                self._delete_prefix(self.location.object_key(key, "files", upload_id) + "/")
                removed.append(upload_id)
        return removed

    def remove(self, key: str) -> bool:
        """Delete an entry: its manifest first (it disappears at once), then its files."""
        existed = self.has_entry(key)
        self._delete(self.manifest_key(key))
        self._delete_prefix(self.location.object_key(key, "files") + "/")
        return existed

    # --- files -------------------------------------------------------------------------
    def file_key(self, manifest: Manifest, record: FileRecord) -> str:
        return self.location.object_key(manifest.key, "files", manifest.upload_id, record.path)

    def publish(self, manifest: Manifest, files_dir: Path) -> bool:
        """Upload the files into a private folder, verify them, then write the manifest
        conditionally. False when another publisher's manifest is already there (our
        uploaded copy is then deleted). Interrupted before the manifest: no entry exists."""
        if self.has_entry(manifest.key):
            return False
        manifest = manifest.with_upload_id(f"{int(self.clock())}-{uuid.uuid4().hex[:12]}")
        try:
            self._upload_files(manifest, files_dir)
        except BaseException:
            self._try_delete_upload(manifest)
            raise
        problems = self._stored_problems(manifest)
        if problems:
            self._delete_upload(manifest)
            raise CacheError(
                f"uploading {manifest.key} to {self.uri} failed verification: "
                + "; ".join(problems)
            )
        etag = self._put_conditional(
            self.manifest_key(manifest.key), manifest.to_json(), IfNoneMatch="*"
        )
        if etag is None:
            self._delete_upload(manifest)
            return False
        return True

    def _upload_files(self, manifest: Manifest, files_dir: Path) -> None:
        with (
            self._call(f"uploading {manifest.key} to {self.uri}"),
            create_transfer_manager(self.client, self.transfer_config) as manager,
        ):
            futures = [
                manager.upload(
                    str(files_dir / record.path),
                    self.location.bucket,
                    self.file_key(manifest, record),
                    extra_args=self._upload_checksum(record),
                )
                for record in manifest.files
            ]
            wait_all(futures)

    def _upload_checksum(self, record: FileRecord) -> dict[str, str]:
        """Single-part objects carry our sha256: the server rejects bytes that do not match
        the manifest. Multipart uploads get a server-checked sha256 per part instead."""
        if record.size < self.transfer_config.multipart_threshold:
            return {"ChecksumSHA256": base64.b64encode(bytes.fromhex(record.sha256)).decode()}
        return {"ChecksumAlgorithm": "SHA256"}

    def _stored_problems(self, manifest: Manifest) -> list[str]:
        """Cheap remote check: every object present with the manifest's size, and the same
        sha256 where the server stored a whole-object one."""
        problems = []
        for record in manifest.files:
            object_key = self.file_key(manifest, record)
            with self._call(f"checking {self._where(object_key)}"):
                try:
                    head = self.client.head_object(
                        Bucket=self.location.bucket, Key=object_key, ChecksumMode="ENABLED"
                    )
                except botocore.exceptions.ClientError as e:
                    if error_code(e) in NOT_FOUND:
                        problems.append(f"{record.path}: missing in S3")
                        continue
                    raise
            if head["ContentLength"] != record.size:
                problems.append(
                    f"{record.path}: {head['ContentLength']} bytes in S3, "
                    f"manifest says {record.size}"
                )
            stored = head.get("ChecksumSHA256")
            if (
                stored
                and "-" not in stored
                and head.get("ChecksumType") != "COMPOSITE"
                and base64.b64decode(stored).hex() != record.sha256
            ):
                problems.append(f"{record.path}: sha256 in S3 differs from the manifest")
        return problems

    def fetch(self, manifest: Manifest, target_dir: Path) -> list[str]:
        """Download every file into target_dir, hashing while downloading. Returns the
        problems (missing, size or sha256 mismatch); empty means every byte was verified."""
        targets = {record.path: target_dir / record.path for record in manifest.files}
        for path in targets.values():
            path.parent.mkdir(parents=True, exist_ok=True)
        writers = {name: VerifyingFile(path) for name, path in targets.items()}
        try:
            missing = self._download_into(manifest, writers)
        except OSError as e:  # the local disk (full?), not the entry: nothing to blame
            raise CacheError(f"writing {manifest.key} into {target_dir} failed: {e}") from e
        finally:
            for writer in writers.values():
                writer.close()
        for name, writer in writers.items():
            if writer.read_error is not None:
                raise CacheError(
                    f"reading back {targets[name]} to verify it failed: {writer.read_error}"
                )
        problems = [f"{name}: missing in S3" for name in missing]
        for record in manifest.files:
            got = writers[record.path]
            if record.path in missing:
                continue
            if got.size() != record.size:
                problems.append(
                    f"{record.path}: got {got.size()} bytes, manifest says {record.size}"
                )
            elif got.digest.hexdigest() != record.sha256:
                problems.append(f"{record.path}: sha256 differs from the manifest")
        return problems

    def _download_into(self, manifest: Manifest, writers: dict[str, VerifyingFile]) -> set[str]:
        """Parallel ranged GETs of every file; returns the names of files S3 does not have."""
        missing = set()
        # Leaving the manager's context on an exception cancels the other transfers.
        with (
            self._call(f"downloading {manifest.key} from {self.uri}"),
            create_transfer_manager(self.client, self.transfer_config) as manager,
        ):
            futures = {
                record.path: manager.download(
                    self.location.bucket, self.file_key(manifest, record), writers[record.path]
                )
                for record in manifest.files
            }
            for name, future in futures.items():
                try:
                    future.result()
                except botocore.exceptions.ClientError as e:
                    if error_code(e) not in NOT_FOUND:
                        raise
                    missing.add(name)
        return missing

    def verify(self, key: str) -> list[str]:
        """Check an entry without downloading it (see _stored_problems); a damaged one is
        quarantined. An absent entry has no problems."""
        try:
            got = self.get_manifest(key)
        except CorruptEntry as corrupt:
            self.quarantine(key, corrupt.problems, corrupt.etag)
            return corrupt.problems
        if got is None:
            return []
        problems = self._stored_problems(got[0])
        if problems:
            self.quarantine(key, problems, got[1])
        return problems

    # --- removal -----------------------------------------------------------------------
    def _delete_prefix(self, prefix: str) -> None:
        with self._call(f"deleting s3://{self.location.bucket}/{prefix}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    # One by one: an entry holds a handful of objects.
                    self.client.delete_object(Bucket=self.location.bucket, Key=item["Key"])

    def _delete_upload(self, manifest: Manifest) -> None:
        self._delete_prefix(
            self.location.object_key(manifest.key, "files", manifest.upload_id) + "/"
        )

    def _try_delete_upload(self, manifest: Manifest) -> None:
        """Best effort after a failed upload: without a manifest the objects are invisible
        anyway, so a failure here (S3 gone) only leaves garbage, never a bad entry."""
        try:
            self._delete_upload(manifest)
        except CacheError as e:
            log.warning(
                "engine cache: could not remove the partial upload of %s: %s", manifest.key, e
            )

    def quarantine(self, key: str, problems: list[str], etag: str | None = None) -> None:
        """Hide a damaged entry at once (delete its manifest, only if still the one we
        judged), keep the manifest and the reason under quarantine/, drop the files."""
        stamp = f"{int(self.clock())}-{uuid.uuid4().hex[:6]}"
        base = self.location.object_key("quarantine", key, stamp)
        got = self._get(self.manifest_key(key))
        if got is None or (etag is not None and got[1] != etag):
            return  # already quarantined, or replaced by a new publisher
        raw, current_etag = got
        with self._call(f"quarantining {key} in {self.uri}"):
            self.client.put_object(
                Bucket=self.location.bucket, Key=f"{base}/{MANIFEST_NAME}", Body=raw
            )
            self.client.put_object(
                Bucket=self.location.bucket,
                Key=f"{base}/reason.txt",
                Body=("\n".join(problems) + "\n").encode(),
            )
        self._delete(self.manifest_key(key), IfMatch=current_etag)
        try:
            manifest = parse_manifest(raw, key, "quarantined manifest")
            if manifest.upload_id and "/" not in manifest.upload_id:
                self._delete_upload(manifest)
        except CacheError:
            pass  # unreadable manifest: its files are left for gc
        log.warning(
            "engine cache: S3 entry %s is damaged (%s); quarantined under %s/",
            key,
            "; ".join(problems),
            self._where(base),
        )

    # --- leases (engine_cache.lease.LeaseStore) ----------------------------------------
    def lease_key(self, key: str) -> str:
        return self.location.object_key(key, "lease.json")

    def create_lease(self, key: str, body: bytes) -> str | None:
        return self._put_conditional(self.lease_key(key), body, IfNoneMatch="*")

    def replace_lease(self, key: str, body: bytes, etag: str) -> str | None:
        return self._put_conditional(self.lease_key(key), body, IfMatch=etag)

    def read_lease(self, key: str) -> tuple[bytes, str] | None:
        return self._get(self.lease_key(key))

    def delete_lease(self, key: str, etag: str) -> None:
        self._delete(self.lease_key(key), IfMatch=etag)
