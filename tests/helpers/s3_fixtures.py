"""pytest fixtures around a real SeaweedFS S3 server (`s3_server`, `s3_bucket`),
registered for every test module by tests/conftest.py."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from support.s3_server import SeaweedS3

_bucket_numbers = itertools.count()


@dataclass(frozen=True)
class S3Bucket:
    server: SeaweedS3
    name: str

    @property
    def uri(self) -> str:
        return f"s3://{self.name}/engines"

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def client(self):
        return self.server.client()

    def keys(self) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.name)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One SeaweedFS per test session (~1 s to start)."""
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket, with the credentials in the standard AWS environment variables."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = S3Bucket(s3_server, f"trident-test-{next(_bucket_numbers)}")
    s3_server.client().create_bucket(Bucket=bucket.name)
    return bucket
