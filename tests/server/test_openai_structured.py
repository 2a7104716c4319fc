"""response_format end to end: the real openai SDK (sync and async, streamed and not)
against the real OpenAI frontend, tritonserver and trident's router, in front of real
vLLM (SmolLM2, the session's default server) and the SGLang model on its double
(support/fake_sglang.py writes a value of the schema it was given, as constrained
decoding would). Every json_schema answer is validated against its schema (jsonschema):
50 varied schemas per engine, all of them must hold. A schema no engine can compile is a
400 naming response_format.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import jsonschema
import openai
import pytest

from tests.server.client_matrix import engine_modes
from tests.server.test_openai_conformance import (  # noqa: F401  (fixtures)
    ENGINES,
    ask,
    frontends,
    servers,
    sync_client,
    url,
)

pytestmark = [pytest.mark.server, pytest.mark.vllm]

# Parts the schemas are made of: each bounded (lengths, ranges, item counts), so a valid
# answer fits in max_tokens even when a small model rambles inside a string.
FIELDS = [
    ("name", {"type": "string", "maxLength": 12}),
    ("age", {"type": "integer", "minimum": 0, "maximum": 120}),
    ("ok", {"type": "boolean"}),
    ("color", {"enum": ["red", "green", "blue"]}),
    ("score", {"type": "number", "minimum": 0, "maximum": 1}),
    (
        "tags",
        {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "minItems": 1,
            "maxItems": 3,
        },
    ),
    (
        "point",
        {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -9, "maximum": 9},
                "y": {"type": "integer", "minimum": -9, "maximum": 9},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    ),
    ("kind", {"const": "item"}),
    ("note", {"type": ["string", "null"], "maxLength": 10}),
    (
        "level",
        {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 5}, {"enum": ["low", "high"]}]},
    ),
    ("size", {"$ref": "#/$defs/size"}),
    ("city", {"type": "string", "enum": ["Paris", "Oslo", "Rome", "Lima"]}),
]
DEFS = {"size": {"enum": ["S", "M", "L"]}}


def picks() -> list[tuple]:
    """Which fields each of the 50 schemas has: each field alone, 22 pairs, 16 triples
    (spread over all the pairs and triples)."""
    singles = list(itertools.combinations(range(len(FIELDS)), 1))
    pairs = list(itertools.combinations(range(len(FIELDS)), 2))[::3]
    triples = list(itertools.combinations(range(len(FIELDS)), 3))[::14]
    return (singles + pairs + triples)[:50]


def schema(i: int, fields: tuple) -> dict:
    """Every field required and nothing else allowed (what OpenAI's strict mode asks of
    a schema); every tenth a list of such objects."""
    picked = dict(FIELDS[f] for f in fields)
    out = {
        "type": "object",
        "properties": picked,
        "required": sorted(picked),
        "additionalProperties": False,
    }
    if i % 10 == 9:
        out = {"type": "array", "items": out, "minItems": 1, "maxItems": 2}
    return {**out, "$defs": DEFS} if "size" in picked else out


SCHEMAS = [schema(i, fields) for i, fields in enumerate(picks())]


def json_schema_format(i: int) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": f"answer_{i}", "schema": SCHEMAS[i], "strict": True},
    }


def test_the_fifty_schemas_are_valid_and_varied():
    for item in SCHEMAS:
        jsonschema.validators.validator_for(item).check_schema(item)
    assert len({json.dumps(s, sort_keys=True) for s in SCHEMAS}) == 50


@pytest.mark.parametrize("engine", ENGINES)
def test_every_json_schema_answer_validates(url, engine):  # noqa: F811
    """All 50 schemas, eight requests at a time (the async SDK): 100% must validate."""

    async def one(client, i, gate):
        async with gate:
            answer = await client.chat.completions.create(
                model="router",
                temperature=0,
                max_tokens=200,
                messages=[{"role": "user", "content": "Describe a thing as JSON."}],
                response_format=json_schema_format(i),
            )
        return i, answer.choices[0]

    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        gate = asyncio.Semaphore(8)
        try:
            return await asyncio.gather(*(one(client, i, gate) for i in range(50)))
        finally:
            await client.close()

    failures = []
    for i, choice in asyncio.run(main()):
        try:
            jsonschema.validate(json.loads(choice.message.content), SCHEMAS[i])
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append((i, choice.finish_reason, choice.message.content, str(e)[:80]))
    assert failures == []


def content(answer) -> str:
    if isinstance(answer, list):
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return answer.choices[0].message.content


@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_json_object_and_schema_in_every_client_mode(url, engine, mode, stream):  # noqa: F811
    answer = ask(url, "chat", mode, stream, max_tokens=200, response_format=json_schema_format(3))
    jsonschema.validate(json.loads(content(answer)), SCHEMAS[3])
    whole = ask(url, "chat", mode, stream, max_tokens=60, response_format={"type": "json_object"})
    text = content(whole)
    finish = whole[-1].choices[0].finish_reason if stream else whole.choices[0].finish_reason
    if finish == "stop":  # a JSON object cut by max_tokens is not one
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_schema_no_backend_compiles_is_a_400_naming_it(url, engine):  # noqa: F811
    # Valid JSON Schema (the frontend's check passes), but no value can hold it: neither
    # xgrammar nor llguidance makes a grammar of it.
    bad = {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
        "required": ["a"],
    }
    with pytest.raises(openai.BadRequestError) as caught:
        sync_client(url).chat.completions.create(
            model="router",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}},
        )
    assert caught.value.body["param"] == "response_format"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_schema_over_the_bounds_is_a_400_at_once_and_the_next_request_is_served(url, engine):  # noqa: F811
    """Issue 34: an enum of thousands ran past the timeouts on every replica, and a
    json_object request after it timed out too. Refused before the engine compiles it
    (trident_common/constraint_bounds.py)."""
    huge = {"type": "object", "properties": {"c": {"enum": [f"v{i}" for i in range(2_000)]}}}
    client = sync_client(url)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="router",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": huge}},
        )
    assert time.monotonic() - started < 10
    assert caught.value.body["param"] == "response_format"
    assert "2000 enum values in all, more than 1000" in caught.value.body["message"]
    after = client.chat.completions.create(
        model="router",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=20,
        response_format={"type": "json_object"},
    )
    assert after.choices[0].finish_reason in ("stop", "length")
