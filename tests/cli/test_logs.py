"""The CLI's logging: trident's own loggers reach stderr (INFO by default, DEBUG with -v),
one line each, and nothing that looks like a secret is written."""

from __future__ import annotations

import logging

import click
import pytest

from builder.cli import logs
from builder.cli.main import cli, main

LOG = logging.getLogger("trident.engine_cache")


def _run_logging(monkeypatch, capsys, *flags: str, body=None) -> list[str]:
    def command() -> None:
        (body or _default_body)()

    monkeypatch.setitem(cli.commands, "talk", click.Command("talk", callback=command))
    assert main([*flags, "talk"]) == 0
    return capsys.readouterr().err.splitlines()


def _default_body() -> None:
    LOG.debug("looking at the lease")
    LOG.info("engine cache: abc is being built by host-1; waiting")
    LOG.warning("engine cache: S3 is unreachable; carrying on with the local tier only")


def test_info_and_warnings_reach_stderr_by_default(monkeypatch, capsys):
    lines = _run_logging(monkeypatch, capsys)
    assert lines == [
        "engine cache: abc is being built by host-1; waiting",
        "warning: engine cache: S3 is unreachable; carrying on with the local tier only",
    ]


def test_verbose_adds_debug_with_the_logger_name(monkeypatch, capsys):
    lines = _run_logging(monkeypatch, capsys, "-v")
    assert len(lines) == 3
    assert "DEBUG trident.engine_cache: looking at the lease" in lines[0]
    # the next plain run is back at INFO
    assert len(_run_logging(monkeypatch, capsys)) == 2


def test_one_handler_however_often_main_runs(monkeypatch, capsys):
    for _ in range(3):
        _run_logging(monkeypatch, capsys)
    handlers = [h for h in logging.getLogger("trident").handlers if h.get_name() == "trident-cli"]
    assert len(handlers) == 1


def test_tracebacks_only_with_verbose(monkeypatch, capsys):
    def body() -> None:
        try:
            raise ValueError("inner detail")
        except ValueError:
            LOG.exception("engine cache: upload failed")

    assert _run_logging(monkeypatch, capsys, body=body) == ["error: engine cache: upload failed"]
    assert "Traceback" in "\n".join(_run_logging(monkeypatch, capsys, "-v", body=body))


def test_secrets_never_reach_the_log(monkeypatch, capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")

    def body() -> None:
        LOG.info("using s3://bucket with key wJalrXUtnFEMI/K7MDENG")
        LOG.info("endpoint http://admin:hunter22@s3.local:8333/engines")
        LOG.info("headers: Authorization token=abc123def and hf_abcdefghijklmnop")

    text = "\n".join(_run_logging(monkeypatch, capsys, "-v", body=body))
    for secret in (
        "wJalrXUtnFEMI/K7MDENG",
        "hunter22",
        "admin:",
        "abc123def",
        "hf_abcdefghijklmnop",
    ):
        assert secret not in text
    assert "http://***@s3.local:8333/engines" in text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("password: s3cr3t!", "password: ***"),
        ("aws_access_key_id='AKIAXXXX'", "aws_access_key_id='***'"),
        ("s3://bucket/prefix and nothing else", "s3://bucket/prefix and nothing else"),
        ("key=abc12345 (a cache key, not a secret)", "key=abc12345 (a cache key, not a secret)"),
    ],
)
def test_redact(text, expected):
    assert logs.redact(text, environ={}) == expected
