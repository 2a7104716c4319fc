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

Size is not what costs most, though: two features compile far slower than they are long
(xgrammar 0.2.8 with SmolLM2's tokenizer, a 2-core machine). Optional properties (not in
`required`): 250 in one object took 0.2 s, 1,000 took 0.5-2.4 s (by the machine's load),
2,000 took 12 s and 3,000 31 s, while 2,000 required ones took 0.2 s; OpenAI's strict mode
allows none. Repetition counts in a `pattern` ({n}, {n,}, {n,m}): xgrammar's JSON-schema
conversion alone took 0.07 s for a{1,1000}, 0.26 s for a{1,2000}, 1.5-5 s for a{1,5000}
and over two minutes for a{1,50000}, a 42-character schema; and that conversion runs in
the engine model's own event loop too (vLLM's request validation, check_json_schema), where
it stalls every request of the model. A regex or grammar constraint repeats cheaply
(a{1,50000} compiled in 6 ms): only the schema's `pattern`s are counted. Whatever still
compiles too long is cut off by time (compile_bound.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from trident_common.faults import BadRequest

MAX_CONSTRAINT_CHARS = 120_000  # a schema's (or grammar's) text, as JSON
MAX_ENUM_VALUES = 1_000  # enum and const values across one schema (a choice list too)
MAX_PROPERTIES = 5_000  # object properties across one schema
MAX_ALTERNATIVES = 128  # members of one anyOf / oneOf / allOf
MAX_TOOLS = 128  # functions in one request
MAX_OPTIONAL_PROPERTIES = 1_000  # properties not in their object's `required`, across one schema
MAX_PATTERN_REPEATS = 2_000  # the repetition counts of a schema's patterns, summed
_ALTERNATIVES = ("anyOf", "oneOf", "allOf")
# A regex quantifier with a count: {n}, {n,}, {n,m} (not an escaped brace).
_QUANTIFIER = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


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
    """The bounds on enum values, properties (optional ones too), alternatives and
    pattern repetitions, over the whole schema."""
    enums = properties = optional = repeats = 0
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
            required = node.get("required")
            needed = (
                {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
            )
            optional += sum(1 for name in node["properties"] if name not in needed)
        if isinstance(node.get("pattern"), str):
            repeats += pattern_repeats(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            repeats += sum(pattern_repeats(str(key)) for key in node["patternProperties"])
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
    if optional > MAX_OPTIONAL_PROPERTIES:
        raise BadRequest(
            f"{tag}{what} has {optional} optional object properties in all (not in their "
            f"object's required), more than the {MAX_OPTIONAL_PROPERTIES} an engine compiles "
            "in time; required properties cost far less"
        )
    if repeats > MAX_PATTERN_REPEATS:
        raise BadRequest(
            f"{tag}{what} has patterns whose repetition counts add up to "
            f"{repeats}, more than the {MAX_PATTERN_REPEATS} an engine compiles in time"
        )


def pattern_repeats(pattern: str) -> int:
    """The repetition counts of a regex's quantifiers, summed (the larger of n and m)."""
    return sum(max(int(n), int(m or 0)) for n, m in _QUANTIFIER.findall(pattern))


def check_tool_count(tools: list[Any], tag: str) -> None:
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"{tag}a request may name {MAX_TOOLS} tools at most, not {len(tools)}")
