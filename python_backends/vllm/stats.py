"""vLLM's own metric families on Triton's metrics port, named and labelled as Triton's
vllm_backend exports them (`vllm:prompt_tokens_total{model, version}`, ...), so dashboards
and clients written for vllm_backend read trident's vLLM model unchanged.

vLLM hands every stat logger its scheduler and iteration stats once per engine step, on
the event loop that serves the requests. A write to a Triton metric is a round trip to
the server, so `record` only turns the stats into updates (pure: `updates`) and queues
them; one writer thread applies them, summing counters and keeping the last gauge value
of whatever has queued up meanwhile. The series are trident_common.metrics' (never
deleted: the next instance of a reloaded model carries on counting).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from trident_common.metrics import COUNTER, GAUGE, HISTOGRAM, Metric, MetricSet, Writer

if TYPE_CHECKING:  # for the types only: vLLM hands these in (the tests, doubles of them)
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

# Bucket edges: vllm_backend's (which took them from vLLM's own examples).
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
N_BUCKETS = [1, 2, 5, 10, 20]
TOKENS = "tokens"  # marks the token-count histograms: 1-2-5 edges up to max_model_len

# (key, name, help, kind, buckets). request_success_total gets one series per finish
# reason, made on first use (key "success:<reason>").
FAMILIES = [
    (
        "prompt_tokens",
        "vllm:prompt_tokens_total",
        "Number of prefill tokens processed.",
        COUNTER,
        None,
    ),
    (
        "generation_tokens",
        "vllm:generation_tokens_total",
        "Number of generation tokens processed.",
        COUNTER,
        None,
    ),
    (
        "running",
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        GAUGE,
        None,
    ),
    (
        "waiting",
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        GAUGE,
        None,
    ),
    (
        "kv_cache_usage",
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        GAUGE,
        None,
    ),
    (
        "ttft",
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        HISTOGRAM,
        TTFT_BUCKETS,
    ),
    (
        "tpot",
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        HISTOGRAM,
        TPOT_BUCKETS,
    ),
    (
        "e2e",
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        HISTOGRAM,
        E2E_BUCKETS,
    ),
    (
        "request_prompt_tokens",
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed, per request.",
        HISTOGRAM,
        TOKENS,
    ),
    (
        "request_generation_tokens",
        "vllm:request_generation_tokens",
        "Number of generation tokens processed, per request.",
        HISTOGRAM,
        TOKENS,
    ),
    ("n", "vllm:request_params_n", "Histogram of the n request parameter.", HISTOGRAM, N_BUCKETS),
]
SUCCESS = ("vllm:request_success_total", "Count of successfully processed requests.")
SUCCESS_PREFIX = "success:"
# With adapters: per adapter, its requests running and waiting in the engine (vLLM's
# SchedulerStats.running_lora_adapters / waiting_lora_adapters, the counts behind vLLM's
# own vllm:lora_requests_info), and the adapters the engine holds at once (max_loras).
# Trident's names: vllm_backend exports none of these. One series per adapter of the
# spec (a bounded set), where vLLM's info gauge leaves one behind per combination; the
# frontend's GET /metrics turns them into the pod's info gauge (pod_metrics.py).
LORA_RUNNING = ("trident_lora_requests_running", "Requests running with the LoRA adapter.")
LORA_WAITING = ("trident_lora_requests_waiting", "Requests waiting with the LoRA adapter.")
LORA_MAX = ("trident_lora_max", "LoRA adapters the engine holds on its GPUs at once.")
LORA_RUNNING_PREFIX, LORA_WAITING_PREFIX = "lora_running:", "lora_waiting:"


class Update(NamedTuple):
    key: str
    op: str  # "increment", "set" or "observe"
    value: float


def updates(
    scheduler_stats: SchedulerStats | None,
    iteration_stats: IterationStats | None,
    adapters: Iterable[str] = (),
) -> list[Update]:
    """What one engine step's stats change, in vLLM's own terms (its Prometheus logger
    counts the same fields into the same names). `adapters`: the model's LoRA adapters,
    each set every step (vLLM drops an adapter from its counts once its last request
    ends: then it reads 0)."""
    out: list[Update] = []
    if scheduler_stats is not None:
        adapters = tuple(adapters)
        if adapters:
            running = scheduler_stats.running_lora_adapters
            waiting = scheduler_stats.waiting_lora_adapters
        for adapter in adapters:
            out.append(Update(LORA_RUNNING_PREFIX + adapter, "set", running.get(adapter, 0)))
            out.append(Update(LORA_WAITING_PREFIX + adapter, "set", waiting.get(adapter, 0)))
        out.append(Update("running", "set", scheduler_stats.num_running_reqs))
        out.append(
            Update(
                "waiting",
                "set",
                scheduler_stats.num_waiting_reqs
                + getattr(scheduler_stats, "num_skipped_waiting_reqs", 0),
            )
        )
        # The share of the KV cache's blocks held by running requests (free blocks that
        # still cache a prefix do not count): near 1, a new prompt waits or preempts.
        out.append(Update("kv_cache_usage", "set", scheduler_stats.kv_cache_usage))
    if iteration_stats is None:
        return out
    for key, count in (
        ("prompt_tokens", iteration_stats.num_prompt_tokens),
        ("generation_tokens", iteration_stats.num_generation_tokens),
    ):
        if count:
            out.append(Update(key, "increment", count))
    out += _observe("ttft", iteration_stats.time_to_first_tokens_iter)
    out += _observe("tpot", iteration_stats.inter_token_latencies_iter)
    out += _observe("n", iteration_stats.n_params_iter)
    for finished in iteration_stats.finished_requests:
        out.append(Update(SUCCESS_PREFIX + str(finished.finish_reason), "increment", 1))
        out.append(Update("e2e", "observe", finished.e2e_latency))
        out.append(Update("request_prompt_tokens", "observe", finished.num_prompt_tokens))
        out.append(Update("request_generation_tokens", "observe", finished.num_generation_tokens))
    return out


def _observe(key: str, values: Iterable[float]) -> list[Update]:
    return [Update(key, "observe", value) for value in values]


def coalesce(batch: Iterable[Update]) -> list[Update]:
    """Fewer writes, same result: increments of a key summed, only a gauge's last value
    kept; every histogram observation stays (each one is a sample)."""
    sums: dict[str, float] = {}
    last: dict[str, float] = {}
    observed: list[Update] = []
    for update in batch:
        if update.op == "increment":
            sums[update.key] = sums.get(update.key, 0) + update.value
        elif update.op == "set":
            last[update.key] = update.value
        else:
            observed.append(update)
    return (
        [Update(k, "increment", v) for k, v in sums.items()]
        + [Update(k, "set", v) for k, v in last.items()]
        + observed
    )


def token_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's edges for token counts)."""
    edges: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            edge = mantissa * scale
            if edge > max_value:
                return edges
            edges.append(edge)
        scale *= 10


class VllmStats:
    """The vllm:* series of one model instance and the thread that writes them. Give
    `logger_factory` to AsyncLLM's stat_loggers; call close() in finalize()."""

    def __init__(
        self,
        labels: Mapping[str, str],
        max_model_len: int,
        adapters: Iterable[str] = (),
        max_loras: int = 0,
    ):
        """`adapters`: the LoRA adapters' names as vLLM knows them (the spec's), whose
        requests are counted per adapter; `max_loras`: the engine's (with adapters)."""
        self._set, self._labels = MetricSet(), dict(labels)
        self._adapters = tuple(adapters)
        self.series: dict[str, Metric] = {
            key: self._set.metric(
                name,
                description,
                kind,
                self._labels,
                # TOKENS is the one string in the buckets' column
                token_buckets(max_model_len) if isinstance(buckets, str) else buckets,
            )
            for key, name, description, kind, buckets in FAMILIES
        }
        for adapter in self._adapters:
            for prefix, (name, description) in (
                (LORA_RUNNING_PREFIX, LORA_RUNNING),
                (LORA_WAITING_PREFIX, LORA_WAITING),
            ):
                self.series[prefix + adapter] = self._set.metric(
                    name, description, GAUGE, {**self._labels, "adapter": adapter}
                )
        if self._adapters:
            self._set.metric(*LORA_MAX, GAUGE, self._labels).set(max_loras)
        self._writer = Writer("vllm-stats", self._apply, merge=coalesce)

    def logger_factory(self, vllm_config: object, engine_index: int = 0) -> StatLogger:
        return StatLogger(self)

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        batch = updates(scheduler_stats, iteration_stats, self._adapters)
        if batch:
            self._writer.put(batch)

    def close(self) -> None:
        """Write what is queued, then stop (the series stay for the next instance)."""
        self._writer.close()
        self._set.close()

    def _apply(self, update: Update) -> None:
        getattr(self._metric(update.key), update.op)(update.value)

    def _metric(self, key: str) -> Metric:
        if key not in self.series:  # request_success_total, per finish reason
            reason = key[len(SUCCESS_PREFIX) :]
            self.series[key] = self._set.metric(
                *SUCCESS, COUNTER, {**self._labels, "finished_reason": reason}
            )
        return self.series[key]


class StatLogger:
    """vLLM's per-engine stat logger interface (StatLoggerBase's methods), feeding
    VllmStats; vLLM only calls these, it does not check the class."""

    def __init__(self, stats: VllmStats):
        self._stats = stats

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: object = None,
        engine_idx: int = 0,
    ) -> None:
        self._stats.record(scheduler_stats, iteration_stats)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass
