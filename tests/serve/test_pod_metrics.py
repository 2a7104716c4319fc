"""The pod's load on the OpenAI port (builder/serve/openai/pod_metrics.py, GET /metrics):
the three gauges an endpoint picker reads, summed over the READY engine models from
Triton's metrics text, with nothing else in them. Live servers: tests/server/test_openai.py
(real vLLM) and test_openai_conformance.py (the SGLang double)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from builder.serve.openai.app import create_app
from builder.serve.openai.pod_metrics import (
    KV_USAGE,
    LORA_INFO,
    RUNNING,
    WAITING,
    PodLoad,
    pod_load,
    sglang_gauges,
)
from tests.serve.test_openai_app import FakeTriton

TRITON = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model="smollm2",version="1"} 2
vllm:num_requests_running{model="unloaded",version="1"} 40
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model="smollm2",version="1"} 3
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model="smollm2",version="1"} 0.25
vllm:kv_cache_usage_perc{model="other",version="1"} 0.5
# TYPE trident_requests_in_flight gauge
trident_requests_in_flight{model="smollm2"} 5
trident_requests_in_flight{model="qwen"} 4
trident_requests_in_flight{model="unloaded"} 9
# TYPE trident_tenant_admitted_total counter
trident_tenant_admitted_total{router="router",tenant="alice"} 7
# TYPE nv_inference_count counter
nv_inference_count{model="smollm2",version="1"} 11
"""
READY = ("router", "smollm2", "qwen", "other")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def gauges(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_load_is_summed_over_the_ready_engines_only():
    # vLLM's own gauges for smollm2 (not its in-flight count as well), qwen's in-flight
    # requests as running (an engine model without gauges of its own), the fullest
    # engine's KV usage; the unloaded model's stale series count for nothing.
    assert pod_load(TRITON, READY) == PodLoad(waiting=3, running=2 + 4, kv_usage=0.5)
    assert pod_load(TRITON, ("router",)) == PodLoad()
    assert pod_load("", READY) == PodLoad()


# One SGLang scheduler process writing its gauges as sglang 0.5.23's
# SchedulerMetricsCollector does (prometheus_client's multiprocess mode, "mostrecent"
# gauges, its labels; a per-priority series beside the total when priority scheduling is
# on), into the folder it is given, then exiting: as a real scheduler's, its file stays.
SCHEDULER = """
import json, sys
from prometheus_client import Gauge
ranks, values = json.loads(sys.argv[1]), json.loads(sys.argv[2])
labels = {"model_name": "qwen", "engine_type": "unified", "pp_rank": "0", "moe_ep_rank": "0"}
labels |= ranks
names = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")
for name, value in zip(names, values):
    gauge = Gauge(name, "doc", list(labels) + ["priority"], multiprocess_mode="mostrecent")
    gauge.labels(**labels, priority="").set(value)
    gauge.labels(**labels, priority="1").set(100)
"""


def scheduler(folder: Path, ranks: dict[str, str], running: int, queued: int, usage: float):
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    args = [json.dumps(ranks), json.dumps([running, queued, usage])]
    subprocess.run([sys.executable, "-c", SCHEDULER, *args], env=env, check=True)


def test_sglang_counts_its_queue_running_and_token_usage_from_its_files(tmp_path):
    # qwen: instance qwen_0 with two tensor-parallel ranks (the same requests: counted
    # once) and instance qwen_1 with two data-parallel ranks (their own requests:
    # summed); the priority="1" series are parts of the totals, not added to them.
    # `unloaded` is not READY; `other` has no files.
    scheduler(tmp_path / "qwen/qwen_0", {"tp_rank": "0"}, 3, 2, 0.5)
    scheduler(tmp_path / "qwen/qwen_0", {"tp_rank": "1"}, 3, 2, 0.5)
    scheduler(tmp_path / "qwen/qwen_1", {"tp_rank": "0", "dp_rank": "0"}, 1, 0, 0.25)
    scheduler(tmp_path / "qwen/qwen_1", {"tp_rank": "0", "dp_rank": "1"}, 2, 1, 0.75)
    scheduler(tmp_path / "unloaded/unloaded_0", {"tp_rank": "0"}, 40, 40, 0.9)
    read = sglang_gauges(tmp_path, ("router", "qwen", "other"))
    assert {(s.name, s.labels["model"]): s.value for s in read} == {
        ("sglang:num_running_reqs", "qwen"): 3 + 1 + 2,
        ("sglang:num_queue_reqs", "qwen"): 2 + 0 + 1,
        ("sglang:token_usage", "qwen"): 0.75,
    }
    assert sglang_gauges(None, ("qwen",)) == []
    # In the pod's load, with vLLM's of TRITON (qwen's in-flight count of 4 there is not
    # counted as well): summed, the fullest engine's KV usage.
    assert pod_load("", READY, engine_gauges=read) == PodLoad(waiting=3, running=6, kv_usage=0.75)
    mixed = pod_load(TRITON, READY, engine_gauges=read)
    assert mixed == PodLoad(waiting=3 + 3, running=2 + 6, kv_usage=0.75)
    # Without its files (served by plain tritonserver, or its metrics off), qwen's
    # requests in flight run. Idle gauges are 0, and no reason to count those instead.
    assert pod_load(TRITON, READY) == PodLoad(waiting=3, running=2 + 4, kv_usage=0.5)
    idle = tmp_path / "idle"
    scheduler(idle / "qwen/qwen_0", {"tp_rank": "0"}, 0, 0, 0.0)
    assert pod_load(TRITON, ("qwen",), engine_gauges=sglang_gauges(idle, ("qwen",))) == PodLoad()


# Triton's tensorrtllm backend for the TensorRT-LLM model `llama` (its engine is the Triton
# model llama_tensorrt_llm): the families as tensorrtllm_backend's README shows them (the
# kind in a label), with the test's values; `gone_tensorrt_llm` is not READY.
TRT_LLM = (FIXTURES / "triton_trtllm_metrics.txt").read_text()


def test_tensorrt_llm_counts_its_waiting_scheduled_and_kv_fraction():
    # GIE's triton-tensorrt-llm mapping: waiting -> queue, scheduled -> running,
    # fraction -> KV usage; the other kinds (max, active, tokens_per, ...) count for
    # nothing, nor does a model that is not READY.
    ready = ("router", "llama", "llama_tensorrt_llm")
    assert pod_load(TRT_LLM, ready) == PodLoad(waiting=4, running=6, kv_usage=0.75)
    # With the vLLM model and qwen's requests in flight of TRITON: summed, the fullest
    # engine's KV.
    mixed = pod_load(TRITON + TRT_LLM, READY + ready)
    assert mixed == PodLoad(waiting=3 + 4, running=2 + 4 + 6, kv_usage=0.75)


# The vLLM model `primary` with adapters paris and france, and `backup` with paris
# (python_backends/vllm/stats.py's series); `old` is not READY.
LORA = """# TYPE trident_lora_requests_running gauge
trident_lora_requests_running{model="primary",version="1",adapter="paris"} 2
trident_lora_requests_running{model="primary",version="1",adapter="france"} 0
trident_lora_requests_running{model="backup",version="1",adapter="paris"} 1
trident_lora_requests_running{model="old",version="1",adapter="berlin"} 1
# TYPE trident_lora_requests_waiting gauge
trident_lora_requests_waiting{model="primary",version="1",adapter="paris"} 0
trident_lora_requests_waiting{model="primary",version="1",adapter="france"} 3
trident_lora_requests_waiting{model="backup",version="1",adapter="paris"} 0
trident_lora_requests_waiting{model="old",version="1",adapter="berlin"} 2
# TYPE trident_lora_max gauge
trident_lora_max{model="primary",version="1"} 2
trident_lora_max{model="backup",version="1"} 1
trident_lora_max{model="old",version="1"} 8
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model="primary",version="1"} 2
vllm:num_requests_running{model="backup",version="1"} 1
"""


def test_adapters_in_use_are_named_as_clients_name_them():
    # Through the router (exposed, no engine): router:ADAPTER; an adapter with requests
    # both running and waiting on different engines is in both lists; the pod holds at
    # most the sum of its engines' max_loras; the unloaded model's adapters are gone.
    load = pod_load(LORA, ("router", "primary", "backup"), ("router",))
    assert load.running_adapters == ("router:paris",)
    assert load.waiting_adapters == ("router:france",)
    assert load.max_lora == 2 + 1
    # An engine model exposed itself is named by its own name too (primary:france), and a
    # model that is not exposed reaches nothing by its own name.
    load = pod_load(LORA, ("router", "primary", "backup"), ("router", "primary"))
    assert load.running_adapters == ("primary:paris", "router:paris")
    assert load.waiting_adapters == ("primary:france", "router:france")
    # No engine with adapters: no LoRA at all.
    assert pod_load(TRITON, READY, ("router",)).max_lora == 0


def test_the_lora_info_is_vllms_shape_and_the_latest_series():
    """What GIE's core-metrics-extractor reads through loraSpec (extractor.go
    populateLoRAMetrics): the labels running_lora_adapters and waiting_lora_adapters,
    comma-separated, and max_lora, an integer; the series with the latest value."""
    load = PodLoad(
        running_adapters=("router:a", "router:b"), waiting_adapters=("router:c",), max_lora=4
    )
    families = {f.name: f for f in text_string_to_metric_families(load.exposition().decode())}
    (sample,) = families[LORA_INFO].samples
    assert families[LORA_INFO].type == "gauge"
    assert sample.labels == {
        "running_lora_adapters": "router:a,router:b",
        "waiting_lora_adapters": "router:c",
        "max_lora": "4",
    }
    assert sample.value > 1.7e9  # a Unix time: the extractor keeps the latest series
    # Without adapters the family is not served (the rendered loraSpec is then empty).
    assert LORA_INFO not in PodLoad(waiting=1).exposition().decode()


def test_the_exposition_is_three_unlabelled_gauges():
    text = PodLoad(waiting=1, running=2, kv_usage=0.75).exposition().decode()
    families = list(text_string_to_metric_families(text))
    assert {f.name: f.type for f in families} == {
        WAITING: "gauge",
        RUNNING: "gauge",
        KV_USAGE: "gauge",
    }
    assert all(s.labels == {} for f in families for s in f.samples)  # no tenant, no model
    assert gauges(text) == {WAITING: 1, RUNNING: 2, KV_USAGE: 0.75}


class MeteredTriton(FakeTriton):
    metrics_url = "http://triton-metrics.invalid/metrics"

    async def metrics_text(self):
        return TRITON


def test_get_metrics_serves_the_pods_load_without_a_key():
    app = create_app("unused", MeteredTriton([]), api_keys={"k" * 32: "alice"})
    response = TestClient(app).get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    # FakeTriton's READY models: router and smollm2.
    assert gauges(response.text) == {WAITING: 3, RUNNING: 2, KV_USAGE: 0.25}
    assert "alice" not in response.text and "smollm2" not in response.text


def test_without_a_triton_metrics_port_there_is_no_metrics_endpoint():
    class Unmetered(FakeTriton):
        metrics_url = None

    response = TestClient(create_app("unused", Unmetered([]))).get("/metrics")
    assert response.status_code == 404 and "metrics port" in response.json()["error"]["message"]


def test_get_metrics_names_the_adapters_by_the_exposed_models():
    class AdapterTriton(MeteredTriton):
        async def metrics_text(self):
            return LORA.replace('model="primary"', 'model="smollm2"')

    response = TestClient(create_app("unused", AdapterTriton([]))).get("/metrics")
    (sample,) = [
        s
        for f in text_string_to_metric_families(response.text)
        for s in f.samples
        if s.name == LORA_INFO
    ]
    assert sample.labels["running_lora_adapters"] == "router:paris"
    assert sample.labels["waiting_lora_adapters"] == "router:france"
    assert sample.labels["max_lora"] == "2"
    assert "smollm2" not in response.text  # the engine model is not exposed
