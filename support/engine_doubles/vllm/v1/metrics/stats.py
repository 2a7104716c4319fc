"""The stats vLLM hands its stat loggers once per engine step (the fields trident's and
vllm_backend's loggers read)."""

from dataclasses import dataclass, field


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


@dataclass
class FinishedRequestStats:
    finish_reason: str
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int = 0
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0


@dataclass
class IterationStats:
    num_generation_tokens: int = 0
    num_prompt_tokens: int = 0
    num_preempted_reqs: int = 0
    finished_requests: list = field(default_factory=list)
    time_to_first_tokens_iter: list = field(default_factory=list)
    inter_token_latencies_iter: list = field(default_factory=list)
    n_params_iter: list = field(default_factory=list)
    max_num_generation_tokens_iter: list = field(default_factory=list)


@dataclass
class MultiModalCacheStats:
    queries: int = 0
    hits: int = 0
