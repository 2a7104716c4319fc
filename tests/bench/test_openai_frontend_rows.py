"""bench/openai_frontend.py's rows: the zero-cost engine's 1-stream point beside the
vLLM one, with the issue's +1.0 ms goal judged on it."""

from __future__ import annotations

from bench.openai_frontend import GRPC, HTTP, rows_from


def _measured(http_ttft_s: float, grpc_ttft_s: float) -> dict:
    single = {HTTP: [(0.070, 32, 2.0)] * 3, GRPC: [(0.068, 32, 2.0)] * 3}
    cpu = {
        HTTP: {"frontend_s": 0.4, "client_s": 0.2, "tokens": 1000},
        GRPC: {"frontend_s": 0.0, "client_s": 0.2, "tokens": 1000},
    }
    zero = {
        "single": {HTTP: [(http_ttft_s, 32, 0.01)] * 5, GRPC: [(grpc_ttft_s, 32, 0.01)] * 5},
        "cpu": {
            HTTP: {"frontend_s": 0.1, "client_s": 0.1, "tokens": 2000},
            GRPC: {"frontend_s": 0.0, "client_s": 0.1, "tokens": 2000},
        },
    }
    return {"single": single, "concurrent": {}, "cpu": cpu, "zero_cost": zero}


def test_the_zero_cost_point_reports_the_added_ttft_and_judges_the_goal():
    rows = {r["metric"]: r for r in rows_from(_measured(0.0065, 0.0060))}
    added = rows["TTFT p50 added by the frontend ms, 1 stream, zero-cost engine"]
    assert abs(added["ours"] - 0.5) < 1e-9 and added["met"] is True
    ttft = rows["TTFT p50 ms, 1 stream, zero-cost engine"]
    assert abs(ttft["ours"] - 6.5) < 1e-9 and abs(ttft["direct"] - 6.0) < 1e-9
    cpu = rows["frontend CPU ms per 1,000 tokens, zero-cost engine"]
    assert abs(cpu["ours"] - 50.0) < 1e-9
    assert rows_from(_measured(0.0090, 0.0060))[-2]["met"] is False  # +3 ms


def test_a_run_without_the_zero_cost_point_keeps_its_rows():
    measured = _measured(0.0065, 0.0060)
    del measured["zero_cost"]
    assert not any("zero-cost" in r["metric"] for r in rows_from(measured))
