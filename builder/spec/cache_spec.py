"""The spec's `engine_cache:` section: where TensorRT-LLM engines are kept (a local tier,
an optional S3 tier) and the Kubernetes Secret with the S3 credentials.

Every rule here is written once and read by both the parser and the JSON Schema
(SCHEMA_RULES, merged by builder/spec/schema.py), so `trident schema` and `trident repo`
agree. No value is echoed in an error: one that fails a check may be a credential, and
an accepted one is copied into the Kubernetes ConfigMap with the spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from builder.spec.node import _Node, anchored
from engine_cache.redact import url_credentials

# s3://bucket[/prefix]: a bucket is 3-63 lower-case letters, digits, '.' and '-'; no
# credentials ('@'), query or fragment anywhere (engine_cache.redact.url_credentials).
S3_URI = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s@?#]*)?"
ENDPOINT_URL = r"https?://[^\s/?#@]+(/[^\s?#@]*)?"
# A DNS-1123 subdomain: what Kubernetes accepts as a Secret's name (patterns are read as
# ECMA-262 by editors too: `(?![\s\S])`, not `\Z`, ends the text).
K8S_NAME = (
    r"(?=[\s\S]{1,253}(?![\s\S]))[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
AWS_HINT = (
    "give credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile (AWS_PROFILE)"
)


@dataclass(frozen=True)
class EngineCacheSpec:
    local_dir: str = "~/.cache/trident/engines"
    s3: str | None = None  # s3://bucket/prefix
    endpoint_url: str | None = None
    local_only: bool = False  # when S3 is unreachable, carry on with the local tier
    # Kubernetes: the Secret holding AWS_* for the S3 cache (a name only, never a value).
    credentials_secret: str | None = None


SCHEMA_RULES: dict[tuple[type, str], dict[str, Any]] = {
    (EngineCacheSpec, "s3"): {"pattern": anchored(S3_URI)},
    (EngineCacheSpec, "endpoint_url"): {"pattern": anchored(ENDPOINT_URL)},
    (EngineCacheSpec, "credentials_secret"): {"pattern": anchored(K8S_NAME)},
}


def parse_engine_cache(node: _Node) -> EngineCacheSpec:
    local_dir = node.get("local_dir", str, EngineCacheSpec.local_dir)
    s3 = node.get("s3", str, None)
    endpoint = node.get("endpoint_url", str, None)
    for key, url in (("s3", s3), ("endpoint_url", endpoint)):
        problem = url is not None and url_credentials(url)
        if problem:  # said first: the format's message would not name the reason
            raise node.error(f"{problem}; {AWS_HINT}", key)
    if s3 is not None and not re.fullmatch(S3_URI, s3):
        raise node.error(
            "is not an s3://bucket[/prefix] URI (a bucket is 3-63 lower-case "
            "letters, digits, '.' and '-')",
            "s3",
        )
    if endpoint is not None and not re.fullmatch(ENDPOINT_URL, endpoint):
        raise node.error("is not an http(s)://host[:port] URL", "endpoint_url")
    local_only = node.get("local_only", bool, False)
    secret = node.get("credentials_secret", str, None)
    if secret is not None and not re.fullmatch(K8S_NAME, secret):
        raise node.error(
            f"{secret!r} is not a Kubernetes Secret name (lower-case letters, "
            "digits, '-' and '.', at most 253 characters)",
            "credentials_secret",
        )
    node.done()
    return EngineCacheSpec(local_dir, s3, endpoint, local_only, secret)
