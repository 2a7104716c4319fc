from collections.abc import Callable

from vllm.v1.metrics.buckets import build_1_2_5_buckets  # noqa: F401 (vLLM < 0.32 had it here)


class StatLoggerBase:
    def __init__(self, vllm_config, engine_index: int = 0):
        self.vllm_config, self.engine_index = vllm_config, engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        pass

    def log_engine_initialized(self):
        pass

    def log(self):
        pass


StatLoggerFactory = Callable
