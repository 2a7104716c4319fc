"""SGLang's logprobs in the shape of trident's `logprobs` output (returns.logprobs_json).

With `return_logprob=True` and `top_logprobs_num=k`, SGLang's meta_info carries
`output_token_logprobs` (per generated token: (logprob, token id, text or None)) and
`output_top_logprobs` (per token: the k best, each the same triple, best first). In a
stream SGLang repeats the lists from the first token in every chunk unless the engine
runs with incremental_streaming_output (as with the text), so the new positions are the
ones past those already taken. The text of a token is None unless SGLang was asked for
it; the engine model's tokenizer decodes it then. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# One (logprob, token id, text or None) triple of SGLang's meta_info, as a list or tuple.
Entry = Sequence[Any]


def request_args(top: int | None) -> dict[str, Any]:
    """async_generate's keyword arguments for `top` alternatives per token (None: no
    logprobs at all)."""
    if top is None:
        return {}
    return {"return_logprob": True, "top_logprobs_num": top}


class Positions:
    """One stream's new logprob positions per chunk, in returns.logprobs_json's shape:
    per token, token id → {logprob, rank, decoded_token}, the sampled token first, then
    the alternatives by rank (1: the best). A sampled token outside the k best gets rank
    k + 1: SGLang does not say how far below them it was."""

    def __init__(self, incremental: bool, decode: Callable[[int], str]):
        self.incremental, self.decode = incremental, decode
        self._taken = 0

    def next(self, meta: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The positions new in this chunk's meta_info (None: it carries no logprobs)."""
        sampled = meta.get("output_token_logprobs")
        if sampled is None:
            return None
        tops = meta.get("output_top_logprobs") or []
        start = 0 if self.incremental else self._taken
        out: list[dict[str, Any]] = []
        for i in range(start, len(sampled)):
            top = tops[i] if i < len(tops) and tops[i] else []
            out.append(self._position(sampled[i], top))
        self._taken = len(sampled)
        return out

    def _position(self, sampled: Entry, top: Sequence[Entry]) -> dict[str, Any]:
        logprob, token_id, text = sampled[0], int(sampled[1]), sampled[2:3]
        ids = [int(entry[1]) for entry in top]
        rank = ids.index(token_id) + 1 if token_id in ids else len(ids) + 1
        position = {str(token_id): self._entry(logprob, rank, token_id, text)}
        for r, entry in enumerate(top, start=1):
            key = str(int(entry[1]))
            if key not in position:
                position[key] = self._entry(entry[0], r, int(entry[1]), entry[2:3])
        return position

    def _entry(
        self, logprob: float, rank: int, token_id: int, text: Sequence[str | None]
    ) -> dict[str, Any]:
        word = text[0] if text and text[0] is not None else self.decode(token_id)
        return {"logprob": float(logprob), "rank": rank, "decoded_token": word}
