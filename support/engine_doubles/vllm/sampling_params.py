"""SamplingParams with vLLM 0.32's field names (a name outside them is a TypeError, as
msgspec raises), RequestOutputKind and StructuredOutputsParams."""

import enum
from dataclasses import dataclass
from typing import Optional


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    json: object = None
    regex: str | None = None
    choice: list | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None


class SamplingParams:
    # vllm 0.32's SamplingParams.__struct_fields__ (the public ones).
    __struct_fields__ = (
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "watermarking",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "output_kind",
        "stream_interval",
        "structured_outputs",
        "logit_bias",
        "allowed_token_ids",
        "extra_args",
        "bad_words",
    )
    __annotations__ = {
        "n": int,
        "temperature": float,
        "top_p": float,
        "top_k": int,
        "min_p": float,
        "seed": Optional[int],
        "ignore_eos": bool,
        "max_tokens": Optional[int],
        "min_tokens": int,
        "logprobs": Optional[int],
        "presence_penalty": float,
        "frequency_penalty": float,
        "repetition_penalty": float,
    }

    def __init__(self, **values):
        unknown = sorted(set(values) - set(self.__struct_fields__) - {"lora_name"})
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        for name in self.__struct_fields__:  # vLLM's fields all have defaults
            setattr(self, name, None)
        self.max_tokens = 16
        self.output_kind = RequestOutputKind.CUMULATIVE
        self.n = 1
        for name, value in values.items():
            setattr(self, name, value)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
