"""OpenAI's `response_format` as vLLM's `structured_outputs` sampling value, the name
trident's interface uses (the SGLang model translates it: trident_common/structured.py).
Pure. A schema is checked as JSON Schema here (cheap, and the answer names what is
wrong); whether the engine can compile it is the engine model's check, which also
answers 400 `[response_format]`.
"""

from __future__ import annotations

import re
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from builder.serve.openai.errors import invalid

PARAM = "response_format"
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name


def response_format(body: dict) -> dict | None:
    """The `structured_outputs` value for the request's response_format (None: text)."""
    fmt = body.get(PARAM)
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid(PARAM, "'response_format' must be an object with a 'type'")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise invalid(
            f"{PARAM}.type",
            "'response_format.type' must be text, json_object "
            f"or json_schema, got {str(kind)[:40]!r}",
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid(
            f"{PARAM}.json_schema",
            "'response_format.json_schema' must be an object with 'name' and 'schema'",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise invalid(
            f"{PARAM}.json_schema.name",
            "'json_schema.name' must be 1 to 64 letters, digits, '_' or '-'",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{PARAM}.json_schema.strict", "'json_schema.strict' must be a boolean")
    schema = spec.get("schema")
    if schema is None:  # OpenAI's default: any JSON object
        return {"json_object": True}
    check_schema(schema, f"{PARAM}.json_schema.schema")
    # strict or not, the engine holds the answer to the schema: constrained decoding
    # is all-or-nothing, and a schema it holds the answer to is what strict asks for.
    return {"json": schema}


def check_schema(schema: Any, param: str) -> None:
    """A 400 naming the problem unless `schema` is a valid JSON Schema (by the draft it
    names, else 2020-12)."""
    if not isinstance(schema, dict):
        raise invalid(param, f"'{param}' must be a JSON Schema object")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        raise invalid(
            param,
            f"'{param}' is not a valid JSON Schema"
            f"{' at ' + where if where else ''}: {e.message[:200]}",
        ) from None
