"""One JSON value that a JSON Schema accepts: what the SGLang double answers when a
request carries `json_schema` (SGLang holds a real model to the schema with constrained
decoding; the double has no model, so it writes the smallest value the schema allows).

Covers the keywords the tests' schemas use: type (one or a list), properties, required,
items, minItems, enum, const, anyOf / oneOf (the first branch), $ref to #/$defs or
#/definitions, minimum / exclusiveMinimum, minLength. A schema outside that is a
ValueError (the double then aborts the request as SGLang does for a bad grammar).
"""

from __future__ import annotations

from typing import Any


def instance(schema: Any, root: Any = None) -> Any:
    root = schema if root is None else root
    if schema is True or schema == {}:
        return {}
    if not isinstance(schema, dict):
        raise ValueError(f"not a schema: {schema!r}")
    if "$ref" in schema:
        return instance(_resolve(schema["$ref"], root), root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return instance(schema[key][0], root)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: instance(sub, root) for name, sub in props.items()}
    if kind == "array":
        return [instance(schema.get("items", {}), root) for _ in range(schema.get("minItems", 1))]
    if kind == "string":
        return "x" * max(schema.get("minLength", 1), 1)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    raise ValueError(f"unknown type {kind!r}")


def _resolve(ref: str, root: dict) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"only local references: {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node
