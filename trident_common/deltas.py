"""What an engine hands the relay per output (Delta), and how pending ones coalesce.

When a stream has more than one delta ready by the time its response can go out, they
leave as one response: the texts joined, the counts of the last (they are running
totals), the logprobs of every token. Pure Python: the sender thread (outbox.py) uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class Delta:
    """New text since the previous delta, and the request's counts so far."""

    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    logprobs: list[dict[str, Any]] | None = None  # this delta's (returns.logprobs_json)
    cumulative_logprob: float | None = None
    tool_calls: str | None = None  # JSON list in OpenAI's shape (tool_calls.py)


def merge(deltas: list[Delta]) -> Delta:
    """One delta saying what `deltas` (in order, at least one) say together."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = [p for d in deltas if d.logprobs is not None for p in d.logprobs]
    return Delta(
        "".join(d.text for d in deltas),
        last.finish_reason,
        last.input_tokens,
        last.output_tokens,
        logprobs,
        last.cumulative_logprob,
        last.tool_calls,
    )


def batches(items: Iterable[Delta | Callable[[], None]]) -> list[Delta | Callable[[], None]]:
    """A stream's pending items in order, each run of consecutive deltas merged into one.
    A callable (an error to send, a metric to write) keeps its place: deltas on either
    side of it are never merged across it."""
    out: list[Delta | Callable[[], None]] = []
    run: list[Delta] = []
    for item in items:
        if isinstance(item, Delta):
            run.append(item)
            continue
        if run:
            out.append(merge(run))
            run = []
        out.append(item)
    if run:
        out.append(merge(run))
    return out
