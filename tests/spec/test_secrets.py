"""Secrets in URL forms: refused in the spec and on the command line without being
echoed, never copied into Kubernetes manifests, and masked by the project's one
`redact` wherever a line is printed or logged."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import yaml

from builder.spec import SpecError, parse_spec
from engine_cache.redact import redact
from tests.helpers import hostile_specs as hs

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-Sekr1t"
BASE = {
    "models": [{"name": "llm", "engine": "vllm", "model": "/m/llm"}],
    "router": {"default": ["llm"]},
}
PRESIGNED = (
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20260101"
    f"&X-Amz-Signature={SECRET}"
)


def refused(data: dict, field: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "t.yaml")
    message = str(caught.value)
    assert message.startswith(f"t.yaml: {field}: "), message
    assert SECRET not in message and "AKIAEXAMPLE" not in message, message
    return message


@pytest.mark.parametrize(
    "url",
    [
        f"redis://cache:6379/0?password={SECRET}",
        f"redis://cache:6379/{SECRET}",  # a password where the db number goes
        f"redis://cache:6379#{SECRET}",
        f"redis://:{SECRET}@cache:6379/0",
        f"redis://user:ab/{SECRET}@cache:6379",  # a secret holding "/"
    ],
)
def test_a_redis_url_with_a_secret_is_refused_without_echo(url):
    data = {**BASE, "tenants": {"redis": url}}
    refused(data, "tenants.redis")


def test_a_password_pasted_into_password_env_is_not_echoed():
    data = {**BASE, "tenants": {"redis": "redis://cache:6379/0", "password_env": f"{SECRET}!"}}
    assert "environment variable name" in refused(data, "tenants.password_env")


@pytest.mark.parametrize(
    "key, url",
    [
        ("s3", f"s3://bucket/engines{PRESIGNED}"),
        ("s3", f"s3://bucket/engines#{SECRET}"),
        ("s3", f"s3://AKIAEXAMPLE:abc/{SECRET}@bucket/engines"),
        ("s3", f"s3://akiaexample:abc/{SECRET}@bucket"),
        ("endpoint_url", f"https://s3.example.com/{PRESIGNED}"),
        ("endpoint_url", f"https://s3.example.com/?token={SECRET}"),
        ("endpoint_url", f"https://AKIAEXAMPLE:abc/{SECRET}@s3.example.com"),
    ],
)
def test_a_credential_bearing_cache_url_is_refused_without_echo(key, url):
    refused({**BASE, "engine_cache": {key: url}}, f"engine_cache.{key}")


def test_a_presigned_url_never_reaches_the_k8s_configmap(tmp_path):
    data = copy.deepcopy(BASE)
    data["engine_cache"] = {"s3": f"s3://bucket/engines{PRESIGNED}"}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    code, stderr = hs.call_cli(["k8s", "--spec", str(spec), "--out", str(tmp_path / "k8s")])
    assert code == 2 and SECRET not in stderr and "engine_cache.s3" in stderr
    assert not (tmp_path / "k8s").exists()


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://bucket/engines?token={SECRET}",
        f"s3://bucket/engines#{SECRET}",
        f"s3://KEY:abc/{SECRET}@bucket/engines",
    ],
)
def test_cache_ls_refuses_a_credential_bearing_uri_without_echo(tmp_path, uri):
    code, stderr = hs.call_cli(
        ["cache", "ls", "--cache", uri, "--local-cache", str(tmp_path / "local")]
    )
    assert code == 2, stderr
    assert SECRET not in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "text, gone, kept",
    [
        (f"redis://cache:6379/0?password={SECRET}", SECRET, "redis://cache:6379/0?***"),
        (f"redis://cache:6379/{SECRET} down", SECRET, "redis://cache:6379/*** down"),
        ("redis://cache:6379/0 is up", None, "redis://cache:6379/0 is up"),
        (f"http://h/x#{SECRET}", SECRET, "http://h/x#***"),
        (f"s3://b/p{PRESIGNED} failed", SECRET, "s3://b/p?*** failed"),
        (f"s3://KEY:abc/{SECRET}@bucket/p", SECRET, "s3://***@bucket/p"),
        (f"GET https://h/?token={SECRET}", SECRET, "https://h/?***"),
        (f"password: {SECRET}", SECRET, "password: ***"),
        ("s3://bucket/prefix and nothing else", None, "s3://bucket/prefix and nothing else"),
    ],
)
def test_one_redact_masks_every_url_form(text, gone, kept):
    masked = redact(text, environ={})
    assert kept in masked
    assert gone is None or gone not in masked


def test_cli_error_lines_go_through_redact(monkeypatch, capsys):
    from builder.cli import main as cli

    monkeypatch.setattr(cli, "cli", _raising(f"bad http://u:{SECRET}@h/x?sig={SECRET}"))
    assert cli.main([]) == 1
    err = capsys.readouterr().err
    assert SECRET not in err and "http://***@h/x?***" in err


def _raising(message: str):
    from builder.errors import TridentError

    class Raises:
        def main(self, **_kw):
            raise TridentError(message)

    return Raises()


def test_there_is_one_redact_in_the_project():
    found = []
    for package in ("builder", "engine_cache", "bls", "python_backends"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            found += [
                f"{path.relative_to(ROOT)}:{node.name}"
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and "redact" in node.name
            ]
    assert found == ["engine_cache/redact.py:redact"]


@pytest.mark.parametrize(
    "line",
    [
        "t.yaml: tenants.password_env: must be an environment variable name",
        "t.yaml: tenants.default.tokens_per_minute: must be >= 1, got 0",
        "t.yaml: models[0].engine_args.tokenizer: expected a string, got 7",
        "t.yaml: tenants.password_file: give password_env or password_file, not both",
    ],
)
def test_redact_leaves_field_names_in_error_lines_alone(line):
    assert redact(line, environ={}) == line


@pytest.mark.parametrize(
    "text",
    [
        f"token={SECRET}",
        f"HF_TOKEN: {SECRET}",
        f"aws_secret_access_key = '{SECRET}'",
        f"redis password:{SECRET}",
    ],
)
def test_redact_masks_assignments_of_credentials(text):
    assert SECRET not in redact(text, environ={})
