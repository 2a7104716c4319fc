"""AsyncEngineArgs: the engine arguments (model.json) as attributes. Two are the double's
own: `rate` (support.pacing.Rate's fields) and `rate_control` (a JSON file of them that the
benchmark rewrites between load points)."""

from types import SimpleNamespace


class AsyncEngineArgs:
    def __init__(
        self,
        rate: dict | None = None,
        rate_control: str | None = None,
        max_model_len: int | None = None,
        disable_log_stats: bool = False,
        stream_interval: int = 1,
        **engine_args,
    ):
        self.rate, self.rate_control = dict(rate or {}), rate_control
        self.stream_interval = stream_interval
        self.max_model_len, self.disable_log_stats = max_model_len, disable_log_stats
        self.enable_log_requests = bool(engine_args.pop("enable_log_requests", False))
        self.aggregate_engine_logging = False
        # Set by the model (the structured-output backend, compact JSON); the double's
        # filler answers ignore it.
        self.structured_outputs_config = SimpleNamespace(
            backend="auto", disable_any_whitespace=False
        )
        self.engine_args = engine_args  # the rest (model, dtype, ...): recorded only

    def create_engine_config(self, usage_context=None):
        from vllm.config import ModelConfig, VllmConfig

        return VllmConfig(
            ModelConfig(self.max_model_len or 32768),
            self.rate,
            self.rate_control,
            self.stream_interval,
        )
