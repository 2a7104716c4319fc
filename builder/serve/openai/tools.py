"""OpenAI's `tools` and `tool_choice` as trident's `tools` and `tool_choice` inputs, and
the calls the engine model found (the `tool_calls` output, already in OpenAI's shape)
put into an answer, whole or streamed. Pure. The request's tools, its choice and the
calls of earlier turns are checked by the request's model (schema.py).

The engine model renders the tools into the chat template, enforces `required` and a
named choice with structured outputs, and parses `auto` answers with the model's tool
parser (trident_common/tool_calls.py; docs/clients.md says why there).
"""

from __future__ import annotations

import json
from typing import Any


def history(role: str, calls: list | None, call_id: Any) -> dict:
    """The tool parts of an earlier turn (checked: schema.Message), as chat templates take
    them: an assistant's calls (`tool_calls`, arguments as an object, the way vLLM's
    server hands them to a template) and a tool's answer (`tool_call_id`). {} for a
    message without them."""
    if role == "tool":
        return {"tool_call_id": call_id}
    if role != "assistant" or calls is None:
        return {}
    out = []
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments  # the template gets what the model wrote
        out.append(
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": arguments},
            }
        )
    return {"tool_calls": out}


def inputs(tools: list | None, choice: str | None) -> dict:
    """The tensors' values (name -> text) for one request."""
    if tools is None:
        return {}
    return {"tools": json.dumps(tools), "tool_choice": choice or "auto"}


def read(output: str | None) -> list | None:
    """The `tool_calls` output as a list of calls (None when the answer has none)."""
    if not output:
        return None
    calls = json.loads(output)
    return calls or None


def whole(choice: dict, calls: list | None) -> dict:
    """A whole chat choice with its calls: OpenAI's message has `tool_calls`, content
    null when the model wrote nothing else, and finish_reason "tool_calls"."""
    if calls:
        message = choice["message"]
        message["content"] = message.get("content") or None
        message["tool_calls"] = calls
        choice["finish_reason"] = "tool_calls"
    return choice


def deltas(calls: list) -> list[dict]:
    """The calls as one streamed delta's `tool_calls`: each with its index, id, type,
    name and the whole arguments (the calls are known once the answer is whole)."""
    return [
        {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            },
        }
        for i, call in enumerate(calls)
    ]


def chunk(template: dict, calls: list) -> dict:
    """A streamed chat chunk carrying the calls, from a chunk without text
    (Answer.chunk(None))."""
    template["choices"][0]["delta"]["tool_calls"] = deltas(calls)
    return template
