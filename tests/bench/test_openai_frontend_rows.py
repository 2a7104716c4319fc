"""bench/openai_frontend.py's rows: the zero-cost engine's 1-stream point beside the
vLLM one, with the issue's +1.0 ms goal judged on it."""

from __future__ import annotations

import asyncio
import json

from bench.openai_frontend import (
    CEILING_STREAMS,
    GRPC,
    HTTP,
    RAW,
    RAW_ENGINE,
    RawHTTP,
    rows_from,
)


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


def test_the_raw_client_point_is_judged_on_its_own_row():
    measured = _measured(0.0090, 0.0060)
    measured["zero_cost"]["single"][RAW] = [(0.0068, 32, 0.01)] * 5
    rows = {r["metric"]: r for r in rows_from(measured)}
    raw = rows["TTFT p50 added by the frontend ms, 1 stream, zero-cost engine, raw HTTP client"]
    assert abs(raw["ours"] - 0.8) < 1e-9 and raw["met"] is True
    assert rows["TTFT p50 added by the frontend ms, 1 stream, zero-cost engine"]["met"] is False


def test_the_ceiling_puts_the_router_beside_the_engine_model_straight():
    measured = _measured(0.0090, 0.0060)
    zero = measured["zero_cost"]
    zero["single"][RAW] = [(0.0045, 32, 0.01)] * 5
    zero["single"][RAW_ENGINE] = [(0.0030, 32, 0.01)] * 5
    zero["concurrent"] = {
        str(CEILING_STREAMS): {"requests_per_s": {RAW: [290, 300, 310], RAW_ENGINE: [360, 380]}}
    }
    rows = {r["metric"]: r for r in rows_from(measured)}
    ttft = rows[
        "TTFT p50 ms, 1 stream, zero-cost engine, raw HTTP client, "
        "router vs the engine model straight"
    ]
    assert abs(ttft["ours"] - 4.5) < 1e-9 and abs(ttft["direct"] - 3.0) < 1e-9
    rate = rows[
        f"requests/s, {CEILING_STREAMS} streams, zero-cost engine, raw HTTP client, "
        "router vs the engine model straight"
    ]
    assert rate["ours"] == 300 and rate["direct"] == 370 and rate["higher_better"] is True
    assert "ceiling" in rate["target"] and rate["met"] is None


def test_the_zero_cost_part_alone_has_its_rows_only():
    measured = _measured(0.0065, 0.0060)
    rows = rows_from({"zero_cost": measured["zero_cost"]})
    assert rows and all("zero-cost engine" in r["metric"] for r in rows)


def _chunked_answer() -> bytes:
    """An SSE answer as the frontend sends it (chunked), its chunk boundaries splitting
    an event and a `data:` prefix in two."""
    events = [
        {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"completion_tokens": 7}},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"
    parts = [body[:5], body[5:40], body[40:]]
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    return answer + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def _raw_requests(close_after_each: bool) -> tuple[list, list]:
    """Two requests through RawHTTP to a server answering _chunked_answer(): the
    results, and the bodies the server read."""
    requests = []

    async def serve(reader, writer):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            requests.append(json.loads(await reader.readexactly(length)))
            writer.write(_chunked_answer())
            if close_after_each:  # as uvicorn closes a connection idle for 5 s
                await writer.drain()
                writer.close()
                return

    async def scenario():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RawHTTP(f"http://127.0.0.1:{port}")
        try:
            results = [await client.stream("hello")]
            await asyncio.sleep(0.05)  # the close reaches the client
            return results + [await client.stream("hello")]
        finally:
            await client.close()
            server.close()

    return asyncio.run(scenario()), requests


def test_the_raw_client_reads_a_chunked_sse_answer_and_keeps_its_connection():
    results, requests = _raw_requests(close_after_each=False)
    assert [r[1] for r in results] == [7, 7]
    assert all(0 < ttft <= end for ttft, _, end in results)
    assert [r["messages"][0]["content"] for r in requests] == ["hello", "hello"]


def test_the_raw_client_connects_again_when_the_server_closed_its_connection():
    results, requests = _raw_requests(close_after_each=True)
    assert [r[1] for r in results] == [7, 7] and len(requests) == 2
