"""The pod's load on the OpenAI port (builder/serve/openai/pod_metrics.py, GET /metrics):
the three gauges an endpoint picker reads, summed over the READY engine models from
Triton's metrics text, with nothing else in them. Live servers: tests/server/test_openai.py
(real vLLM) and test_openai_conformance.py (the SGLang double)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from builder.serve.openai.app import create_app
from builder.serve.openai.pod_metrics import KV_USAGE, RUNNING, WAITING, PodLoad, pod_load
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


def gauges(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_load_is_summed_over_the_ready_engines_only():
    # vLLM's own gauges for smollm2 (not its in-flight count as well), the SGLang model's
    # in-flight requests as running, the fullest engine's KV usage; the unloaded model's
    # stale series count for nothing.
    assert pod_load(TRITON, READY) == PodLoad(waiting=3, running=2 + 4, kv_usage=0.5)
    assert pod_load(TRITON, ("router",)) == PodLoad()
    assert pod_load("", READY) == PodLoad()


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
