"""Where the S3 tier lives: the one s3:// URI parser of the project, and the endpoint URL.

Neither may carry credentials: they would end up in logs, specs under version control and
error messages. Credentials come from the standard AWS chain instead. The rules are
engine_cache/urls.py's, which the spec reads too."""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine_cache.errors import CacheError
from engine_cache.redact import host_of
from engine_cache.urls import AWS_CREDENTIALS_HINT, endpoint_url_problem, s3_uri_problem


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def object_key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_s3_uri(uri: str, what: str = "cache location") -> S3Location:
    """s3://bucket[/prefix] -> S3Location; `what` names the setting in error messages."""
    problem = s3_uri_problem(uri)
    if problem:
        # A credential problem (the hint says so) is told without the URI: its host at
        # most. Any other shows the URI (CacheError still redacts what looks secret).
        shown = (
            host_of(uri)
            if isinstance(uri, str) and "@" in uri
            else ("s3://..." if AWS_CREDENTIALS_HINT in problem else repr(uri))
        )
        raise CacheError(f"{what} {shown} {problem}", 2)
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return S3Location(bucket, prefix.strip("/"))


def resolve_endpoint(endpoint_url: str | None) -> str | None:
    """The explicit endpoint, else the standard AWS_ENDPOINT_URL(_S3) variables; checked."""
    endpoint = (
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    if endpoint is not None:
        check_endpoint_url(endpoint)
    return endpoint


def check_endpoint_url(url: str) -> None:
    """An http(s)://host[:port] URL without credentials (botocore would echo a bad one)."""
    problem = endpoint_url_problem(url)
    if problem:
        shown = host_of(url) if AWS_CREDENTIALS_HINT in problem else repr(url)
        raise CacheError(f"S3 endpoint URL {shown} {problem}", 2)
