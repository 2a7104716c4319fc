"""The figures of bench/gpu_rate.py from what its clients recorded (pure: unit-tested in
tests/bench/test_rate_stats.py).

A request is what a client saw of one streamed answer: when it was sent, and for every
response that carried text, when it arrived and the answer's token count so far.
- TTFT: first text response - sent. Chunk gap: between two text responses of a request.
- Inter-token latency as genai-perf defines it: (e2e - TTFT) / (output tokens - 1), one
  value per request, e2e being the last response - sent.
- Delivered tokens/s: tokens that arrived while every stream of the point was decoding
  (from the last first token to the first last token), over that window; the ramp up
  (TTFT) and down are left out, so a path that keeps up delivers what the engine makes.
  A point without such a window (streams did not overlap: requests were queued) counts
  all its tokens from the first request sent to the last token.
- The ceiling: the highest offered tokens/s among the points that met every limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The limits for a point to count toward the ceiling.
DELIVERED_FRACTION = 0.99
GAP_P99_S = 0.030
TTFT_P99_S = 0.800
MIN_WINDOW_S = 0.2  # a shorter all-decoding window is too short to count tokens in


@dataclass
class Request:
    sent: float
    arrivals: list = field(default_factory=list)  # s, each response that had text
    tokens: list = field(default_factory=list)  # cumulative output tokens at each

    def add(self, at: float, tokens: int) -> None:
        self.arrivals.append(at)
        self.tokens.append(tokens)

    @property
    def output_tokens(self) -> int:
        return self.tokens[-1] if self.tokens else 0

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def e2e(self) -> float | None:
        return self.arrivals[-1] - self.sent if self.arrivals else None

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    def itl(self) -> float | None:
        """genai-perf's inter-token latency of this request."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def tokens_by(self, moment: float) -> int:
        """Tokens that had arrived at `moment` (inclusive)."""
        count = 0
        for at, tokens in zip(self.arrivals, self.tokens, strict=True):
            if at > moment:
                break
            count = tokens
        return count


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100), linear between ranks (numpy's default); None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def delivered(requests: list[Request]) -> tuple[float, str]:
    """(delivered tokens/s, how it was counted: "window" or "whole")."""
    answered = [r for r in requests if r.arrivals]
    if not answered:
        return 0.0, "whole"
    start = max(r.arrivals[0] for r in answered)
    end = min(r.arrivals[-1] for r in answered)
    if end - start >= MIN_WINDOW_S and len(answered) == len(requests):
        tokens = sum(r.tokens_by(end) - r.tokens_by(start) for r in answered)
        return tokens / (end - start), "window"
    span = max(r.arrivals[-1] for r in answered) - min(r.sent for r in requests)
    return sum(r.output_tokens for r in answered) / span if span > 0 else 0.0, "whole"


def summarize(requests: list[Request], offered: float, errors: int = 0) -> dict:
    """One load point's figures (seconds)."""
    ttfts = [r.ttft for r in requests if r.ttft is not None]
    gaps = [g for r in requests for g in r.gaps()]
    itls = [v for r in requests if (v := r.itl()) is not None]
    rate, counted = delivered(requests)
    return {
        "offered_tokens_per_s": offered,
        "delivered_tokens_per_s": rate,
        "delivered_counted": counted,
        "requests": len(requests),
        "errors": errors,
        "tokens": sum(r.output_tokens for r in requests),
        "chunks": sum(len(r.arrivals) for r in requests),
        # above 1: the path fell behind and tokens merged into fewer responses
        "tokens_per_chunk": (
            sum(r.output_tokens for r in requests) / max(1, sum(len(r.arrivals) for r in requests))
        ),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "gap_p50_s": percentile(gaps, 50),
        "gap_p99_s": percentile(gaps, 99),
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
    }


def meets(point: dict, engine_gap_s: float = 0.0) -> bool:
    """Whether a point met every limit. engine_gap_s: the engine's own time between a
    stream's tokens, allowed on top of GAP_P99_S (at 20 tokens/s per stream the engine
    alone leaves 50 ms between tokens, so no path could meet 30 ms there); pass 0 for
    the issue's literal limit."""
    if point["errors"] or point["gap_p99_s"] is None or point["ttft_p99_s"] is None:
        return False
    return (
        point["delivered_tokens_per_s"] >= DELIVERED_FRACTION * point["offered_tokens_per_s"]
        and point["gap_p99_s"] <= GAP_P99_S + engine_gap_s
        and point["ttft_p99_s"] <= TTFT_P99_S
    )


def ceiling(points: list[dict], literal: bool = False) -> float | None:
    """The highest offered tokens/s of a point that met the limits; None if none did.
    Each point carries `tokens_per_stream_s` (the engine's pace for its streams)."""
    met = [
        p["offered_tokens_per_s"]
        for p in points
        if meets(p, 0.0 if literal else 1.0 / p["tokens_per_stream_s"])
    ]
    return max(met) if met else None


def cpu_ms_per_1000_tokens(before: dict, after: dict, tokens: int) -> dict:
    """CPU ms per 1,000 delivered tokens of each process (CPU seconds by name)."""
    if tokens <= 0:
        return {}
    return {name: (after[name] - before[name]) * 1e6 / tokens for name in after if name in before}
