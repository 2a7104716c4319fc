"""bench/trace_cost.py's rows: each config against traces off, and the client-sampled
requests against the unsampled ones sent beside them to the same server."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource

from bench.trace_cost import (
    BESIDE,
    CLIENT_SAMPLED,
    OFF,
    SAMPLED,
    STOPPED,
    UNSAMPLED,
    client_traceparent,
    rows_from,
)
from trident_common.spans import Spans


def test_client_sampled_requests_are_judged_against_their_own_servers_unsampled_ones():
    ttft = {
        OFF: [0.0040] * 3,
        UNSAMPLED: [0.0039] * 3,
        SAMPLED: [0.0043] * 3,
        STOPPED: [0.0043] * 3,
        BESIDE: [0.0042] * 3,  # +5% over off: the server alone, not sampling's cost
        CLIENT_SAMPLED: [0.00432] * 3,  # +2.9% over the unsampled requests beside them
    }
    spans = {f"bench-{UNSAMPLED}": 3, f"bench-{SAMPLED}": 420}
    rows = rows_from(ttft, spans, {"x_trace_spans_dropped": 1260.0})
    unsampled, client = rows[1], rows[-1]
    assert unsampled["met"] and "3 frontend spans for 3 client-sampled" in unsampled["metric"]
    assert client["direct"] == 4.2 and round(client["ours"], 2) == 4.32
    assert client["met"] and "+2.9%" in client["metric"]
    ttft[CLIENT_SAMPLED] = [0.00433] * 3  # +3.1%
    assert not rows_from(ttft, spans, {})[-1]["met"]


def test_the_client_traceparent_is_a_new_sampled_one_each_time():
    first, second = client_traceparent(), client_traceparent()
    assert first != second and first.endswith(b"-01\r\n")
    name, _, value = first.decode().strip().partition(": ")
    parent = Spans(None, Resource.create({}), "test").parent(value)  # OpenTelemetry's reading
    assert name == "traceparent" and parent is not None and parent.trace_flags.sampled


def test_a_real_engine_run_has_off_unsampled_and_the_client_sampled_rows_only():
    """`--engine smollm2` runs two configs (each a vLLM engine): no sampled or stopped
    server, so no rows for them and no lost-span counts."""
    from bench.trace_cost import ENGINES

    assert ENGINES["smollm2"].configs == (OFF, UNSAMPLED)
    ttft = {
        OFF: [0.135] * 3,
        UNSAMPLED: [0.1348] * 3,
        BESIDE: [0.126] * 3,
        CLIENT_SAMPLED: [0.1267] * 3,
    }
    rows = rows_from(ttft, {f"bench-{UNSAMPLED}": 3})
    assert [r["metric"].split(" (")[0] for r in rows] == [
        "TTFT p50 ms, traces off",
        "TTFT p50 ms, traces on, unsampled",
        "TTFT p50 ms, sampled by the client's traceparent, over the same server's unsampled "
        "requests",
    ]
    assert all(r["met"] for r in rows[1:])
