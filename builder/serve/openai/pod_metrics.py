"""The pod's load on the OpenAI port (`GET /metrics`), in the shape the Gateway API
Inference Extension's endpoint picker reads: gauges of the requests waiting and running
in the pod's engines and of their KV-cache usage (0-1), one series each, no labels; and,
when an engine serves LoRA adapters, the adapters in use shaped like vLLM's
`vllm:lora_requests_info` (LORA_INFO). The picker scores pods by them; trident's router
then places the request inside the pod.

They are summed over the pod's READY engine models, from Triton's metrics port but for
SGLang's:
- a vLLM model has vLLM's own gauges (python_backends/vllm/stats.py: waiting, running,
  KV usage, and per adapter its requests running and waiting);
- a TensorRT-LLM model (Triton's tensorrtllm backend, the Triton model NAME_tensorrt_llm)
  has the backend's `nv_trt_llm_*` gauges, read as GIE v1.5.0's built-in
  `triton-tensorrt-llm` engine config reads them: waiting is
  nv_trt_llm_request_metrics{request_type="waiting"}, running
  {request_type="scheduled"}, KV usage
  nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}. What they are
  (tensorrtllm_backend's inflight_batcher_llm/src/model_instance_state.cc): scheduled is
  the executor's requests scheduled in its last iteration, waiting its active requests
  less those (paused or not yet fitted), fraction its used KV blocks over their maximum;
  requests still queued ahead of the executor's active set are in neither count;
- an SGLang model has SGLang's own gauges, which its scheduler writes to files
  (prometheus_client's multiprocess mode) in the model instance's folder
  (trident_common/engine_gauges.py), read here at each scrape (sglang_gauges):
  sglang:num_queue_reqs waiting, sglang:num_running_reqs running, sglang:token_usage KV
  usage (the KV pool's share held by live requests, as vLLM's). SGLang sets them at each
  prefill batch, every 40 decode steps and when it goes idle;
- an engine model with none of these (an SGLang model served without the folder, by
  plain tritonserver, or with engine_args.enable_metrics false) says only how many
  requests it has in flight (trident_requests_in_flight): they count as running, none
  as waiting, and it adds no KV usage (none is known). A model with an engine's own
  gauges is never counted through it as well.
KV usage is the fullest engine's: the router keeps a conversation with the engine that
holds its cache, so the pod is as full as that engine. A model that is not READY (an
unloaded one, whose series Triton keeps) counts for nothing. No tenant or model name
leaves: the three pod-wide numbers, and the adapters' names as clients name them
(docs/security.md). prometheus_client is imported when a scrape comes: `trident k8s`
reads the names here without it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trident_common import engine_gauges

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

# How a client names an adapter of an exposed model: MODEL:ADAPTER.
from builder.serve.openai.policy import ADAPTER_SEPARATOR

WAITING = "trident:num_requests_waiting"
RUNNING = "trident:num_requests_running"
KV_USAGE = "trident:kv_cache_usage_perc"
# The adapters in use, in the shape of vLLM's `vllm:lora_requests_info` (vLLM 0.32's
# v1/metrics/loggers.py), which GIE's core-metrics-extractor reads through `loraSpec`
# (pkg/epp/framework/plugins/datalayer/extractor/metrics/extractor.go): one series whose
# labels running_lora_adapters and waiting_lora_adapters are comma-separated adapter
# names and max_lora a count, its value the time it was set (the extractor takes the
# series with the latest value: vLLM leaves its older label sets behind; trident serves
# one).
LORA_INFO = "trident:lora_requests_info"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# What is read from Triton's metrics port (the rest of its text is skipped unparsed:
# the picker may scrape every 50 ms).
VLLM_WAITING, VLLM_RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"
IN_FLIGHT = "trident_requests_in_flight"
# The vLLM model's adapters (python_backends/vllm/stats.py: per model and adapter, and the
# engine's max_loras).
LORA_RUNNING = "trident_lora_requests_running"
LORA_WAITING = "trident_lora_requests_waiting"
LORA_MAX = "trident_lora_max"
# Triton's tensorrtllm backend: one family per kind, the kind in a label.
TRT_REQUESTS, TRT_REQUEST_KIND = "nv_trt_llm_request_metrics", "request_type"
TRT_KV, TRT_KV_KIND = "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"
TRT_WAITING, TRT_RUNNING, TRT_KV_USAGE = "waiting", "scheduled", "fraction"
READ = (
    VLLM_WAITING,
    VLLM_RUNNING,
    VLLM_KV_USAGE,
    IN_FLIGHT,
    LORA_RUNNING,
    LORA_WAITING,
    LORA_MAX,
    TRT_REQUESTS,
    TRT_KV,
)
# What is read from the SGLang models' own files (sglang 0.5.23's names, its scheduler's
# SchedulerMetricsCollector): the totals, labelled priority="" when priority scheduling
# adds a series per priority.
SGLANG_WAITING, SGLANG_RUNNING = "sglang:num_queue_reqs", "sglang:num_running_reqs"
SGLANG_KV_USAGE = "sglang:token_usage"
SGLANG = (SGLANG_WAITING, SGLANG_RUNNING, SGLANG_KV_USAGE)


@dataclass(frozen=True)
class PodLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    # The adapters as a client names them in `model` (router:ADAPTER), sorted; max_lora 0:
    # no engine of the pod serves adapters, and LORA_INFO is not served.
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    max_lora: int = 0

    def exposition(self) -> bytes:
        """The Prometheus text of the three gauges (and LORA_INFO, with adapters)."""
        from prometheus_client import CollectorRegistry, Gauge, generate_latest

        registry = CollectorRegistry()
        for name, what, value in (
            (WAITING, "Requests waiting in the pod's engines", self.waiting),
            (RUNNING, "Requests running in the pod's engines", self.running),
            (KV_USAGE, "KV-cache usage of the pod's fullest engine (0-1)", self.kv_usage),
        ):
            Gauge(name, what, registry=registry).set(value)
        if self.max_lora:
            info = Gauge(
                LORA_INFO,
                "LoRA adapters with requests running and waiting in the pod's engines",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=registry,
            )
            info.labels(
                max_lora=str(self.max_lora),
                waiting_lora_adapters=",".join(self.waiting_adapters),
                running_lora_adapters=",".join(self.running_adapters),
            ).set(time.time())
        return generate_latest(registry)


def pod_load(
    triton_metrics: str,
    engine_models: Iterable[str],
    exposed: Iterable[str] = (),
    engine_gauges: Iterable[Sample] = (),
) -> PodLoad:
    """The pod's load from Triton's metrics text and the SGLang models' `engine_gauges`
    (sglang_gauges), over the READY `engine_models`; the adapters named as clients of
    the `exposed` models name them."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(engine_models)
    lines = "\n".join(line for line in triton_metrics.splitlines() if line.startswith(READ))
    triton = (sample for f in text_string_to_metric_families(lines) for sample in f.samples)
    values: dict[str, dict[str, float]] = {name: {} for name in READ + SGLANG}
    kv: dict[str, float] = {}  # model -> its KV usage (vLLM's, SGLang's, TRT-LLM's fraction)
    trt: dict[str, dict[str, float]] = {TRT_WAITING: {}, TRT_RUNNING: {}}
    # model -> adapter -> requests, running and waiting (vLLM's own per-adapter counts)
    adapters: dict[str, dict[str, dict[str, float]]] = {LORA_RUNNING: {}, LORA_WAITING: {}}
    for sample in itertools.chain(triton, engine_gauges):
        model = sample.labels.get("model", "")
        if sample.name not in values or model not in wanted:
            continue
        if sample.name in adapters:
            counts = adapters[sample.name].setdefault(model, {})
            adapter = sample.labels.get("adapter", "")
            counts[adapter] = counts.get(adapter, 0.0) + sample.value
        elif sample.name == TRT_REQUESTS:
            kind = sample.labels.get(TRT_REQUEST_KIND)
            if kind in trt:
                trt[kind][model] = trt[kind].get(model, 0.0) + sample.value
        elif sample.name in (VLLM_KV_USAGE, SGLANG_KV_USAGE, TRT_KV):
            if sample.name != TRT_KV or sample.labels.get(TRT_KV_KIND) == TRT_KV_USAGE:
                kv[model] = max(kv.get(model, 0.0), sample.value)
        else:
            values[sample.name][model] = values[sample.name].get(model, 0.0) + sample.value
    waiting = [values[VLLM_WAITING], values[SGLANG_WAITING], trt[TRT_WAITING]]
    running = [values[VLLM_RUNNING], values[SGLANG_RUNNING], trt[TRT_RUNNING]]
    # The models with an engine's own gauges; the others' requests in flight run.
    gauged = {model for counts in waiting + running for model in counts}
    running.append({m: v for m, v in values[IN_FLIGHT].items() if m not in gauged})
    engines = gauged | set(values[IN_FLIGHT])
    running_adapters, waiting_adapters = _adapters_in_use(adapters, engines, exposed)
    return PodLoad(
        waiting=sum(sum(counts.values()) for counts in waiting),
        running=sum(sum(counts.values()) for counts in running),
        kv_usage=max(kv.values(), default=0.0),
        running_adapters=running_adapters,
        waiting_adapters=waiting_adapters,
        # The adapters the pod's engines hold on their GPUs at once: each vLLM engine
        # max_loras of them, so the pod at most their sum (an adapter served by two
        # engines may take a slot in each: a bound, not a promise).
        max_lora=int(sum(values[LORA_MAX].values())),
    )


def sglang_gauges(folder: Path | None, models: Iterable[str]) -> list[Sample]:
    """SGLang's own gauges for each of `models` that has files in `folder` (the server's
    engine-gauge folder; None: none), one sample per gauge and model, labelled with the
    model. Per instance and data-parallel rank, the largest value of the scheduler
    processes that wrote it (tensor- and pipeline-parallel ranks count the same
    requests), summed over instances and data-parallel ranks; token usage the largest."""
    if folder is None:
        return []
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.samples import Sample

    out = []
    for model in models:
        ranks: dict[tuple[str, str, str], float] = {}  # (gauge, instance, dp rank) -> value
        for path in engine_gauges.model_files(folder, model):
            for metric in MultiProcessCollector.merge([str(path)], accumulate=False):
                for sample in metric.samples:
                    if sample.name in SGLANG and sample.labels.get("priority", "") == "":
                        key = (sample.name, path.parent.name, sample.labels.get("dp_rank", ""))
                        ranks[key] = max(ranks.get(key, 0.0), sample.value)
        for name in SGLANG:
            values = [value for (gauge, *_), value in ranks.items() if gauge == name]
            if values:
                total = max(values) if name == SGLANG_KV_USAGE else sum(values)
                out.append(Sample(name, {"model": model}, total))
    return out


def _adapters_in_use(
    adapters: dict[str, dict[str, dict[str, float]]],
    engines: set[str],
    exposed: Iterable[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(running, waiting): the names, as clients give them in `model`, of the adapters
    with requests running / waiting in an engine (vLLM's own counts; an adapter can be in
    both). A client names an adapter MODEL:ADAPTER with MODEL an exposed model that
    reaches the engine: the engine model itself, or a router (an exposed model that is no
    engine: the router sends an adapter's requests to its backends that have it). The
    picker's LoRA affinity matches the request's `model` against these names; a request
    that names its adapter in `lora_name` has no adapter in `model`, and no affinity."""
    routers = [name for name in exposed if name not in engines]
    out: list[tuple[str, ...]] = []
    for family in (LORA_RUNNING, LORA_WAITING):
        names = set()
        for model, counts in adapters[family].items():
            reach = [*routers, *([model] if model in exposed else [])]
            names |= {
                f"{via}{ADAPTER_SEPARATOR}{adapter}"
                for adapter, count in counts.items()
                if count > 0
                for via in reach
            }
        out.append(tuple(sorted(names)))
    return out[0], out[1]
