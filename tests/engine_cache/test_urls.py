"""engine_cache/urls.py, the one check of each URL a user gives trident: what it accepts,
the reason it gives for what it refuses, that the reason never repeats a credential, and
that each pattern (the JSON Schema's) accepts exactly what its check accepts."""

from __future__ import annotations

import re

import pytest

from engine_cache import CacheError, parse_s3_uri
from engine_cache.location import check_endpoint_url
from engine_cache.urls import (
    ENDPOINT_URL,
    REDIS_URL,
    S3_URI,
    endpoint_url_problem,
    redis_url_problem,
    s3_uri_problem,
)

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"

S3_CASES = [
    ("s3://bucket/engines", None),
    ("s3://trident-test-0/engines/", None),
    ("s3://a.b-c", None),
    ("s3://", "names no bucket"),
    ("s3:///engines", "names no bucket"),
    ("http://bucket/x", "is not an s3://bucket[/prefix] URI"),
    ("s3://Bucket/x", "a bucket is 3-63 lower-case letters"),
    ("s3://my_bucket/x", "a bucket is 3-63 lower-case letters"),
    ("s3://ab/x", "a bucket is 3-63 lower-case letters"),
    ("s3://-bucket/x", "a bucket is 3-63 lower-case letters"),
    ("s3://bucket/a b", "a bucket is 3-63 lower-case letters"),
    (f"s3://AKIAEXAMPLE:{SECRET}@bucket/x", "contains credentials; credentials go in"),
    ("s3://key:secret/x", "contains credentials"),
    (f"s3://bucket/x?X-Amz-Signature={SECRET}", "contains a query string"),
    (f"s3://bucket/x#{SECRET}", "contains a fragment"),
]
ENDPOINT_CASES = [
    ("http://127.0.0.1:8333", None),
    ("https://s3.example.com/", None),
    ("http://[::1]:8333/path", None),
    ("http://minio_s3:9000", None),
    ("ftp://host", "is not an http(s)://host[:port] URL"),
    ("127.0.0.1:8333", "is not an http(s)://host[:port] URL"),
    ("http://host:port", "is not an http(s)://host[:port] URL"),
    ("http://host:0", "port 0 is not in 1..65535"),
    ("http://host:99999/x", "port 99999 is not in 1..65535"),
    (f"https://AKIAEXAMPLE:{SECRET}@s3.example.com", "contains credentials"),
    (f"https://s3.example.com/?token={SECRET}", "contains a query string"),
]
REDIS_CASES = [
    ("redis://cache:6379/0", None),
    ("rediss://cache", None),
    ("redis://[::1]:6379/15", None),
    ("redis://cache:6379/", None),
    ("http://cache:6379", "is not a redis://host[:port][/db] URL"),
    ("redis://cache:99999", "port 99999 is not in 1..65535"),
    ("redis://cache:0", "port 0 is not in 1..65535"),
    ("redis://[::1]:70000/0", "port 70000 is not in 1..65535"),
    (f"redis://cache:6379/{SECRET}", "the db (after the host's '/') is not a number"),
    ("redis://cache:6379/100", "the db (after the host's '/') is not a number"),
    ("redis://cache:hunter2/0", "is not a redis://host[:port][/db] URL"),
    ("redis://cache:123456789012/0", "the port is not in 1..65535"),
    (f"redis://:{SECRET}@cache:6379/0", "must not hold a password (user:secret@)"),
    (f"redis://cache:6379/0?password={SECRET}", "contains a query string"),
]


def _check(problem_of, pattern, url, expected):
    problem = problem_of(url)
    if expected is None:
        assert problem is None, problem
    else:
        assert problem is not None and expected in problem, problem
        assert SECRET not in problem and "AKIAEXAMPLE" not in problem
        assert "123456789012" not in problem and "hunter2" not in problem
    # The schema's pattern and the parser's check: one verdict.
    assert (re.fullmatch(pattern, url) is not None) == (problem is None)


@pytest.mark.parametrize("url, expected", S3_CASES)
def test_s3_uris(url, expected):
    _check(s3_uri_problem, S3_URI, url, expected)


@pytest.mark.parametrize("url, expected", ENDPOINT_CASES)
def test_endpoint_urls(url, expected):
    _check(endpoint_url_problem, ENDPOINT_URL, url, expected)


@pytest.mark.parametrize("url, expected", REDIS_CASES)
def test_redis_urls(url, expected):
    _check(redis_url_problem, REDIS_URL, url, expected)


@pytest.mark.parametrize("uri", ["s3://Bucket/x", "s3://my_bucket/x", "s3://ab/x"])
def test_the_cache_refuses_a_bucket_the_spec_refuses(uri):
    """Before, `trident engines --s3` and a checkpoint's s3:// path took any bucket
    name while the spec's engine_cache.s3 took S3's naming rule only."""
    with pytest.raises(CacheError, match="a bucket is 3-63 lower-case letters") as e:
        parse_s3_uri(uri, "checkpoint")
    assert e.value.exit_code == 2 and str(e.value).startswith(f"checkpoint {uri!r} ")


def test_the_cache_refuses_an_endpoint_port_out_of_range():
    with pytest.raises(CacheError, match="port 70000 is not in 1..65535"):
        check_endpoint_url("http://127.0.0.1:70000")
