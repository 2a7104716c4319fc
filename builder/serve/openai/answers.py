"""OpenAI's answers as plain Python: a whole answer, its streamed chunks, usage. Pure."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from builder.serve.openai.protocol import Generation

FINISH_REASONS = {"stop": "stop", "eos": "stop", "stop_sequence": "stop", "end": "stop",
                  "length": "length", "max_tokens": "length",
                  "content_filter": "content_filter"}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def finish_reason(engine_reason: str | None) -> str | None:
    """The engine's finish reason in OpenAI's words (None while not finished)."""
    if not engine_reason:
        return None
    return FINISH_REASONS.get(engine_reason.lower(), "stop")


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens}


@dataclass
class Answer:
    """Builds the JSON of one request's answer (whole, or chunk by chunk)."""

    generation: Generation
    id: str = ""
    created: int = 0
    _template: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.id = self.id or new_id(self.generation.kind)
        self.created = self.created or int(time.time())

    @property
    def chat(self) -> bool:
        return self.generation.kind == "chat"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.generation.model}

    def whole(self, text: str, reason: str | None, tokens_in: int,
              tokens_out: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason(reason) or "stop"}
            out = self._head("chat.completion")
        else:
            if self.generation.echo:
                text = self.generation.prompt + text
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": finish_reason(reason) or "stop"}
            out = self._head("text_completion")
        out["choices"] = [choice]
        out["usage"] = usage(tokens_in, tokens_out)
        return out

    def chunk(self, text: str | None, reason: str | None = None,
              first: bool = False) -> dict:
        """One streamed chunk: new text, or the finish reason (then text is None)."""
        if self.chat:
            delta: dict = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None,
                      "finish_reason": finish_reason(reason)}
            out = self._head("chat.completion.chunk")
        else:
            if first and self.generation.echo:
                text = self.generation.prompt + (text or "")
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason(reason)}
            out = self._head("text_completion")
        out["choices"] = [choice]
        if self.generation.include_usage:
            out["usage"] = None
        return out

    def text_chunk_json(self, text: str) -> str:
        """json.dumps(chunk(text)) from a template made once per answer: a streamed
        token then costs one string encode, not a dict tree built and encoded."""
        if self._template is None:
            mark = json.dumps("\0")      # a request's id and model never hold a NUL
            whole = json.dumps(self.chunk("\0"), ensure_ascii=False)
            self._template = tuple(whole.rsplit(mark, 1))   # the text is the last string
        head, tail = self._template
        return head + json.dumps(text, ensure_ascii=False) + tail

    def usage_chunk(self, tokens_in: int, tokens_out: int) -> dict:
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = usage(tokens_in, tokens_out)
        return out
