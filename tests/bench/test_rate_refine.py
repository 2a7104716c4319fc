"""bench/rate_refine.py: the bisection that refines gpu_rate's ceiling between grid
points, and the refined rows bench/gpu_rate.py reports from its probes."""

from __future__ import annotations

import pytest

from bench.gpu_rate import parse_points, rows
from bench.rate_refine import Bisection, bracket, refined_ceiling


def _point(path, streams, rate, met=True, refine=False):
    offered = streams * rate
    point = {
        "path": path,
        "streams": streams,
        "tokens_per_stream_s": rate,
        "offered_tokens_per_s": offered,
        "delivered_tokens_per_s": offered if met else 0.5 * offered,
        "gap_p99_s": 0.01,
        "ttft_p99_s": 0.1,
        "errors": 0,
    }
    if refine:
        point["refine"] = True
    return point


def _met(point):
    return point["delivered_tokens_per_s"] >= point["offered_tokens_per_s"]


def _run(search, holds_up_to):
    """Drive a search against a path that meets every offered load up to `holds_up_to`."""
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate * search.streams <= holds_up_to)
    return rates


def test_the_bracket_is_the_highest_met_and_the_lowest_failed_above_it():
    grid = [
        _point("router", 16, 100),  # 1,600 met
        _point("router", 64, 20, met=False),  # 1,280 failed, but below what met
        _point("router", 64, 50, met=False),  # 3,200
        _point("router", 64, 100, met=False),  # 6,400
    ]
    assert bracket(grid, _met) == (1600, 3200)


def test_no_bracket_when_nothing_failed_above_and_zero_when_nothing_met():
    assert bracket([_point("direct", 16, 50), _point("direct", 64, 50)], _met) is None
    assert bracket([_point("direct", 16, 50, met=False)], _met) == (0.0, 800)


def test_bisection_halves_toward_the_path_that_holds_between_grid_points():
    search = Bisection(1600, 3200, streams=64, steps=3)
    # 2,400 met, 2,800 failed, 2,600 met: told to 200 tokens/s in three probes
    assert _run(search, holds_up_to=2700) == [37.5, 43.8, 40.6]
    assert search.best == pytest.approx(40.6 * 64)
    assert (search.low, search.high) == (pytest.approx(40.6 * 64), pytest.approx(43.8 * 64))


def test_a_path_that_fails_every_probe_keeps_the_grids_ceiling():
    search = Bisection(1600, 3200, streams=64, steps=3)
    assert _run(search, holds_up_to=0) == [37.5, 31.2, 28.1]
    assert search.best is None
    assert refined_ceiling(1600, search) == 1600
    assert refined_ceiling(None, search) is None
    assert refined_ceiling(None, None) is None


def test_the_search_stops_when_the_interval_is_below_the_paces_rounding():
    search = Bisection(3200, 3204, streams=64, steps=3)  # 50 .. 50.06 tokens/s per stream
    assert search.next_rate() is None


def test_refined_rows_sit_beside_the_grids_and_read_the_probes():
    grid = [
        _point("direct", 16, 100),
        _point("direct", 64, 50),
        _point("direct", 64, 100, met=False),
        _point("router", 16, 100),
        _point("router", 64, 50, met=False),
        _point("router", 64, 100, met=False),
    ]
    probes = [  # what gpu_rate's refine step measured, in order
        _point("direct", 64, 75, met=False, refine=True),
        _point("direct", 64, 62.5, met=True, refine=True),
        _point("direct", 64, 68.8, met=False, refine=True),
        _point("router", 64, 37.5, met=True, refine=True),
        _point("router", 64, 43.8, met=True, refine=True),
        _point("router", 64, 46.9, met=False, refine=True),
    ]
    table = {r["metric"]: r for r in rows(grid + probes)}
    coarse = table["ceiling tokens/s, router vs direct"]
    assert (coarse["ours"], coarse["direct"], coarse["met"]) == (1600, 3200, False)
    fine = table["ceiling (refined: 64 streams between grid points) tokens/s, router vs direct"]
    assert fine["ours"] == pytest.approx(43.8 * 64) and fine["direct"] == 4000
    assert fine["met"] is False  # 2,803 / 4,000 = 0.70x
    # the probes are no grid points: no delivered row of their own
    assert not any("37.5/s" in metric for metric in table)


def test_without_probes_there_is_no_refined_row():
    grid = [_point(p, 16, 100) for p in ("direct", "router", "openai")]
    assert not any("refined" in r["metric"] for r in rows(grid))


def test_chosen_points_parse_and_a_bad_one_is_named():
    assert parse_points("64x50, 16x100") == [(64, 50.0), (16, 100.0)]
    with pytest.raises(ValueError, match="'64-50'"):
        parse_points("64x50,64-50")
    with pytest.raises(ValueError, match="'0x50'"):
        parse_points("0x50")
