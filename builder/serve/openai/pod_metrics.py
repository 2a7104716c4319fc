"""The pod's load on the OpenAI port (`GET /metrics`), in the shape the Gateway API
Inference Extension's endpoint picker reads: gauges of the requests waiting and running
in the pod's engines and of their KV-cache usage (0-1), one series each, no labels.
The picker scores pods by them; trident's router then places the request inside the pod.

They are read from Triton's metrics port and summed over the pod's READY engine models:
- a vLLM model has vLLM's own gauges (python_backends/vllm/stats.py: waiting, running,
  KV usage);
- any other trident engine model (SGLang) says only how many requests it has in flight
  (trident_requests_in_flight): they count as running, none as waiting, and it adds no
  KV usage (none is known).
KV usage is the fullest engine's: the router keeps a conversation with the engine that
holds its cache, so the pod is as full as that engine. A model that is not READY (an
unloaded one, whose series Triton keeps) counts for nothing. No tenant or model name
leaves: only the three pod-wide numbers (docs/security.md). prometheus_client is imported
when a scrape comes: `trident k8s` reads the names here without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WAITING = "trident:num_requests_waiting"
RUNNING = "trident:num_requests_running"
KV_USAGE = "trident:kv_cache_usage_perc"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# What is read from Triton's metrics port (the rest of its text is skipped unparsed:
# the picker may scrape every 50 ms).
VLLM_WAITING, VLLM_RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"
IN_FLIGHT = "trident_requests_in_flight"
READ = (VLLM_WAITING, VLLM_RUNNING, VLLM_KV_USAGE, IN_FLIGHT)


@dataclass(frozen=True)
class PodLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0

    def exposition(self) -> bytes:
        """The Prometheus text of the three gauges."""
        from prometheus_client import CollectorRegistry, Gauge, generate_latest

        registry = CollectorRegistry()
        for name, what, value in (
            (WAITING, "Requests waiting in the pod's engines", self.waiting),
            (RUNNING, "Requests running in the pod's engines", self.running),
            (KV_USAGE, "KV-cache usage of the pod's fullest engine (0-1)", self.kv_usage),
        ):
            Gauge(name, what, registry=registry).set(value)
        return generate_latest(registry)


def pod_load(triton_metrics: str, engine_models: Iterable[str]) -> PodLoad:
    """The pod's load from Triton's metrics text, over the READY `engine_models`."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(engine_models)
    lines = "\n".join(line for line in triton_metrics.splitlines() if line.startswith(READ))
    values: dict[str, dict[str, float]] = {name: {} for name in READ}
    for family in text_string_to_metric_families(lines):
        for sample in family.samples:
            model = sample.labels.get("model", "")
            if sample.name in values and model in wanted:
                values[sample.name][model] = values[sample.name].get(model, 0.0) + sample.value
    vllm = set(values[VLLM_RUNNING]) | set(values[VLLM_WAITING])
    others = {m: v for m, v in values[IN_FLIGHT].items() if m not in vllm}
    return PodLoad(
        waiting=sum(values[VLLM_WAITING].values()),
        running=sum(values[VLLM_RUNNING].values()) + sum(others.values()),
        kv_usage=max(values[VLLM_KV_USAGE].values(), default=0.0),
    )
