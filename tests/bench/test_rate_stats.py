"""bench/rate_stats.py: the figures and the ceiling of the gpu_rate benchmark."""

from __future__ import annotations

import pytest

from bench.rate_stats import (
    Request,
    ceiling,
    cpu_ms_per_1000_tokens,
    delivered,
    meets,
    percentile,
    summarize,
)


def steady(sent: float, ttft: float, gap: float, tokens: int, per_chunk: int = 1) -> Request:
    """A request whose chunks of `per_chunk` tokens come every gap * per_chunk s."""
    request = Request(sent)
    at, count = sent + ttft, 0
    while count < tokens:
        count = min(tokens, count + per_chunk)
        request.add(at, count)
        at += gap * per_chunk
    return request


def test_percentile_is_linear_between_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(range(101), 99) == 99
    assert percentile([0, 10], 99) == pytest.approx(9.9)


def test_itl_is_genai_perfs():
    # 5 tokens, first at 0.1 s, last at 0.5 s: (0.5 - 0.1) / 4
    request = steady(0.0, 0.1, 0.1, 5)
    assert request.ttft == pytest.approx(0.1) and request.e2e == pytest.approx(0.5)
    assert request.itl() == pytest.approx(0.1)
    # merged chunks change the gaps, not the ITL
    merged = steady(0.0, 0.1, 0.1, 5, per_chunk=2)
    assert merged.gaps() == pytest.approx([0.2, 0.2])
    assert merged.itl() == pytest.approx((0.5 - 0.1) / 4)
    assert steady(0.0, 0.1, 0.1, 1).itl() is None


def test_delivered_counts_the_window_where_every_stream_decodes():
    # 4 streams at 100 tokens/s, 256 tokens, TTFT 50 ms: the ramp is left out, so a
    # path that keeps up delivers exactly the engine's 400 tokens/s
    requests = [steady(0.0, 0.05, 0.01, 256) for _ in range(4)]
    rate, counted = delivered(requests)
    assert counted == "window" and rate == pytest.approx(400, rel=0.01)
    # the whole span (with the TTFT) would read less: 1024 / 2.6 s
    assert 1024 / requests[0].e2e < 0.99 * 400


def test_delivered_without_overlap_counts_the_whole_span():
    # two requests one after the other (queued): no window where both decode
    requests = [steady(0.0, 0.05, 0.01, 100), steady(0.0, 1.1, 0.01, 100)]
    rate, counted = delivered(requests)
    assert counted == "whole"
    assert rate == pytest.approx(200 / requests[1].e2e)


def test_a_lagging_path_delivers_less_than_offered():
    # the engine offers 100 tokens/s per stream; the path delivers a token every 12 ms
    point = summarize([steady(0.0, 0.05, 0.012, 256) for _ in range(8)], offered=800)
    assert point["delivered_tokens_per_s"] == pytest.approx(8 / 0.012, rel=0.01)
    assert not meets({**point, "tokens_per_stream_s": 100}, 0.01)


def _point(offered, rate, delivered_fraction=1.0, gap_p99=0.01, ttft_p99=0.1, errors=0):
    return {
        "offered_tokens_per_s": offered,
        "tokens_per_stream_s": rate,
        "delivered_tokens_per_s": offered * delivered_fraction,
        "gap_p99_s": gap_p99,
        "ttft_p99_s": ttft_p99,
        "errors": errors,
    }


def test_ceiling_is_the_highest_offered_load_that_met_every_limit():
    points = [
        _point(1600, 100),
        _point(3200, 50),
        _point(6400, 100, delivered_fraction=0.98),  # fell behind
        _point(5120, 20, ttft_p99=0.9),  # TTFT too long
        _point(4000, 50, gap_p99=0.051),  # gap over 30 + 20 ms
        _point(4800, 100, errors=1),
    ]  # a request failed
    assert ceiling(points) == 3200
    assert ceiling([_point(100, 100, delivered_fraction=0.5)]) is None


def test_the_engines_own_gap_is_allowed_unless_literal():
    # 20 tokens/s per stream: the engine alone leaves 50 ms between tokens
    slow = _point(5120, 20, gap_p99=0.055)
    assert ceiling([slow]) == 5120
    assert ceiling([slow], literal=True) is None
    assert ceiling([_point(6400, 100, gap_p99=0.029)], literal=True) == 6400


def test_cpu_per_1000_tokens():
    before, after = (
        {"tritonserver": 1.0, "stub:router": 2.0},
        {"tritonserver": 1.5, "stub:router": 2.25},
    )
    assert cpu_ms_per_1000_tokens(before, after, 10_000) == pytest.approx(
        {"tritonserver": 50.0, "stub:router": 25.0}
    )
    assert cpu_ms_per_1000_tokens(before, after, 0) == {}
