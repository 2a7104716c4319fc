"""OpenAI's HTTP requests as plain Python: request JSON -> a Generation.

Pure (no I/O, no Triton). The body is validated by its endpoint's pydantic model
(schema.py: every field's type and bounds, unknown fields refused), with the runtime
limits (messages, characters) as the validation context; the first error becomes
OpenAI's 400 naming the parameter at fault (`{"error": {"message", "type", "param",
"code"}}`). The body's size and depth are bounded before it is parsed (limits.py,
app.py). Sampling goes out under vLLM's names (what trident's engine models read from
`sampling_parameters`), and routing hints come from the body (`extra_body`) or
`X-Trident-*` headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from builder.serve.openai import tools as chat_tools
from builder.serve.openai.errors import OpenAIError, invalid
from builder.serve.openai.limits import Limits
from builder.serve.openai.schema import (
    EXTRAS,
    HINTS,
    RULES,
    TENANT_ONLY,
    UNSUPPORTED,
    UNSUPPORTED_RULES,
    ChatRequest,
    CompletionRequest,
    Message,
    NamedToolChoice,
    Refusal,
    _Request,
)
from builder.serve.openai.structured import structured_outputs

DEFAULT_LIMITS = Limits()
HINT_HEADER_PREFIX = "x-trident-"  # x-trident-route, x-trident-conversation-id ...
ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
REFUSED_BY_NAME = frozenset({*UNSUPPORTED, *TENANT_ONLY})
# The fields that become sampling values, in the order they are sent.
SAMPLED = (
    "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "stop",
    "logit_bias", *EXTRAS,
)  # fmt: skip


@dataclass(frozen=True)
class Generation:
    """One request, ready to become Triton inputs."""

    kind: str  # "chat" or "completion"
    model: str
    prompt: str | None = None  # completions: text_input
    messages: list | None = None  # chat: the messages tensor (the engine templates)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the engine's default
    sampling: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)
    echo: bool = False  # completions: the prompt before the answer
    max_tokens_param: str = "max_tokens"  # the field max_tokens came from (for errors)
    lora_name: str | None = None  # the adapter the client named (None: base model)
    tools: list | None = None  # chat: OpenAI's tools (tools.py)
    tool_choice: str | None = None  # none / auto / required / a function's name
    n: int = 1  # choices asked for (each a generation of its own)
    # One of the n choices: (the fan-out's group id, this choice's index), which a router
    # with tenants reads to admit the n together (choices.py); None for the request itself.
    choice: tuple[str, int] | None = None
    # Logprobs asked for: how many alternatives per token beside the sampled one (chat's
    # top_logprobs, completions' logprobs); None: no logprobs.
    logprobs: int | None = None


def parse_chat(
    body: Any, headers: Mapping[str, str] = {}, limits: Limits = DEFAULT_LIMITS
) -> Generation:
    request = _validated(ChatRequest, body, limits, "chat")
    assert isinstance(request, ChatRequest)
    common = _common(request, headers)
    fmt = request.response_format
    if fmt is not None:  # response_format, under vLLM's name (structured.py)
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        structured = structured_outputs(fmt.type, schema)
        if structured is not None:
            common["sampling"]["structured_outputs"] = structured
    top = request.top_logprobs
    # max_completion_tokens (OpenAI's newer name) wins; both were checked.
    max_tokens, param = request.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = request.max_tokens, "max_tokens"
    return Generation(
        "chat",
        request.model,
        messages=[_engine_message(m) for m in request.messages],
        logprobs=top if top is not None else (0 if request.logprobs else None),
        # the client's own tools (description, strict ... kept), once checked
        tools=body["tools"] if request.tools is not None else None,
        tool_choice=_tool_choice(request),
        max_tokens=max_tokens,
        max_tokens_param=param,
        **common,
    )


def parse_completion(
    body: Any, headers: Mapping[str, str] = {}, limits: Limits = DEFAULT_LIMITS
) -> Generation:
    request = _validated(CompletionRequest, body, limits, "completion")
    assert isinstance(request, CompletionRequest)
    return Generation(
        "completion",
        request.model,
        prompt=request.prompt,
        echo=request.echo,
        logprobs=request.logprobs,
        max_tokens=request.max_tokens,
        **_common(request, headers),
    )


def _validated(model: type[_Request], body: Any, limits: Limits, kind: str) -> _Request:
    try:
        return model.model_validate(body, context={"limits": limits})
    except ValidationError as error:
        raise refusal(error, body, kind) from None


# -- request parts --------------------------------------------------------------------------


def _engine_message(message: Message) -> dict:
    return {
        "role": ROLES[message.role],
        "content": message.content,
        **chat_tools.history(message.role, message.tool_calls, message.tool_call_id),
    }


def _tool_choice(request: ChatRequest) -> str | None:
    """The tool_choice input: none / auto (OpenAI's default with tools) / required / the
    function's name; None when the request names no tools."""
    choice = request.tool_choice
    if request.tools is None:
        return None
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    return choice or "auto"


def _common(request: _Request, headers: Mapping[str, str]) -> dict:
    options = request.stream_options
    return {
        "stream": request.stream,
        "include_usage": options is not None and options.include_usage,
        "n": 1 if request.n is None else request.n,
        "sampling": sampling(request),
        "hints": hints(request, headers),
        "lora_name": request.lora_name,
    }


def sampling(request: _Request) -> dict:
    """The request's sampling values under vLLM's names."""
    given = request.model_fields_set  # a request sets a few of the many fields
    out: dict[str, Any] = {}
    for name in SAMPLED:
        if name in given and (value := getattr(request, name)) is not None:
            out[name] = value
    stop = out.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop == []:
        del out["stop"]
    if "logit_bias" in out:
        out["logit_bias"] = {int(k): v for k, v in out["logit_bias"].items()}
    return out


def hints(request: _Request, headers: Mapping[str, str]) -> dict:
    """Routing hints: extra_body fields first, then X-Trident-<Name> headers."""
    given = request.model_fields_set
    out = {name: getattr(request, name) for name in HINTS if name in given}
    out = {name: value for name, value in out.items() if value is not None}
    if len(out) == len(HINTS):
        return out
    sent = {}  # the X-Trident-* headers by the hint they name (the last of a name wins)
    for key, value in headers.items():
        key = key.lower()
        if key.startswith(HINT_HEADER_PREFIX):
            sent[key[len(HINT_HEADER_PREFIX) :].replace("-", "_")] = value
    for name in HINTS:
        if name not in out and (header := sent.get(name)) is not None:
            if not isinstance(header, str) or not header:
                raise invalid(name, RULES["chat"][name])
            out[name] = header
    return out


# -- validation errors as OpenAI's ----------------------------------------------------------


def refusal(error: ValidationError, body: Any, kind: str) -> OpenAIError:
    """A validation error as OpenAI's 400, one line for its first problem. A field refused
    by name (one trident does not serve, a tenant input) or an unknown one comes before
    the others: a misspelt or unserved field may be what the rest depends on."""
    errors = error.errors(include_url=False)
    named = [e for e in errors if len(e["loc"]) == 1 and e["loc"][0] in REFUSED_BY_NAME]
    unknown = [e["loc"][0] for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
    if unknown and not named:
        name = str(unknown[0])
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return invalid(
            _bounded(name),
            f"unknown parameter {_show(name, 80)}{more}: {PATHS[kind]} takes "
            "OpenAI's parameters and trident's extensions (docs/openai.md, Parameters)",
            "unknown_parameter",
        )
    first = (named or errors)[0]
    # The path without union tags (pydantic's `str`, `list[...]`, schema.py's tags):
    # field names and list indexes.
    place = [p for p in first["loc"] if isinstance(p, int) or p.isidentifier()]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, Refusal):
        owner = _path(place)
        param = cause.param or (f"{owner}.{cause.below}" if cause.below else owner)
        message = cause.message.replace("{param}", param).replace("{owner}", owner)
        return invalid(param or None, message.replace("{detail}", cause.detail), cause.code)
    rules = RULES[kind]
    while _path(place, "[]") not in rules:  # "" (the body itself) is always there
        place = place[:-1]
    pattern, param = _path(place, "[]"), _path(place)
    got = _show(_value_at(body, place))
    message = rules[pattern].replace("{param}", param).replace("{got}", got)
    code = "unsupported_parameter" if pattern in UNSUPPORTED_RULES else "invalid_value"
    return invalid(param or None, message, code)


def _path(place: list, index: str | None = None) -> str:
    """`messages[2].content`; with `index`, every index written as it (`messages[]`)."""
    out = ""
    for part in place:
        if isinstance(part, int):
            out += index or f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _value_at(body: Any, place: list) -> Any:
    for part in place:
        if isinstance(body, dict):
            body = body.get(part)
        elif isinstance(body, list) and isinstance(part, int) and part < len(body):
            body = body[part]
        else:
            return None
    return body


def _bounded(name: str, limit: int = 100) -> str:
    """A client's field name as `param`, cut to a length fit to send back."""
    return name if len(name) <= limit else name[:limit] + "..."


def _show(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
