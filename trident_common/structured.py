"""Structured outputs across engines, pure: vLLM's `structured_outputs` sampling value
(StructuredOutputsParams' fields, the name trident's interface uses) in SGLang's words,
and the constraint a forced tool choice adds (tool_calls.py).

The OpenAI frontend maps `response_format` onto `structured_outputs`; a Triton client may
send it itself, or SGLang's own `json_schema` / `regex` / `ebnf` to an SGLang model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trident_common.constraint_bounds import check_constraint
from trident_common.faults import BadRequest
from trident_common.tool_calls import ToolPlan, forced_schema

FIELD = "sampling_parameters.structured_outputs"
# A refusal names the OpenAI parameter the frontend built the constraint from, as the
# `[param] ` tag that starts a client error (error_classes.py).
RESPONSE_FORMAT, TOOLS = "[response_format] ", "[tools] "
# Options of vLLM's that only tune how a backend writes JSON: SGLang has no equivalent,
# and leaving them out changes which valid answers come, never their validity.
_VLLM_TUNING = {
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
}
_ANY_OBJECT = '{"type": "object"}'
_ANY_OBJECT_SCHEMA = {"type": "object"}
_SGLANG_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
# xgrammar's messages start with the time and its source line: not the client's business.
_XGRAMMAR_WHERE = re.compile(r"\[[\d:]+\] \S+?:\d+: ")


def with_tools(values: dict[str, Any], plan: ToolPlan | None) -> tuple[dict[str, Any], str]:
    """The sampling values with a forced tool choice's constraint added, and the tag
    a refusal of the constraint starts with ("" when there is none). One request has
    one constraint: response_format and a forced tool choice together are refused. A
    constraint over constraint_bounds' limits is refused before any engine compiles it."""
    existing = values.get("structured_outputs")
    if existing:
        check_constraint(existing, RESPONSE_FORMAT, FIELD)
    for name in ("json_schema", "regex", "ebnf"):  # SGLang's own, from a Triton client
        if values.get(name):
            check_constraint(values[name], f"[{name}] ", f"sampling_parameters.{name}")
    if plan is None or not plan.forced:
        return values, (RESPONSE_FORMAT if existing else "")
    if existing or any(values.get(name) for name in ("json_schema", "regex", "ebnf")):
        raise BadRequest(
            "[tool_choice] a request may hold one constraint: "
            "response_format (structured outputs) and a forced tool_choice "
            "cannot go together"
        )
    return {**values, "structured_outputs": {"json": forced_schema(plan)}}, TOOLS


def needs_compile(values: dict[str, Any]) -> bool:
    """Whether sampling values hold a constraint an engine has to compile, in vLLM's words
    (structured_outputs) or SGLang's (json_schema, regex, ebnf, structural_tag): any but
    json_object (any JSON object), whose grammar every engine compiles once and keeps."""
    structured = values.get("structured_outputs")
    kinds = {}
    if isinstance(structured, dict):
        kinds = {
            k: v for k, v in structured.items() if k not in _VLLM_TUNING and v not in (None, False)
        }
    kinds.update({name: values[name] for name in _SGLANG_KINDS if values.get(name)})
    if len(kinds) != 1:
        return bool(kinds)
    ((kind, value),) = kinds.items()
    if kind == "json_object":
        return False
    if kind in ("json", "json_schema"):
        try:
            schema = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return True
        return bool(schema != _ANY_OBJECT_SCHEMA)
    return True


def check_json_schema(text: str, tag: str) -> None:
    """SGLang compiles a request's schema in its scheduler and aborts a request whose
    schema fails there; checked here first with xgrammar (SGLang's default grammar
    backend), the refusal names the parameter. Without xgrammar, SGLang's own check
    stands."""
    try:
        import xgrammar
    except ImportError:
        return
    try:
        xgrammar.Grammar.from_json_schema(text)
    except Exception as e:  # xgrammar raises RuntimeError or ValueError, by version
        why = compiler_words(str(e)) or type(e).__name__
        raise BadRequest(
            f"{tag}sampling_parameters.json_schema cannot be compiled: {why}"
        ) from None


def compiler_words(message: str) -> str:
    """A grammar compiler's message without where in its source it was raised (xgrammar
    starts with the time and a C++ file and line: not the client's business)."""
    return _XGRAMMAR_WHERE.sub("", message.strip())[:300]


def to_sglang(structured: object) -> dict[str, str]:
    """vLLM's structured_outputs as SGLang sampling values (json_schema as text, regex,
    ebnf, structural_tag); raises BadRequest for what SGLang cannot take."""
    if not isinstance(structured, dict):
        raise BadRequest(f"{RESPONSE_FORMAT}{FIELD} must be a JSON object")
    kinds = {
        k: v for k, v in structured.items() if k not in _VLLM_TUNING and v not in (None, False)
    }
    if len(kinds) != 1:
        raise BadRequest(
            f"{RESPONSE_FORMAT}{FIELD} must hold exactly one of json, "
            "json_object, regex, choice, grammar, structural_tag; got "
            f"{sorted(kinds) or 'none'}"
        )
    ((kind, value),) = kinds.items()
    if kind == "json":
        return {"json_schema": value if isinstance(value, str) else json.dumps(value)}
    if kind == "json_object":
        return {"json_schema": _ANY_OBJECT}
    if kind == "regex" and isinstance(value, str):
        return {"regex": value}
    if (
        kind == "choice"
        and isinstance(value, list)
        and value
        and all(isinstance(v, str) for v in value)
    ):
        return {"regex": "(" + "|".join(re.escape(v) for v in value) + ")"}
    if kind == "grammar" and isinstance(value, str):
        return {"ebnf": value}
    if kind == "structural_tag":
        return {"structural_tag": value if isinstance(value, str) else json.dumps(value)}
    raise BadRequest(
        f"{RESPONSE_FORMAT}{FIELD}.{kind}: not a value SGLang's structured outputs take"
    )
