"""Where the S3 tier lives: the one s3:// URI parser of the project, and the endpoint URL.

Neither may carry credentials: they would end up in logs, specs under version control and
error messages. Credentials come from the standard AWS chain instead."""
from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine_cache.errors import CacheError
from engine_cache.redact import host_of, url_credentials

CREDENTIALS_HINT = ("credentials go in the standard AWS environment variables "
                    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or an AWS profile (AWS_PROFILE)")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str          # no leading or trailing slash; may be empty

    def object_key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_s3_uri(uri: str, what: str = "cache location") -> S3Location:
    """s3://bucket[/prefix] -> S3Location; `what` names the setting in error messages."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise CacheError(f"{what} {uri!r} is not an s3://bucket/prefix URI", 2)
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    # KEY:SECRET@bucket (a secret may hold "/"), a presigned query, a fragment; a ":" in
    # the bucket is a credential too (never in a bucket name).
    problem = url_credentials(uri) or (":" in bucket and "contains credentials")
    if problem:
        raise CacheError(f"{what} {host_of(uri) if '@' in uri else 's3://...'} {problem}; "
                         f"{CREDENTIALS_HINT}", 2)
    if not bucket:
        raise CacheError(f"{what} {uri!r} names no bucket", 2)
    return S3Location(bucket, prefix.strip("/"))


def resolve_endpoint(endpoint_url: str | None) -> str | None:
    """The explicit endpoint, else the standard AWS_ENDPOINT_URL(_S3) variables; checked."""
    endpoint = (endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or None)
    if endpoint is not None:
        check_endpoint_url(endpoint)
    return endpoint


def check_endpoint_url(url: str) -> None:
    """An http(s)://host[:port] URL without credentials (botocore would echo a bad one)."""
    problem = url_credentials(url)
    if problem:
        raise CacheError(f"S3 endpoint URL {host_of(url)} {problem}; {CREDENTIALS_HINT}", 2)
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and parts.hostname and parts.port != 0
    except ValueError:            # a non-numeric port, unbalanced brackets
        valid = False
    if not valid:
        raise CacheError(f"S3 endpoint URL {url!r} is not an http(s)://host[:port] URL", 2)
