"""bench/gpu_rate.py's table rows from its points (pure)."""

from __future__ import annotations

from bench.gpu_rate import QUICK, plan, rows


def _point(path, streams, rate, delivered_fraction=1.0, gap_p99=0.01):
    offered = streams * rate
    return {
        "path": path,
        "streams": streams,
        "tokens_per_stream_s": rate,
        "offered_tokens_per_s": offered,
        "delivered_tokens_per_s": offered * delivered_fraction,
        "gap_p99_s": gap_p99,
        "ttft_p99_s": 0.1,
        "errors": 0,
    }


def _points(paths, behind: dict):
    """Every path at every quick point; `behind`: path -> streams from which it lags."""
    return [
        _point(path, streams, rate, 0.9 if streams >= behind.get(path, 10**6) else 1.0)
        for streams, rate in plan(QUICK)
        for path in paths
    ]


def test_ceiling_rows_compare_router_with_direct_and_frontend_with_router():
    table = {
        r["metric"]: r
        for r in rows(_points(("direct", "router", "openai"), {"router": 64, "openai": 64}))
    }
    router = table["ceiling tokens/s, router vs direct"]
    assert (router["ours"], router["direct"], router["met"]) == (1600, 6400, False)
    frontend = table["ceiling tokens/s, openai vs router"]
    assert (frontend["ours"], frontend["direct"], frontend["met"]) == (1600, 1600, True)
    assert not any("vllm_backend" in metric for metric in table)
    assert "delivered tokens/s 64 x 100/s, router vs direct" in table


def test_the_anchor_row_appears_with_the_anchor_path():
    table = {
        r["metric"]: r
        for r in rows(_points(("direct", "router", "openai", "anchor"), {"anchor": 64}))
    }
    row = table["ceiling tokens/s, direct (trident's vLLM model) vs vllm_backend"]
    assert (row["ours"], row["direct"], row["target"], row["met"]) == (
        6400,
        1600,
        ">= 1.0x anchor",
        True,
    )


def test_no_met_point_reads_as_zero_and_cannot_be_judged():
    points = _points(("direct", "router", "openai"), {"direct": 0, "router": 0, "openai": 0})
    row = rows(points)[0]
    assert (row["ours"], row["direct"], row["met"]) == (0.0, 0.0, None)
