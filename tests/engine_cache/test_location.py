"""The one s3:// URI parser and the endpoint URL: no credentials in either, and no secret
in any error message (ours or botocore's)."""

from __future__ import annotations

import botocore.exceptions
import pytest

from engine_cache import CacheError, EngineCache, S3Location, parse_s3_uri
from engine_cache.errors import redact
from engine_cache.s3_client import S3Client

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://bucket/engines", S3Location("bucket", "engines")),
        ("s3://bucket/a/b/", S3Location("bucket", "a/b")),
        ("s3://bucket", S3Location("bucket", "")),
        ("s3://bucket/", S3Location("bucket", "")),
    ],
)
def test_parse_s3_uri(uri, expected):
    assert parse_s3_uri(uri) == expected
    assert expected.object_key("k", "manifest.json") == "/".join(
        p for p in (expected.prefix, "k", "manifest.json") if p
    )


@pytest.mark.parametrize(
    "uri, words",
    [
        ("http://bucket/engines", "not an s3://bucket\\[/prefix\\] URI"),
        ("s3://", "names no bucket"),
        ("s3:///engines", "names no bucket"),
        (None, "not an s3://bucket\\[/prefix\\] URI"),
    ],
)
def test_bad_s3_uri_is_bad_input(uri, words):
    with pytest.raises(CacheError, match=words) as e:
        parse_s3_uri(uri)
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://AKIAEXAMPLE:{SECRET}@bucket/engines",
        f"s3://{SECRET}@bucket/engines",
        "s3://AKIAEXAMPLE:abc/defghijkl@bucket/engines",  # a secret with a "/"
        f"http://AKIAEXAMPLE:{SECRET}@bucket/engines",
    ],
)
def test_credentials_in_the_uri_are_refused_without_echo(uri):
    with pytest.raises(CacheError) as e:
        parse_s3_uri(uri, "checkpoint")
    message = str(e.value)
    assert e.value.exit_code == 2 and message.startswith("checkpoint ")
    assert SECRET not in message and "abc/defghijkl" not in message
    assert "AKIAEXAMPLE" not in message
    if uri.startswith("s3://"):
        assert "contains credentials" in message and "AWS_SECRET_ACCESS_KEY" in message


@pytest.mark.parametrize(
    "endpoint",
    [
        f"http://AKIAEXAMPLE:{SECRET}@127.0.0.1:8333",
        f"https://AKIAEXAMPLE:{SECRET}@s3.example.com/",
        "http://AKIAEXAMPLE:abc/defghijkl@127.0.0.1:8333",
    ],
)
def test_credentials_in_the_endpoint_are_refused_without_echo(tmp_path, endpoint):
    with pytest.raises(
        CacheError,
        match="contains credentials; credentials go in the standard AWS environment variables",
    ) as e:
        EngineCache(tmp_path, "s3://bucket/engines", endpoint_url=endpoint)
    assert e.value.exit_code == 2
    assert SECRET not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)
    assert "defghijkl" not in str(e.value)


def test_credentials_in_the_endpoint_variable_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://key:{SECRET}@127.0.0.1:8333")
    with pytest.raises(CacheError, match="http://127.0.0.1:8333 contains credentials") as e:
        EngineCache(tmp_path, "s3://bucket/engines")
    assert SECRET not in str(e.value)


@pytest.mark.parametrize("endpoint", ["ftp://host", "127.0.0.1:8333", "http://host:port"])
def test_a_malformed_endpoint_is_bad_input(tmp_path, endpoint):
    with pytest.raises(CacheError, match="not an http\\(s\\)://host\\[:port\\] URL") as e:
        EngineCache(tmp_path, "s3://bucket/engines", endpoint_url=endpoint)
    assert e.value.exit_code == 2


def test_no_cache_error_carries_a_secret(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    message = str(CacheError(f"S3 said: signature of {SECRET} at http://k:{SECRET}@h/x"))
    assert SECRET not in message and "http://***@h/x" in message
    assert (
        redact("s3://bucket/engines and short values", ("abc",))
        == "s3://bucket/engines and short values"
    )


def test_botocore_messages_lose_a_secret_from_a_profile(tmp_path, monkeypatch):
    """A secret read from a credentials file (not the environment) is hidden as well."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = {SECRET}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    client = S3Client("http://127.0.0.1:9")
    with pytest.raises(CacheError) as e, client.call("reading s3://bucket/x"):
        raise botocore.exceptions.ParamValidationError(report=f"bad value {SECRET}")
    assert SECRET not in str(e.value) and "bad value ***" in str(e.value)
