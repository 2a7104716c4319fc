"""bench/zero_cost.py's rows from measured figures (pure: no server)."""

import pytest

from bench import zero_cost


def measured(router_rps: float, direct_rps: float) -> dict:
    both = {zero_cost.ROUTER: [0.004], zero_cost.DIRECT: [0.003]}
    point = {"requests_per_s": 100.0, "ttft_p50_s": 0.01, "cpu_s_per_request": 0.002}
    return {
        "sequential_ttft_s": both,
        "concurrent": {
            "16": {zero_cost.ROUTER: point, zero_cost.DIRECT: point},
            "64": {
                zero_cost.ROUTER: {**point, "cpu_s_per_request": 0.003},
                zero_cost.DIRECT: point,
            },
        },
        "long_answers": {
            zero_cost.ROUTER: {"requests_per_s": router_rps, "cpu_s_per_request": 0.005},
            zero_cost.DIRECT: {"requests_per_s": direct_rps, "cpu_s_per_request": 0.004},
        },
        "per_chunk_s": {zero_cost.ROUTER: 0.0001, zero_cost.DIRECT: 0.0001},
    }


def long_row(rows: list[dict]) -> dict:
    return next(r for r in rows if r["metric"] == "requests/s, 64 streams, 64-token answers")


def test_the_64_token_point_is_a_row_judged_at_issue_36s_0_9x_direct():
    row = long_row(zero_cost.rows_from(measured(91.0, 100.0)))
    assert (row["ours"], row["direct"], row["target"], row["met"]) == (
        91.0,
        100.0,
        ">= 0.9x direct",
        True,
    )
    assert long_row(zero_cost.rows_from(measured(89.0, 100.0)))["met"] is False


def test_the_bare_relays_rows_split_the_routers_ttft_into_floor_and_own_share():
    m = measured(100.0, 100.0)
    m["sequential_ttft_s"] = {
        zero_cost.DIRECT: [0.002],
        zero_cost.BLOCKING: [0.003],
        zero_cost.THREADED: [0.0031],
        zero_cost.ASYNC: [0.0035],
        zero_cost.ROUTER: [0.004],
    }
    rows = {r["metric"]: r for r in zero_cost.rows_from(m)}
    prefix = "TTFT p50 ms, sequential, "
    floor = rows[prefix + "bare BLS relay (blocking: the floor)"]
    threaded = rows[prefix + "bare BLS relay (one thread hop: the least a concurrent relay pays)"]
    idiom = rows[prefix + "bare BLS relay (python_backend's async idiom)"]
    over_threaded = rows[prefix + "router over the threaded relay"]
    own = rows[prefix + "router over the blocking relay"]
    assert (floor["ours"], floor["direct"]) == pytest.approx((3.0, 2.0))
    assert (threaded["ours"], threaded["direct"]) == pytest.approx((3.1, 2.0))
    assert (idiom["ours"], idiom["direct"]) == pytest.approx((3.5, 2.0))
    assert (over_threaded["ours"], over_threaded["direct"]) == pytest.approx((4.0, 3.1))
    assert (own["ours"], own["direct"]) == pytest.approx((4.0, 3.0))
    assert {floor["met"], threaded["met"], idiom["met"], over_threaded["met"]} == {None}
    # The router's own share is judged (issue 36: at most 0.3 ms): 1.0 ms here.
    assert own["target"] == "<= blocking relay + 0.3 ms" and own["met"] is False
    m["sequential_ttft_s"][zero_cost.ROUTER] = [0.0032]
    own = {r["metric"]: r for r in zero_cost.rows_from(m)}[
        prefix + "router over the blocking relay"
    ]
    assert own["met"] is True


def test_a_run_without_the_relays_has_no_floor_rows():
    rows = zero_cost.rows_from(measured(100.0, 100.0))
    assert not [r for r in rows if "relay" in r["metric"]]


def test_the_servers_cpu_per_request_is_reported_for_both_64_stream_points():
    rows = {r["metric"]: r for r in zero_cost.rows_from(measured(100.0, 100.0))}
    short = rows["server CPU ms per request, 64 streams"]
    long = rows["server CPU ms per request, 64 streams, 64-token answers"]
    assert (short["ours"], short["direct"]) == pytest.approx((3.0, 2.0))
    assert (long["ours"], long["direct"]) == pytest.approx((5.0, 4.0))
    assert short["met"] is None and long["met"] is None  # reported, not judged
