"""Tokenizer work of the TRT-LLM pre/post-processing models, free of Triton types.

The ensemble carries batches: text [batch, 1] in; input_ids padded to [batch, longest]
with lengths [batch, 1]; output_ids [batch, beams, tokens] with sequence lengths
[batch, beams] back; text [batch, beams] out.
"""

import numpy as np


def load_tokenizer(path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {path} has no end-of-sequence token")
    return tokenizer


def special_ids(tokenizer):
    """(end_id, pad_id): TRT-LLM stops at end_id and pads with pad_id."""
    end_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    return end_id, pad_id


def as_text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def encode_batch(tokenizer, texts, pad_id):
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


def decode_batch(tokenizer, tokens, lengths, skip_special_tokens=True):
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
