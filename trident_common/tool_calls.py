"""Tool calling in the engine models, engine-neutral and pure (no Triton, no engine).

A request's `tools` and `tool_choice` inputs (OpenAI's shapes, as JSON) become a ToolPlan.
`required` and a named function are enforced with structured outputs: the engine may only
write JSON of the schema built here from the tools, so even a small model answers with a
call that parses. `auto` leaves the model free and the engine's own tool parser (chosen per
model in the spec, `engine_args.tool_call_parser`) reads the calls out of its text.

Parsing runs in the engine model because that is where the tokenizer and the engine's
parsers live; the calls leave in the `tool_calls` output as JSON, already in OpenAI's
shape, so the router relays them untouched and Triton clients get them too.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from trident_common.constraint_bounds import check_constraint, check_tool_count
from trident_common.deltas import Delta
from trident_common.faults import BadRequest

CHOICES = ("none", "auto", "required")
TOOLS, TOOL_CHOICE = "[tools] ", "[tool_choice] "   # the parameter a refusal names


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]  # OpenAI tool objects ({"type": "function", "function": {...}})
    choice: str              # "auto", "required", or the name of the function to call

    @property
    def forced(self) -> bool:
        """The engine is constrained to calls (required, named), not left to choose."""
        return self.choice != "auto"

    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]


# The `tools` and `tool_choice` inputs arrive as a tensor's value (request.first_scalar):
# JSON text as a rule, but whatever a client sent; Any, as the checks below take it.
def parse_plan(tools_text: Any, choice_text: Any) -> ToolPlan | None:
    """The `tools` and `tool_choice` inputs as a plan; None when no tool may be called
    (no tools, or tool_choice "none": the tools still reach the chat template then, as
    OpenAI's model still sees them, but nothing is parsed). Raises BadRequest naming the
    input."""
    if not tools_text:
        if choice_text not in (None, "", "none"):
            raise BadRequest(f"{TOOL_CHOICE}tool_choice needs tools")
        return None
    tools = _json(tools_text, "tools")
    check_tools(tools)
    choice = _choice(choice_text, [t["function"]["name"] for t in tools])
    return None if choice == "none" else ToolPlan(tools, choice)


def read_tools(tools_text: Any, choice_text: Any,
               chat: bool) -> tuple[list[dict[str, Any]] | None, ToolPlan | None]:
    """(the tools for the chat template, the plan) from the `tools` and `tool_choice`
    inputs. The template gets the tools under tool_choice "none" too: OpenAI's model
    still sees them then, it only may not call one."""
    if not tools_text and not choice_text:
        return None, None
    if not chat:
        raise BadRequest(f"{TOOLS}tools need chat messages (the `messages` input), not "
                         "text_input")
    plan = parse_plan(tools_text, choice_text)
    return (_json(tools_text, "tools") if tools_text else None), plan


def check_tools(tools: object) -> None:
    if not isinstance(tools, list) or not tools:
        raise BadRequest(f"{TOOLS}tools must be a non-empty list of tool objects")
    check_tool_count(tools, TOOLS)
    check_constraint(tools, TOOLS, "tools")  # their schemas become a required call's
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(function, dict):
            raise BadRequest(f"[tools[{i}]] tools[{i}] must be "
                             "{\"type\": \"function\", \"function\": {...}}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"[tools[{i}].function.name] tools[{i}] has no function name")
        if name in seen:
            raise BadRequest(f"[tools[{i}].function.name] tools[{i}]: function {name!r} "
                             "is given twice")
        seen.add(name)
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"[tools[{i}].function.parameters] tools[{i}]: parameters "
                             "must be a JSON schema object")


def _choice(text: Any, names: list[str]) -> str:
    if text in (None, ""):
        return "auto"
    if isinstance(text, str) and text in CHOICES:
        return text
    value = _json(text, "tool_choice") if text.lstrip().startswith("{") else text
    if isinstance(value, dict):   # {"type": "function", "function": {"name": ...}}
        function = value.get("function")
        value = function.get("name") if isinstance(function, dict) else None
    if not isinstance(value, str) or value not in names:
        raise BadRequest(f"{TOOL_CHOICE}tool_choice must be none, auto, required or a "
                         f"function of tools ({', '.join(names)}), got {str(text)[:60]!r}")
    return value


def _json(text: Any, name: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise BadRequest(f"[{name}] {name} is not valid JSON") from None


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A function's argument schema; a function without one takes an empty object."""
    schema: dict[str, Any] = tool["function"].get("parameters") or {"type": "object",
                                                                    "properties": {}}
    return schema


def forced_schema(plan: ToolPlan, parallel: bool = True) -> dict[str, Any]:
    """The JSON schema the engine is held to: for a named function, its arguments; for
    `required`, a list of one or more {name, arguments} of the tools (one at most when
    parallel calls are off)."""
    if plan.choice != "required":
        tool = next(t for t in plan.tools if t["function"]["name"] == plan.choice)
        return _parameters(tool)
    items = [{"type": "object", "properties": {"name": {"type": "string",
                                                        "enum": [t["function"]["name"]]},
                                               "arguments": _parameters(t)},
              "required": ["name", "arguments"], "additionalProperties": False}
             for t in plan.tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
              "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def forced_calls(plan: ToolPlan, text: str) -> list[dict[str, Any]]:
    """The calls in a constrained answer, in OpenAI's shape. An answer cut short (max
    tokens) is not JSON: then there is no call, and the text stays the content."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return []
    if plan.choice != "required":
        return [call(plan.choice, value)]
    if not isinstance(value, list):
        return []
    return [call(item["name"], item.get("arguments", {})) for item in value
            if isinstance(item, dict) and isinstance(item.get("name"), str)]


def call(name: str, arguments: Any) -> dict[str, Any]:
    """One tool call as OpenAI writes it: the arguments are a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


Extract = Callable[[str], "tuple[str | None, list[dict[str, Any]]]"]


async def collect(deltas: AsyncIterator[Delta], extract: Extract) -> AsyncIterator[Delta]:
    """The engine's deltas with the tool calls read out of the answer: the text is held
    until the answer ends (a call is only known whole), then one delta carries the
    content, the calls as JSON (`tool_calls`) and finish reason "tool_calls" when there
    are any. The deltas before it still pass, with empty text: their counts and
    logprobs, and the responses by which a streaming client's departure is noticed (the
    engine then stops, instead of writing to max_tokens for nobody)."""
    texts: list[str] = []
    async for delta in deltas:
        texts.append(delta.text)
        if not delta.finish_reason:
            yield Delta("", None, delta.input_tokens, delta.output_tokens,
                        delta.logprobs, delta.cumulative_logprob)
            continue
        content, calls = extract("".join(texts))
        reason = "tool_calls" if calls and delta.finish_reason == "stop" \
            else delta.finish_reason
        yield Delta(content or "", reason, delta.input_tokens, delta.output_tokens,
                    delta.logprobs, delta.cumulative_logprob,
                    json.dumps(calls, ensure_ascii=False) if calls else None)
        return
