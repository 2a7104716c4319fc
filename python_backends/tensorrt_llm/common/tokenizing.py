"""Tokenizer work of the TRT-LLM pre/post-processing models, free of Triton types.

The ensemble carries batches: text [batch, 1] in; input_ids padded to [batch, longest]
with lengths [batch, 1]; output_ids [batch, beams, tokens] with sequence lengths
[batch, beams] back; text [batch, beams] out.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


class Tokenizer(Protocol):
    """What these models use of a transformers tokenizer (transformers itself is not
    type-checked: see pyproject.toml)."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def load_tokenizer(path: str) -> Tokenizer:
    from transformers import AutoTokenizer

    tokenizer: Tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {path} has no end-of-sequence token")
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> tuple[int | None, int | None]:
    """(end_id, pad_id): TRT-LLM stops at end_id and pads with pad_id."""
    end_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    return end_id, pad_id


def as_text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def encode_batch(tokenizer: Tokenizer, texts: Array, pad_id: int | None) -> tuple[Array, Array]:
    """texts: array [batch, 1] → (input_ids int32 [batch, longest], lengths int32 [batch, 1])."""
    rows = [
        tokenizer.encode(as_text(t), add_special_tokens=True)
        for t in np.asarray(texts, dtype=object).reshape(-1)
    ]
    for row in rows:
        if not row:
            raise ValueError("text_input encodes to no tokens")
    longest = max(len(row) for row in rows)
    ids = np.full((len(rows), longest), pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    lengths = np.array([[len(row)] for row in rows], dtype=np.int32)
    return ids, lengths


def decode_batch(
    tokenizer: Tokenizer, tokens: Array, lengths: Array, skip_special_tokens: bool = True
) -> Array:
    """tokens [batch, beams, n] and lengths [batch, beams] → text [batch, beams] (object)."""
    tokens = np.asarray(tokens)
    lengths = np.asarray(lengths).reshape(tokens.shape[0], tokens.shape[1])
    out = np.empty(tokens.shape[:2], dtype=object)
    for b in range(tokens.shape[0]):
        for beam in range(tokens.shape[1]):
            ids = tokens[b, beam, : int(lengths[b, beam])].tolist()
            out[b, beam] = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).encode(
                "utf-8"
            )
    return out
