"""bench/aiperf_results.py: AIPerf's command, its export read back (a real export,
captured from `python -m bench.aiperf_point`, trimmed to a few metrics), the in-house
client's figures by AIPerf's definitions, and the comparison rows. AIPerf itself never
runs here: the suite does not depend on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.aiperf_results import (
    AIPerfUnavailable,
    aiperf_command,
    aiperf_figures,
    compare_rows,
    failure_line,
    find_export,
    inhouse_figures,
)
from bench.rate_stats import Request

# AIPerf 0.13.0's profile_export_aiperf.json (schema 1.4) from the 20:25 UTC run of
# 2026-12-01 (docs/performance.md), its other 50 metrics and the run's config left out.
FIXTURE = Path(__file__).parent / "fixtures" / "profile_export_aiperf.json"
# what that run's log table printed for it
EXPECTED = {
    "ttft_p50_ms": 134.990315,
    "ttft_p99_ms": 166.050679,
    "itl_p50_ms": 20.039186,
    "itl_p99_ms": 20.999779,
    "output_tokens_per_s": 745.285792,
}


def export() -> dict:
    return json.loads(FIXTURE.read_text())


def test_reads_ttft_itl_and_throughput_from_a_real_export():
    figures = aiperf_figures(export())
    assert figures["ttft_p50_ms"] == pytest.approx(EXPECTED["ttft_p50_ms"])
    assert figures["ttft_p99_ms"] == pytest.approx(EXPECTED["ttft_p99_ms"])
    assert figures["itl_p50_ms"] == pytest.approx(EXPECTED["itl_p50_ms"])
    assert figures["itl_p99_ms"] == pytest.approx(EXPECTED["itl_p99_ms"])
    assert figures["output_tokens_per_s"] == pytest.approx(EXPECTED["output_tokens_per_s"])
    assert figures["output_tokens_per_request"] == 128  # the server's count, as asked
    assert (figures["requests"], figures["errors"]) == (48, 0)


def test_times_in_seconds_are_read_as_milliseconds():
    data = export()
    ttft = data["time_to_first_token"]
    data["time_to_first_token"] = {**ttft, "unit": "s", "p50": ttft["p50"] / 1000}
    assert aiperf_figures(data)["ttft_p50_ms"] == pytest.approx(EXPECTED["ttft_p50_ms"])


def test_a_missing_figure_is_named():
    data = export()
    del data["inter_token_latency"]
    with pytest.raises(AIPerfUnavailable, match="inter_token_latency.p50"):
        aiperf_figures(data)


def test_the_export_is_found_one_folder_down_or_its_absence_said(tmp_path):
    with pytest.raises(AIPerfUnavailable, match="no profile_export_aiperf.json"):
        find_export(tmp_path)
    nested = tmp_path / "router-openai-completions-concurrency16"
    nested.mkdir()
    (nested / "profile_export_aiperf.json").write_text("{}")
    assert find_export(tmp_path) == nested / "profile_export_aiperf.json"


def _steady(sent: float, ttft: float, gap: float, tokens: int) -> Request:
    request = Request(sent)
    for i in range(tokens):
        request.add(sent + ttft + i * gap, i + 1)
    return request


def test_inhouse_figures_follow_aiperfs_definitions():
    # two lanes, two requests each; 11 tokens 20 ms apart after a 100 ms first token:
    # ITL (e2e - TTFT) / (tokens - 1) = 20 ms; 44 tokens from 0 to 0.6 + 0.1 + 0.2
    requests = [
        _steady(0.0, 0.1, 0.02, 11),
        _steady(0.0, 0.1, 0.02, 11),
        _steady(0.6, 0.1, 0.02, 11),
        _steady(0.6, 0.1, 0.02, 11),
    ]
    figures = inhouse_figures(requests, errors=1)
    assert figures["ttft_p50_ms"] == pytest.approx(100)
    assert figures["itl_p50_ms"] == pytest.approx(20)
    assert figures["itl_p99_ms"] == pytest.approx(20)
    assert figures["output_tokens_per_s"] == pytest.approx(44 / 0.9)
    assert (figures["requests"], figures["errors"]) == (4, 1)


def test_command_asks_for_exactly_the_point():
    command = aiperf_command(
        Path("/v/bin/aiperf"),
        "http://127.0.0.1:9",
        "router",
        "trident-local/smollm2",
        Path("/tmp/a"),
        streams=16,
        requests=48,
        tokens=128,
        input_tokens=32,
    )
    pairs = dict(zip(command, command[1:], strict=False))
    assert command[:2] == ["/v/bin/aiperf", "profile"]
    assert (pairs["--endpoint-type"], pairs["--concurrency"], pairs["--request-count"]) == (
        "completions",
        "16",
        "48",
    )
    assert (pairs["--output-tokens-mean"], pairs["--output-tokens-stddev"]) == ("128", "0")
    assert json.loads(pairs["--extra-inputs"])["ignore_eos"] is True
    for flag in ("--streaming", "--use-server-token-count", "--use-legacy-max-tokens"):
        assert flag in command


def test_failure_line_gives_the_cause_not_its_consequences():
    log = "\n".join(
        [
            "19:34:32.508 INFO     Starting AIPerf System (_single_run.py:81)",
            '19:34:34.232 ERROR    Dataset configuration failed: TokenizerError("Failed to load '
            "tokenizer '/m': HFValidationError: Repo id must be in the form 'repo_name'\")",
            "19:34:34.237 ERROR    Error running Hook(func=<bound method ...>)",
            "│    Cause: LifecycleOperationError(\"Failed to perform operation 'Configure",
        ]
    )
    assert failure_line(log).startswith("Dataset configuration failed: TokenizerError")
    assert failure_line("a\nValueError: bad\nbye") == "ValueError: bad"
    assert failure_line("") == "(no output)"


def test_rows_judge_each_figure_by_its_margin_and_report_the_drift():
    before = {
        "ttft_p50_ms": 100.0,
        "ttft_p99_ms": 150.0,
        "itl_p50_ms": 20.0,
        "itl_p99_ms": 21.0,
        "output_tokens_per_s": 800.0,
    }
    aiperf = {**before, "ttft_p50_ms": 120.0, "itl_p99_ms": 23.0}
    rows = {r["metric"]: r for r in compare_rows(before, aiperf, before)}
    assert rows["ttft_p50_ms: AIPerf vs in-house"]["met"] is True  # 1.2x, within 25%
    assert rows["itl_p99_ms: AIPerf vs in-house"]["met"] is False  # 1.095x, past 5%
    assert rows["output_tokens_per_s: AIPerf vs in-house"]["ratio"] == 1.0
    assert rows["ttft_p50_ms: in-house after vs before"]["met"] is None


def test_without_aiperf_one_row_says_why():
    rows = compare_rows({}, "no aiperf executable at /x (run `make aiperf`)", {})
    assert len(rows) == 1
    assert rows[0]["met"] is None and "no aiperf executable" in rows[0]["target"]
