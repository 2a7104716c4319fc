"""One builder per key across machines: a lease object in S3 with an expiry.

The lease is `<prefix>/<key>/lease.json` = {"owner", "expires_at"}. It is created with
`If-None-Match: *` (only one creator wins), renewed and taken over only with `If-Match:
<etag>` (so two waiters never both take over an expired lease), and deleted with `If-Match`
(a holder never deletes a lease someone else took over). The holder renews it every ttl/3
while building; a holder that dies stops renewing and the lease expires, so a waiter builds.
Expiry compares wall clocks of different machines: keep ttl much larger than clock skew.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine_cache.errors import CacheError

log = logging.getLogger("trident.engine_cache")


@dataclass(frozen=True)
class LeaseRecord:
    owner: str
    expires_at: float

    def to_json(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires_at": self.expires_at}).encode()

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def parse_lease(raw: bytes) -> LeaseRecord | None:
    """A lease body, or None when unreadable (treated as expired: someone may take it)."""
    try:
        data = json.loads(raw)
        return LeaseRecord(str(data["owner"]), float(data["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return None


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseStore(Protocol):
    """The conditional object operations a lease needs (S3Tier implements them)."""

    def create_lease(self, key: str, body: bytes) -> str | None: ...  # etag or None
    def replace_lease(self, key: str, body: bytes, etag: str) -> str | None: ...  # etag or None
    def read_lease(self, key: str) -> tuple[bytes, str] | None: ...
    def delete_lease(self, key: str, etag: str) -> None: ...


class Lease:
    """A lease on one key, held by this process once acquire() returns True."""

    def __init__(self, store: LeaseStore, key: str, ttl_s: float, clock: Callable[[], float]):
        self.store, self.key, self.ttl_s, self.clock = store, key, ttl_s, clock
        self.owner = new_owner_id()
        self.etag: str | None = None
        self.holder: str | None = None  # who holds it when we do not (for messages)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self) -> bytes:
        return LeaseRecord(self.owner, self.clock() + self.ttl_s).to_json()

    def acquire(self) -> bool:
        """One attempt: create the lease, or take over an expired one."""
        self.etag = self.store.create_lease(self.key, self._body())
        if self.etag:
            return True
        current = self.store.read_lease(self.key)
        if current is None:
            return False  # released between our two calls: the next attempt wins
        raw, etag = current
        record = parse_lease(raw)
        if record is not None and not record.expired(self.clock()):
            self.holder = record.owner
            return False
        self.etag = self.store.replace_lease(self.key, self._body(), etag)
        if self.etag:
            log.warning(
                "engine cache: took over the expired build lease of %s (was %s)",
                self.key,
                record.owner if record else "unreadable",
            )
        return self.etag is not None

    def renew(self) -> bool:
        """Extend the lease; False once it is lost. An S3 hiccup is retried next period."""
        if self.etag is None:
            return False
        try:
            renewed = self.store.replace_lease(self.key, self._body(), self.etag)
        except CacheError as e:
            log.warning("engine cache: could not renew the build lease of %s: %s", self.key, e)
            return True
        self.etag = renewed
        if self.etag is None:
            log.warning(
                "engine cache: lost the build lease of %s (renewed too late?); "
                "the manifest's conditional write still keeps the entry consistent",
                self.key,
            )
        return self.etag is not None

    def start_renewing(self) -> None:
        def loop():
            while not self._stop.wait(self.ttl_s / 3) and self.renew():
                pass

        self._renewer = threading.Thread(target=loop, name=f"lease-{self.key[:8]}", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.etag is not None:
            try:
                self.store.delete_lease(self.key, self.etag)
            except CacheError as e:
                log.warning(
                    "engine cache: could not release the build lease of %s (%s); "
                    "it expires in at most %.0f s",
                    self.key,
                    e,
                    self.ttl_s,
                )
            self.etag = None
