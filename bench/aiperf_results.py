"""bench/aiperf_point.py's pure part: AIPerf's command line, its JSON export read into the
figures the in-house client reports, and the rows comparing the two (unit-tested in
tests/bench/test_aiperf_results.py against a real export)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import ratio_row
from bench.rate_stats import Request, percentile

EXPORT = "profile_export_aiperf.json"
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "output_tokens_per_s")


class AIPerfUnavailable(Exception):
    """AIPerf cannot run here, or did not finish: the message says why, in one line."""


def aiperf_command(
    aiperf: Path,
    url: str,
    model: str,
    tokenizer: str,
    artifacts: Path,
    *,
    streams: int,
    requests: int,
    tokens: int,
    input_tokens: int,
) -> list[str]:
    """`aiperf profile` at one point: `streams` requests always in flight, streamed
    /v1/completions, exactly `tokens` output tokens each (fixed length, ignore_eos)."""
    return [
        str(aiperf),
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        # trident's /v1/completions takes max_tokens, as OpenAI's legacy API does
        "--use-legacy-max-tokens",
        "--extra-inputs",
        json.dumps({"ignore_eos": True, "temperature": 0}),
        "--tokenizer",
        tokenizer,
        # tokens as the server counts them: the double's words are not SmolLM2 tokens
        "--use-server-token-count",
        "--concurrency",
        str(streams),
        "--request-count",
        str(requests),
        "--warmup-request-count",
        str(streams),
        "--synthetic-input-tokens-mean",
        str(input_tokens),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(tokens),
        "--output-tokens-stddev",
        "0",
        "--random-seed",
        "0",
        "--artifact-dir",
        str(artifacts),
        "--ui-type",
        "none",
        # nothing to scrape: no /metrics on the frontend, no DCGM on this machine
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]


def failure_line(log: str) -> str:
    """The line of AIPerf's output that says why it failed: the first logged at ERROR
    (the cause; what follows are its consequences), else the last line naming an error,
    else the last line; at most 300 characters, the log's time stamp left out."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    logged = [line.split(" ERROR ", 1)[1].strip() for line in lines if " ERROR " in line]
    if logged:
        return logged[0][:300]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1][:300]


def find_export(artifacts: Path) -> Path:
    """The export AIPerf wrote under `artifacts` (it may nest it one folder down)."""
    found = sorted(Path(artifacts).rglob(EXPORT))
    if not found:
        raise AIPerfUnavailable(f"aiperf wrote no {EXPORT} under {artifacts}")
    return found[0]


def aiperf_figures(export: dict) -> dict:
    """The in-house client's figures, from AIPerf's export (its times are in ms)."""

    def stat(tag: str, name: str) -> float:
        metric = export.get(tag)
        if not isinstance(metric, dict) or metric.get(name) is None:
            raise AIPerfUnavailable(f"AIPerf's export has no {tag}.{name}")
        return (
            _in_ms(metric, name)
            if metric.get("unit") not in ("tokens/sec",)
            else float(metric[name])
        )

    count = export.get("request_count", {}).get("avg")
    errors = export.get("error_request_count", {}).get("avg", 0) or 0
    return {
        "ttft_p50_ms": stat("time_to_first_token", "p50"),
        "ttft_p99_ms": stat("time_to_first_token", "p99"),
        "itl_p50_ms": stat("inter_token_latency", "p50"),
        "itl_p99_ms": stat("inter_token_latency", "p99"),
        "output_tokens_per_s": stat("output_token_throughput", "avg"),
        "output_tokens_per_request": stat("output_sequence_length", "avg"),
        "requests": int(count or 0),
        "errors": int(errors),
    }


def _in_ms(metric: dict, name: str) -> float:
    scale = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 0.001, "ns": 1e-6}
    unit = metric.get("unit", "ms")
    if unit not in scale:
        return float(metric[name])  # not a time (a count): as it is
    return float(metric[name]) * scale[unit]


def inhouse_figures(requests: list[Request], errors: int = 0) -> dict:
    """AIPerf's figures from what the in-house client recorded, by AIPerf's definitions:
    TTFT (first text response - sent); inter-token latency (e2e - TTFT) / (tokens - 1)
    per request; output tokens/s: all output tokens over the span from the first request
    sent to the last response."""
    ttfts = [r.ttft for r in requests if r.ttft is not None]
    itls = [v for r in requests if (v := r.itl()) is not None]
    answered = [r for r in requests if r.arrivals]
    tokens = sum(r.output_tokens for r in answered)
    span = (
        max(r.arrivals[-1] for r in answered) - min(r.sent for r in requests) if answered else 0.0
    )

    def ms(values, q):
        value = percentile(values, q)
        return None if value is None else value * 1000

    return {
        "ttft_p50_ms": ms(ttfts, 50),
        "ttft_p99_ms": ms(ttfts, 99),
        "itl_p50_ms": ms(itls, 50),
        "itl_p99_ms": ms(itls, 99),
        "output_tokens_per_s": tokens / span if span > 0 else 0.0,
        "output_tokens_per_request": tokens / len(answered) if answered else 0.0,
        "requests": len(requests),
        "errors": errors,
    }


# How far AIPerf may read from the in-house client for the two to agree.
MARGIN = {
    "ttft_p50_ms": 0.25,
    "ttft_p99_ms": 0.25,
    "itl_p50_ms": 0.05,
    "itl_p99_ms": 0.05,
    "output_tokens_per_s": 0.05,
}


def compare_rows(before: dict, aiperf: dict | str, after: dict) -> list[dict]:
    """One row per figure: AIPerf against the in-house client's run before it; one more
    per figure: the in-house client's run after against before (the machine's own drift,
    the yardstick for the first). `aiperf` a string: AIPerf did not run, and why."""
    if isinstance(aiperf, str):
        return [
            {
                "metric": "AIPerf vs in-house client",
                "target": f"not run: {aiperf}"[:120],
                "met": None,
            }
        ]
    rows = []
    for name in FIGURES:
        margin = MARGIN[name]
        row = ratio_row(
            f"{name}: AIPerf vs in-house", aiperf[name], before[name], f"within {margin:.0%}"
        )
        row["met"] = row["ratio"] is not None and abs(row["ratio"] - 1) <= margin
        rows.append(row)
    for name in FIGURES:
        rows.append(
            ratio_row(
                f"{name}: in-house after vs before",
                after[name],
                before[name],
                "report (the machine's drift)",
            )
        )
    return rows
