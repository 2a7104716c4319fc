"""vLLM's RequestOutput and CompletionOutput, with the fields its clients read."""
from dataclasses import dataclass, field
from typing import Generic, Optional, TypeVar

_O = TypeVar("_O")


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list
    prompt_logprobs: Optional[list]
    outputs: list
    finished: bool
    num_cached_tokens: Optional[int] = 0
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
