"""vLLM's RequestOutput and CompletionOutput, with the fields its clients read."""

from dataclasses import dataclass, field
from typing import Generic, TypeVar

_O = TypeVar("_O")


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None = None
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    prompt_logprobs: list | None
    outputs: list
    finished: bool
    num_cached_tokens: int | None = 0
    metrics: object = None
    lora_request: object = None
    kv_transfer_params: dict = field(default_factory=dict)


@dataclass
class EmbeddingOutput:
    embedding: list


@dataclass
class PoolingRequestOutput(Generic[_O]):
    request_id: str
    outputs: object
    prompt_token_ids: list
    finished: bool


EmbeddingRequestOutput = PoolingRequestOutput
