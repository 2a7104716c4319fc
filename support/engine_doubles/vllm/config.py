"""VllmConfig: what stat loggers read of it (model_config.max_model_len), and the double's
rate settings, carried from AsyncEngineArgs.create_engine_config."""

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    max_model_len: int = 32768


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    rate: dict = field(default_factory=dict)
    rate_control: str | None = None
    stream_interval: int = 1  # vLLM's scheduler_config.stream_interval
