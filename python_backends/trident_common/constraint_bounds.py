"""How large a constraint an engine model passes on to its engine: a structured-output
schema (or regex, grammar, choice list) and a request's tools. Pure.

Why: the engines compile a constraint into a grammar before the first token, in the
same process and on the same cores that serve every other request. On main (issue 34) a
`response_format` enum of 100,000 strings and an `anyOf` of 2,000 ran past the router's
timeouts on both replicas, a trivial `json_object` request behind them timed out too,
5,000 tools with `required` took 43 s, and the vLLM processes grew by 3 GB without
coming back. A constraint over these bounds is the client's error (400, naming the
parameter it came from), refused before the engine sees it. The numbers are OpenAI's
published limits for structured outputs and tools, which the clients of an OpenAI API
are written against, except the width of one anyOf/oneOf/allOf, which OpenAI does not
state: 128 alternatives compile in well under a second with xgrammar.
"""

from __future__ import annotations

import json
from typing import Any

from trident_common.faults import BadRequest

MAX_CONSTRAINT_CHARS = 120_000  # a schema's (or grammar's) text, as JSON
MAX_ENUM_VALUES = 1_000  # enum and const values across one schema (a choice list too)
MAX_PROPERTIES = 5_000  # object properties across one schema
MAX_ALTERNATIVES = 128  # members of one anyOf / oneOf / allOf
MAX_TOOLS = 128  # functions in one request
_ALTERNATIVES = ("anyOf", "oneOf", "allOf")


def check_constraint(value: Any, tag: str, what: str) -> None:
    """Raise BadRequest (its message starting with `tag`, the parameter) when the
    constraint `value` (parsed JSON, or JSON text, or a regex or grammar string) is over
    a bound. `what` names it in the message."""
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise BadRequest(
            f"{tag}{what} is {len(text)} characters, more than the {MAX_CONSTRAINT_CHARS} "
            "an engine compiles"
        )
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return  # a regex or a grammar: its length is its bound
    check_schema_size(value, tag, what)


def check_schema_size(schema: Any, tag: str, what: str) -> None:
    """The bounds on enum values, properties and alternatives, over the whole schema."""
    enums = properties = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("enum"), list):
            enums += len(node["enum"])
        if "const" in node:
            enums += 1
        if isinstance(node.get("properties"), dict):
            properties += len(node["properties"])
        for key in _ALTERNATIVES:
            members = node.get(key)
            if isinstance(members, list) and len(members) > MAX_ALTERNATIVES:
                raise BadRequest(
                    f"{tag}{what} has an {key} of {len(members)} schemas, more than "
                    f"{MAX_ALTERNATIVES}"
                )
        stack.extend(node.values())
    if enums > MAX_ENUM_VALUES:
        raise BadRequest(f"{tag}{what} has {enums} enum values in all, more than {MAX_ENUM_VALUES}")
    if properties > MAX_PROPERTIES:
        raise BadRequest(
            f"{tag}{what} has {properties} object properties in all, more than {MAX_PROPERTIES}"
        )


def check_tool_count(tools: list[Any], tag: str) -> None:
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"{tag}a request may name {MAX_TOOLS} tools at most, not {len(tools)}")
