"""OpenAI's `tools` and `tool_choice` checked and mapped onto trident's `tools` and
`tool_choice` inputs, and the calls the engine model found (the `tool_calls` output,
already in OpenAI's shape) put into an answer, whole or streamed. Pure.

The engine model renders the tools into the chat template, enforces `required` and a
named choice with structured outputs, and parses `auto` answers with the model's tool
parser (trident_common/tool_calls.py; docs/clients.md says why there).
"""

from __future__ import annotations

import json
import re
from typing import Any

from builder.serve.openai.errors import invalid
from builder.serve.openai.structured import check_schema

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CHOICES = ("none", "auto", "required")


def parse(body: dict) -> tuple[list | None, str | None]:
    """(the tools, the tool_choice input: none / auto / required / a function's name);
    (None, None) when the request names no tools. Raises OpenAIError naming the field."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "'parallel_tool_calls' must be a boolean")
    if tools is None:
        if choice not in (None, "none"):
            raise invalid("tool_choice", "'tool_choice' needs 'tools'")
        return None, None
    if not isinstance(tools, list) or not tools:
        raise invalid("tools", "'tools' must be a non-empty list of function tools")
    names = [_tool(tool, i) for i, tool in enumerate(tools)]
    if parallel is False and choice == "required":
        # A forced choice's schema takes one call or more (tool_calls.forced_schema).
        raise invalid(
            "parallel_tool_calls",
            "parallel_tool_calls=false with tool_choice 'required' is not supported",
            "unsupported_parameter",
        )
    return tools, _choice(choice, names)


def _tool(tool: Any, i: int) -> str:
    where = f"tools[{i}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise invalid(
            where,
            f'{where} must be {{"type": "function", "function": '
            "{...}} (only function tools are supported)",
        )
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise invalid(
            f"{where}.function.name",
            f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'",
        )
    if "parameters" in function:
        check_schema(function["parameters"], f"{where}.function.parameters")
    return name


def _choice(choice: Any, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if choice in CHOICES:
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise invalid(
            "tool_choice",
            "'tool_choice' must be none, auto, required or "
            '{"type": "function", "function": {"name": ...}}',
        )
    if name not in names:
        raise invalid(
            "tool_choice",
            f"'tool_choice' names function {name[:64]!r}, which is not among the tools",
        )
    return name


def history(message: dict, where: str) -> dict:
    """The tool parts of an earlier turn, as chat templates take them: an assistant's
    calls (`tool_calls`, arguments as an object, the way vLLM's server hands them to a
    template) and a tool's answer (`tool_call_id`). {} for a message without them."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(
                f"{where}.tool_call_id",
                f"{where}: a tool message needs the tool_call_id of the call it answers",
            )
        return {"tool_call_id": call_id}
    calls = message.get("tool_calls")
    if role != "assistant" or calls is None:
        return {}
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise invalid(
                f"{where}.tool_calls[{j}]",
                f"{where}.tool_calls[{j}] must be "
                '{"id", "type": "function", "function": {"name", '
                '"arguments"}}',
            )
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            arguments = function["arguments"]  # the template gets what the model wrote
        out.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
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
