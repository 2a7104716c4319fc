"""Reloading models in a real tritonserver (explicit model control) must not kill it.

Triton 2.51 shares a custom metric's Prometheus series between every stub that creates
the same family and labels, and frees it when one of them deletes its Metric: the old
instance of a reloaded model used to free the series its successor was writing, and the
next observation killed the server (trident_common.metrics). Here each model kind that
runs on this machine (the vLLM model on the paced AsyncLLM double, the SGLang model on its
engine double, and the router; the session's vllm_double_server and sglang_check_server)
is loaded, loaded again, unloaded and loaded, waiting each time until the old instance's stub has
exited (so its finalize has run), and must answer correctly all along; its histograms keep
counting across the instances. The lifecycle's own rules are checked first, without a
server, against the pb_utils double.
"""

from __future__ import annotations

import gc
import importlib
import queue
import re
import sys
import time
import urllib.request
import weakref

import pytest
import tritonclient.grpc as grpcclient

from builder.serve import client as infer
from builder.serve.watch import stub_processes
from tests.fakes import fake_pb_utils as pb
from tests.helpers import metric_value, wait_for
from tests.server.configs import VLLM_DOUBLE_MODEL

server_test = pytest.mark.server

DOUBLE_REPLY = " w0 w1 w2 w3"  # the SGLang double's first four words (support/sglang_double.py)


def test_metrics_outlive_their_set_and_drop_writes_once_closed(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.delitem(sys.modules, "trident_common.metrics", raising=False)
    metrics = importlib.import_module("trident_common.metrics")
    pb.metric_violations.clear()
    old = metrics.MetricSet()
    counter = old.metric("trident_test_total", "test", metrics.COUNTER, {"model": "m"})
    counter.increment(2)
    old_series = weakref.ref(pb.metric("trident_test_total", model="m"))
    old.close()  # the old instance's finalize
    counter.increment(5)  # a late write of the old instance: dropped
    del old, counter
    gc.collect()
    assert old_series() is not None and old_series().value() == 2  # never deleted
    assert pb.metric_violations == []


@pytest.fixture(scope="module")
def server(sglang_check_server):
    """The SGLang model on its engine double (support/sglang_double.py) behind the router:
    the session's sglang_check_server. Every test here reloads or stops what the other
    tests of that server use, so all run after them (destructive)."""
    return sglang_check_server


def control(server, model: str, action: str) -> None:
    request = urllib.request.Request(
        f"{server.http_url}/v2/repository/models/{model}/{action}",
        data=b"{}",
        method="POST",
        headers=server.admin_headers,
    )  # model control needs the admin key
    with urllib.request.urlopen(request, timeout=240) as response:
        assert response.status == 200


def stubs_of(server, model: str) -> set[int]:
    return {pid for pid, stub in stub_processes(server.process.pid).items() if stub.model == model}


def wait_for_successor(server, model: str, old: set[int]) -> None:
    """Until the old instance's stub has exited (its finalize ran) and one new one serves."""

    def replaced():
        assert server.process.poll() is None, "tritonserver died (see its log)"
        stubs = stubs_of(server, model)
        return len(stubs) == 1 and not stubs & old

    wait_for(replaced, timeout_s=120, interval_s=0.2)


def answer(server, model: str) -> tuple[str, str, int]:
    result = infer.stream_generate(
        server.grpc_url, model, "Hello", max_tokens=4, sampling={"temperature": 0}, timeout_s=120
    )
    return result.text, result.served_by, result.output_tokens


def observations(server, histogram: str, **labels) -> float:
    return metric_value(server.metrics_url, histogram + "_count", **labels)


def reload_and_check(server, model: str, histogram: str, labels: dict, expected: tuple) -> None:
    """Serve, load again, serve, unload + load, serve four times; the same answer
    each time, the server alive, every request observed in the histogram."""
    assert answer(server, model) == expected
    counted = observations(server, histogram, **labels)
    old = stubs_of(server, model)
    control(server, model, "load")  # a new instance replaces the loaded one
    wait_for_successor(server, model, old)
    assert answer(server, model) == expected
    old = stubs_of(server, model)
    control(server, model, "unload")
    control(server, model, "load")  # while the old stub may still finalize
    wait_for_successor(server, model, old)
    for _ in range(4):
        assert answer(server, model) == expected
    assert server.process.poll() is None, "tritonserver died"
    # The new instances write the same series: nothing lost, nothing reset.
    wait_for(lambda: observations(server, histogram, **labels) == counted + 5, 30)


@server_test
@pytest.mark.destructive
def test_sglang_model_survives_reloads(server):
    reload_and_check(
        server,
        "qwen",
        "trident_time_to_first_token_seconds",
        {"model": "qwen"},
        (DOUBLE_REPLY, "qwen", 4),
    )


@server_test
@pytest.mark.destructive
def test_router_survives_reloads(server):
    reload_and_check(
        server,
        "router",
        "trident_router_added_latency_seconds",
        {"router": "router"},
        (DOUBLE_REPLY, "qwen", 4),
    )


# What a crash leaves in the log: the stub's own handler ("!!!!!!! Segfault encountered
# !!!!!!!" and a backtrace), the server's ("Signal (11) received."; 15 is our stop),
# Python's faulthandler, a shell's report, Triton's word for a dead stub.
CRASH = re.compile(
    r"Segfault encountered|Segmentation fault|Signal \((?!15\))\d+\) received|"
    r"Fatal Python error|core dumped|Stub process .* is not healthy"
)


@server_test
@pytest.mark.destructive
def test_vllm_model_survives_reloads(vllm_double_server):
    """trident's vLLM model (its real model.py, engine model and metrics; the engine the
    paced AsyncLLM double, so a load takes seconds, not vLLM's ~45 s start), on the
    session's vllm_double_server: loaded again, then unloaded and loaded twice in a row.
    Each unload used to end in a segfault of the stub (the unload itself succeeded: the
    model's ResponseFactory kept two pb_utils.Tensor objects for the model's whole life,
    and the stub tore down its shared memory before Python freed them); the server's log
    (the stubs' stderr goes there) must show no crash. A real vLLM engine's unload and
    load is test_router's test_traffic_returns_after_primary_restarts, and its reload
    by the keeper test_engine_faults' test_trident_serve_reloads_the_model_whose_engine_died."""
    server, model = vllm_double_server, VLLM_DOUBLE_MODEL
    log_start = server.log_path.stat().st_size
    text, served_by, tokens = answer(server, model)
    assert served_by == model and tokens == 4
    reload_and_check(
        server, model, "trident_time_to_first_token_seconds", {"model": model}, (text, model, 4)
    )  # greedy: the same text
    old = stubs_of(server, model)
    control(server, model, "unload")  # the second unload in a row
    wait_for(lambda: not stubs_of(server, model) & old, timeout_s=120, interval_s=0.2)
    control(server, model, "load")
    assert answer(server, model) == (text, model, 4)
    with open(server.log_path, "rb") as log:
        log.seek(log_start)
        crashes = CRASH.findall(log.read().decode(errors="replace"))
    assert not crashes, f"stub crashes in {server.log_path}: {crashes}"


@server_test
@pytest.mark.destructive
def test_unload_with_a_stream_in_flight(server):
    """The stream ends (final flag), the server lives, and the model serves once loaded."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(
            "qwen", infer.build_inputs("Hello", max_tokens=300), enable_empty_final_response=True
        )
        assert responses.get(timeout=60)[1] is None  # streaming has begun
        old = stubs_of(server, "qwen")
        control(server, "qwen", "unload")
        assert _ends(responses, 60), "the in-flight stream never ended"
    finally:
        client.stop_stream()
        client.close()
    control(server, "qwen", "load")
    wait_for_successor(server, "qwen", old)
    assert answer(server, "qwen") == (DOUBLE_REPLY, "qwen", 4)
    wait_for(
        lambda: metric_value(server.metrics_url, "trident_requests_in_flight", model="qwen") == 0,
        30,
    )


def _ends(responses: queue.Queue, timeout_s: float) -> bool:
    """True once a final response (or an error, which ends the stream) arrives."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result, error = responses.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            return False
        if error is not None:
            return True
        final = result.get_response().parameters.get("triton_final_response")
        if final and final.bool_param:
            return True
    return False


@server_test
@pytest.mark.destructive(stops=True)
def test_server_stops_cleanly_after_the_reloads(server):
    """Last of its server's tests: every old instance is gone, so shutdown finalizes only the
    current ones; nothing crashes on the way out. (Its exit status may be 1 on a busy
    machine: a vLLM engine that stops slower than --exit-timeout-secs.)"""
    code = server.stop()
    assert code is not None and code >= 0, f"tritonserver ended by signal {-code}"
    log = server.log_path.read_text(errors="replace")
    signals = set(re.findall(r"Signal \((\d+)\) received", log))
    assert signals <= {"15"}, f"tritonserver got signal {signals} (see its log)"  # 15: ours
