"""What the local and the S3 tier have in common, so that EngineCache lists, verifies and
collects garbage in both with the same code (like sccache's storage trait).

Writing is not here: the local tier commits a staged directory by one rename, the S3 tier
publishes (upload, check, conditional manifest) and fetches (verified download); those
differ in kind and stay on each class."""

from __future__ import annotations

from typing import Protocol

from engine_cache.manifest import Manifest


class Tier(Protocol):
    name: str  # "local" or "s3": the label in entries() and verify() reports

    def keys(self) -> list[str]:
        """The keys of the entries in the tier (those with a manifest), sorted."""

    def has_entry(self, key: str) -> bool: ...

    def read_manifest(self, key: str) -> Manifest | None:
        """None when absent; raises CorruptEntry when present but unusable."""

    def verify(self, key: str) -> list[str]:
        """The problems of an entry (none when absent); a damaged one is quarantined."""

    def quarantine(self, key: str, problems: list[str]) -> None:
        """Hide a damaged entry at once, keeping it and the reason for inspection."""

    def last_used(self, key: str) -> float:
        """The time gc orders by (the S3 tier only knows when an entry was created)."""

    def remove(self, key: str) -> bool:
        """Delete an entry; False when it was not there."""

    def remove_abandoned(self) -> list[str]:
        """Delete what writers killed half-way left behind; returns what was removed."""
