"""trident_common.log: Triton's logger inside a stub, the logging module elsewhere."""

from __future__ import annotations

import logging

from trident_common import log as log_mod
from trident_common.log import Log


class TritonLogger:
    """pb_utils.Logger's interface: one static method per level."""

    def __init__(self, broken=False):
        self.lines, self.broken = [], broken

    def _write(self, level, line):
        if self.broken:
            raise RuntimeError("stub IPC closed")
        self.lines.append((level, line))

    def log_info(self, line):
        self._write("info", line)

    def log_warn(self, line):
        self._write("warn", line)

    def log_error(self, line):
        self._write("error", line)

    def log_verbose(self, line):
        self._write("verbose", line)


def test_in_a_stub_lines_go_to_tritons_log_tagged():
    triton = TritonLogger()
    log = Log("vllm", triton)
    log.info("Cancelling the request r-1")
    log.warning("w")
    log.error("e")
    log.verbose("v")
    assert triton.lines == [
        ("info", "[vllm] Cancelling the request r-1"),
        ("warn", "[vllm] w"),
        ("error", "[vllm] e"),
        ("verbose", "[vllm] v"),
    ]


def test_outside_a_stub_lines_go_to_the_logging_module(caplog, monkeypatch):
    monkeypatch.setattr(log_mod, "pb_utils", None)
    with caplog.at_level(logging.DEBUG, logger="trident"):
        log = Log("router")
        log.info("ready")
        log.error("broken")
        log.verbose("detail")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("trident.router", logging.INFO, "[router] ready"),
        ("trident.router", logging.ERROR, "[router] broken"),
        ("trident.router", logging.DEBUG, "[router] detail"),
    ]


def test_a_stub_module_without_a_logger_falls_back(caplog, monkeypatch):
    monkeypatch.setattr(log_mod, "pb_utils", object())  # e.g. a test double of pb_utils
    with caplog.at_level(logging.INFO, logger="trident"):
        Log("sglang").warning("fallback")
    assert [r.getMessage() for r in caplog.records] == ["[sglang] fallback"]


def test_a_failing_triton_logger_never_fails_the_caller(caplog):
    with caplog.at_level(logging.INFO, logger="trident"):
        Log("vllm", TritonLogger(broken=True)).error("engine died")
    assert [r.getMessage() for r in caplog.records] == ["[vllm] engine died"]


def test_a_real_stub_logger_is_found_on_its_own(monkeypatch):
    triton = TritonLogger()
    monkeypatch.setattr(log_mod, "pb_utils", type("pb", (), {"Logger": triton}))
    Log("vllm").info("hello")
    assert triton.lines == [("info", "[vllm] hello")]
