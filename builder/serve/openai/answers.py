"""OpenAI's answers as plain Python: a whole answer, its streamed chunks, usage, and the
logprobs in OpenAI's shapes (chat's content list, completions' parallel lists). Pure."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from builder.serve.openai.protocol import Generation

FINISH_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "stop_sequence": "stop",
    "end": "stop",
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def finish_reason(engine_reason: str | None) -> str | None:
    """The engine's finish reason in OpenAI's words (None while not finished)."""
    if not engine_reason:
        return None
    return FINISH_REASONS.get(engine_reason.lower(), "stop")


# JSON has no -inf (Starlette refuses to write NaN or infinities): a token the engine
# gives no chance at all gets vLLM's own OpenAI server's floor instead.
LOGPROB_FLOOR = -9999.0


def _logprob(entry: dict) -> float:
    value = entry.get("logprob")
    if not isinstance(value, (int, float)) or value != value or value < LOGPROB_FLOOR:
        return LOGPROB_FLOOR
    return float(value)


def _ranked(position: dict) -> list[tuple[str, float]]:
    """A position's entries as (token text, logprob), the sampled token first (the engine
    model writes it first), then the alternatives best first."""
    entries = list(position.values())
    if not entries:
        return []
    rest = sorted(entries[1:], key=lambda e: (e.get("rank") or 0, -_logprob(e)))
    return [(entries[0].get("decoded_token") or "", _logprob(entries[0]))] + [
        (e.get("decoded_token") or "", _logprob(e)) for e in rest
    ]


def _top(position: dict, top: int) -> list[tuple[str, float]]:
    """The `top` most likely tokens at a position, best first (the sampled one among
    them only when it ranks that high)."""
    entries = sorted(position.values(), key=lambda e: (e.get("rank") or 0, -_logprob(e)))
    return [(e.get("decoded_token") or "", _logprob(e)) for e in entries[:top]]


def chat_logprobs(positions: list, top: int) -> dict:
    """Chat's choices[].logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for position in positions:
        ranked = _ranked(position)
        if not ranked:
            continue
        token, logprob = ranked[0]
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                    for t, lp in _top(position, top)
                ],
            }
        )
    return {"content": content, "refusal": None}


def completion_logprobs(positions: list, top: int, offset: int = 0) -> dict:
    """Completions' choices[].logprobs: tokens, token_logprobs, top_logprobs (the `top`
    best and the sampled token, as OpenAI's legacy API gives them) and text_offset (each
    token's start in the choice's text, from `offset`)."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for position in positions:
        ranked = _ranked(position)
        if not ranked:
            continue
        token, logprob = ranked[0]
        best = dict(_top(position, top))
        best.setdefault(token, logprob)
        out["tokens"].append(token)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(best)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


# A string as JSON, without ASCII escapes, as json.dumps(text, ensure_ascii=False)
# writes it: json.dumps with any option set builds a new JSONEncoder per call (about
# half the cost of a short token's encoding); one encoder, made once, is reused.
_json_string = json.JSONEncoder(ensure_ascii=False).encode


@dataclass
class Answer:
    """Builds the JSON of one request's answer (whole, or chunk by chunk)."""

    generation: Generation
    id: str = ""
    created: int = 0
    # Per choice index: a text chunk's JSON before and after its text (text_chunk_json).
    _templates: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.id = self.id or new_id(self.generation.kind)
        self.created = self.created or int(time.time())

    @property
    def chat(self) -> bool:
        return self.generation.kind == "chat"

    def head(self, streamed: bool) -> dict:
        """The fields every answer (streamed: every chunk) starts with."""
        if self.chat:
            return self._head("chat.completion.chunk" if streamed else "chat.completion")
        return self._head("text_completion")

    def _head(self, obj: str) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.generation.model,
        }

    def whole(self, text: str, reason: str | None, tokens_in: int, tokens_out: int) -> dict:
        out = self._head("chat.completion" if self.chat else "text_completion")
        out["choices"] = [self.whole_choice(text, reason)]
        out["usage"] = usage(tokens_in, tokens_out)
        return out

    def whole_choice(
        self, text: str, reason: str | None, index: int = 0, logprobs: list | None = None
    ) -> dict:
        """One choice of a whole answer; `logprobs` are the engine's, per token."""
        if self.chat:
            return {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": self.logprobs(logprobs),
                "finish_reason": finish_reason(reason) or "stop",
            }
        if self.generation.echo:
            text = (self.generation.prompt or "") + text  # a completion always has one
        return {
            "index": index,
            "text": text,
            "logprobs": self.logprobs(logprobs),
            "finish_reason": finish_reason(reason) or "stop",
        }

    def logprobs(self, positions: list | None, offset: int = 0) -> dict | None:
        """The engine's per-token logprobs in this answer's shape (None: not asked)."""
        top = self.generation.logprobs
        if top is None:
            return None
        if self.chat:
            return chat_logprobs(positions or [], top)
        return completion_logprobs(positions or [], top, offset)

    def chunk(
        self,
        text: str | None,
        reason: str | None = None,
        first: bool = False,
        index: int = 0,
        logprobs: dict | None = None,
    ) -> dict:
        """One streamed chunk: new text, or the finish reason (then text is None);
        `logprobs` already in this answer's shape (self.logprobs)."""
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason(reason),
            }
            out = self._head("chat.completion.chunk")
        else:
            if first and self.generation.echo:
                text = (self.generation.prompt or "") + (text or "")
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": logprobs,
                "finish_reason": finish_reason(reason),
            }
            out = self._head("text_completion")
        out["choices"] = [choice]
        if self.generation.include_usage:
            out["usage"] = None
        return out

    def text_chunk_json(self, text: str, index: int = 0) -> str:
        """json.dumps(chunk(text, index=index)) from a template made once per answer
        and choice: a streamed token then costs one string encode, not a dict tree
        built and encoded."""
        template = self._templates.get(index)
        if template is None:
            mark = json.dumps("\0")  # a request's id and model never hold a NUL
            whole = json.dumps(self.chunk("\0", index=index), ensure_ascii=False)
            template = self._templates[index] = tuple(whole.rsplit(mark, 1))  # text: last
        head, tail = template
        return head + _json_string(text) + tail

    def usage_chunk(self, tokens_in: int, tokens_out: int) -> dict:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = usage(tokens_in, tokens_out)
        return out
