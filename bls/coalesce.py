"""Merging stream chunks that are ready at once into one response (pure: numpy only).

When the router's relay falls behind its backend (the client side is slower than the
engine, or the machine is busy), several chunks wait in the BLS iterator. Each send to
the client is a blocking round trip to the server, and the server and the client pay
per response too, so chunks already waiting go out as one response: their texts joined,
the counts added or the latest kept. A chunk the merge does not understand (a tensor it
does not know, more than one element, logprobs JSON, outputs that differ) is never
merged: the caller sends those one by one, as before.
"""
import numpy as np

TEXT = ("text_output",)
# Running values: the last chunk's is the merged one's (vLLM's cumulative counts and
# logprob, and the labels every chunk repeats).
LATEST = ("finish_reason", "num_input_tokens", "served_by", "error", "cumulative_logprob")
COUNTS = ("num_output_tokens",)   # per response when the client asked (return_*), else running


def merge(chunks, counts_per_response):
    """One chunk for `chunks` (each a list of (output name, numpy array), in stream
    order), or None when they cannot be merged. `counts_per_response`: num_output_tokens
    is each chunk's own count (add them), not a running total (keep the last)."""
    if len(chunks) < 2:
        return None
    names = [name for name, _ in chunks[0]]
    if len(set(names)) != len(names):
        return None
    columns = {name: [] for name in names}
    for chunk in chunks:
        if [name for name, _ in chunk] != names:
            return None
        for name, array in chunk:
            if name not in columns or np.size(array) != 1:
                return None
            columns[name].append(array)
    merged = []
    for name in names:
        arrays = columns[name]
        if name in TEXT:
            merged.append((name, _join_text(arrays)))
        elif name in COUNTS and counts_per_response:
            total = sum(int(a.reshape(-1)[0]) for a in arrays)
            merged.append((name, np.array([total], dtype=arrays[-1].dtype)
                           .reshape(arrays[-1].shape)))
        elif name in LATEST or name in COUNTS:
            merged.append((name, arrays[-1]))
        else:
            return None   # logprobs (a JSON list each) or an output this code does not know
    return merged


def _join_text(arrays):
    parts = []
    for array in arrays:
        item = array.reshape(-1)[0]
        parts.append(item if isinstance(item, bytes) else str(item).encode("utf-8"))
    return np.array([b"".join(parts)], dtype=np.object_).reshape(arrays[-1].shape)
