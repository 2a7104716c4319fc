"""Which outputs each response of one generation carries, and their values.

vllm_backend's dialect: a client that sends any `return_<output>` flag gets text_output
and exactly the outputs it asked for; there, a streamed num_output_tokens counts the
tokens of that response. A client that sends none gets trident's usual outputs, with
running token totals, and the `logprobs` output as well whenever the engine computed
logprobs (its sampling values asked for them: `logprobs`), so a client of the usual
outputs (the router, the OpenAI frontend) keeps served_by and the error output. Pure
Python: the Triton side (triton_io) only turns the values into tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from trident_common.deltas import Delta

LOGPROB_OUTPUTS = frozenset({"logprobs", "cumulative_logprob"})


def wants_logprobs(returns: frozenset[str] | None) -> bool:
    """Whether the engine must compute logprobs for this request (they cost time)."""
    return bool(returns and returns & LOGPROB_OUTPUTS)


def logprobs_json(positions: Iterable[Mapping[int, Any]]) -> list[dict[str, Any]]:
    """vLLM's per-position {token id: Logprob} as vllm_backend writes them (a Logprob
    has logprob, rank and decoded_token)."""
    return [
        {
            str(token_id): {
                "logprob": lp.logprob,
                "rank": lp.rank,
                "decoded_token": lp.decoded_token,
            }
            for token_id, lp in position.items()
        }
        for position in positions
    ]


class Outputs:
    """One generation's responses: feed every delta to `take`, then ask `values` for
    each response to send (every delta when streaming, the last one otherwise)."""

    def __init__(self, returns: frozenset[str] | None, stream: bool):
        self.returns, self.stream = returns, stream
        self._counted = 0  # output tokens reported so far (per-response counts)
        self._logprobs: list[dict[str, Any]] | None = None  # the whole answer's, when not streaming

    def take(self, delta: Delta) -> None:
        if not self.stream and delta.logprobs is not None:
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(delta.logprobs)  # in place: not a copy per delta

    def values(self, delta: Delta, text: str) -> dict[str, Any]:
        """Output name → value for the response that ends with `delta`."""
        if self.returns is None:
            out = {
                "text_output": text,
                "finish_reason": delta.finish_reason or "",
                "num_input_tokens": delta.input_tokens,
                "num_output_tokens": delta.output_tokens,
            }
            logprobs = delta.logprobs if self.stream else self._logprobs
            if logprobs is not None:  # only there when the sampling values asked
                out["logprobs"] = json.dumps(logprobs)
            if delta.tool_calls is not None:
                out["tool_calls"] = delta.tool_calls
            return out
        asked, out = self.returns, {"text_output": text}
        if delta.tool_calls is not None:  # no return_* flag: always with the answer
            out["tool_calls"] = delta.tool_calls
        if "finish_reason" in asked:  # vllm_backend writes vLLM's None as "None"
            out["finish_reason"] = delta.finish_reason or "None"
        if "num_input_tokens" in asked:
            out["num_input_tokens"] = delta.input_tokens
        if "num_output_tokens" in asked:
            out["num_output_tokens"] = delta.output_tokens - self._counted
        self._counted = delta.output_tokens
        if "cumulative_logprob" in asked and delta.cumulative_logprob is not None:
            out["cumulative_logprob"] = float(delta.cumulative_logprob)
        if "logprobs" in asked:
            logprobs = delta.logprobs if self.stream else self._logprobs
            if logprobs is not None:
                out["logprobs"] = json.dumps(logprobs)
        return out
