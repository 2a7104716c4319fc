"""OpenAI's `response_format` as vLLM's `structured_outputs` sampling value, the name
trident's interface uses (the SGLang model translates it: trident_common/structured.py),
and the JSON Schema check of a schema a request carries (response_format's, a tool's
parameters). Pure. The request's shape is its model's check (schema.py); a schema is
checked as JSON Schema here (cheap, and the answer names what is wrong); whether the
engine can compile it is the engine model's check, which also answers 400
`[response_format]`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

# A client sends the same tools and formats request after request, and checking a schema
# against its metaschema costs ~0.5 ms: the verdicts on schemas up to this size (as JSON
# text) are kept, CACHED_SCHEMAS of them, so the cache holds 4 MiB at most.
CACHED_SCHEMA_CHARS = 16 * 2**10
CACHED_SCHEMAS = 256


def structured_outputs(kind: str, schema: Any) -> dict | None:
    """The `structured_outputs` value for a response_format of this type (None: text)."""
    if kind == "text":
        return None
    if kind == "json_object" or schema is None:  # no schema: OpenAI's any JSON object
        return {"json_object": True}
    # strict or not, the engine holds the answer to the schema: constrained decoding
    # is all-or-nothing, and a schema it holds the answer to is what strict asks for.
    return {"json": schema}


def schema_problem(schema: Any) -> str | None:
    """What is wrong with `schema` as a JSON Schema (by the draft it names, else
    2020-12), as the end of a sentence naming it; None when it is a valid one."""
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    key = json.dumps(schema, sort_keys=True)
    if len(key) > CACHED_SCHEMA_CHARS:
        return _problem(schema)
    return _cached_problem(key)


@lru_cache(maxsize=CACHED_SCHEMAS)
def _cached_problem(key: str) -> str | None:
    return _problem(json.loads(key))


def _problem(schema: dict) -> str | None:
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        return f"is not a valid JSON Schema{' at ' + where if where else ''}: {e.message[:200]}"
    return None
