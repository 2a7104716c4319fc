"""The spec's `engine_cache:` section: where TensorRT-LLM engines are kept (a local tier,
an optional S3 tier) and the Kubernetes Secret with the S3 credentials.

Every rule here is written once, on the fields (builder/spec/rules.py), and read by both
the parser and the JSON Schema, so `trident schema` and `trident repo` agree. No value is
echoed in an error: one that fails a check may be a credential, and an accepted one is
copied into the Kubernetes ConfigMap with the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from builder.spec.node import _Node
from builder.spec.rules import rule, rule_of
from engine_cache.urls import ENDPOINT_URL, S3_URI, endpoint_url_problem, s3_uri_problem

# A DNS-1123 subdomain: what Kubernetes accepts as a Secret's name (patterns are read as
# ECMA-262 by editors too: `(?![\s\S])`, not `\Z`, ends the text).
K8S_NAME = (
    r"(?=[\s\S]{1,253}(?![\s\S]))[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


@dataclass(frozen=True)
class EngineCacheSpec:
    local_dir: str = "~/.cache/trident/engines"
    # The URLs are checked by engine_cache/urls.py (the check the cache itself applies),
    # whose patterns the schema states.
    s3: str | None = field(default=None, metadata=rule(pattern=S3_URI))  # s3://bucket/prefix
    endpoint_url: str | None = field(default=None, metadata=rule(pattern=ENDPOINT_URL))
    local_only: bool = False  # when S3 is unreachable, carry on with the local tier
    # Kubernetes: the Secret holding AWS_* for the S3 cache (a name only, never a value).
    credentials_secret: str | None = field(default=None, metadata=rule(pattern=K8S_NAME))


def parse_engine_cache(node: _Node) -> EngineCacheSpec:
    local_dir = node.field(EngineCacheSpec, "local_dir")
    s3 = node.get("s3", str, None)
    endpoint = node.get("endpoint_url", str, None)
    # The one check of each URL (engine_cache/urls.py), as the cache itself applies it.
    for key, url, problem_of in (
        ("s3", s3, s3_uri_problem),
        ("endpoint_url", endpoint, endpoint_url_problem),
    ):
        problem = url is not None and problem_of(url)
        if problem:
            raise node.error(problem, key)
    local_only = node.field(EngineCacheSpec, "local_only")
    secret = node.get("credentials_secret", str, None)
    if secret is not None and not rule_of(EngineCacheSpec, "credentials_secret").matches(secret):
        raise node.error(
            f"{secret!r} is not a Kubernetes Secret name (lower-case letters, "
            "digits, '-' and '.', at most 253 characters)",
            "credentials_secret",
        )
    node.done()
    return EngineCacheSpec(local_dir, s3, endpoint, local_only, secret)
