"""OpenAI's request bodies as pydantic models, and what a client is told when a field
fails. Pure.

The shapes follow vLLM's protocol.py (OpenAI's fields, vLLM's sampling extras) with
trident's rules on them: bools are not numbers, numbers are finite, an unknown field is
refused by name (`extra="forbid"`), and so is a field trident does not serve. What a
field must be is declared on the model; what the client is told is RULES' sentence for
that field or a Refusal's (protocol.refusal makes either OpenAI's 400), so a pydantic
message (its wording, its help URL) never reaches a client. The runtime limits
(messages, characters) come in as the validation context.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from builder.serve.openai.limits import INT32_MAX, Limits
from builder.serve.openai.structured import schema_problem
from trident_common import interface as _INTERFACE

# Router inputs a request may set; the body wins over the header of the same name.
HINTS: tuple[str, ...] = tuple(_INTERFACE.HINT_NAMES)
# The engine's tenant inputs (priority, cache_salt): the router sets them from the spec's
# tenants, never from a request, so a body field of these names is refused (not dropped).
TENANT_ONLY: tuple[str, ...] = tuple(tensor.name for tensor in _INTERFACE.TENANT_INPUTS)
# OpenAI fields with no equivalent here: refused with a 400 naming them, never ignored.
UNSUPPORTED = {
    "functions": "function calling (use tools)",
    "audio": "audio output",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
    "suffix": "suffix (text to insert before: the engines only continue a prompt, "
    "they do not fill in between a prefix and a suffix)",
}
# vLLM sampling extras that vLLM's own OpenAI server also takes from the body.
EXTRAS = (
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens",
)  # fmt: skip
# How many choices (n) one request may ask for: each is one generation in the engine
# (fan-out, answers.py), so n multiplies the work a request costs.
MAX_N = 16
# OpenAI's bounds: top_logprobs (chat) 0..20, logprobs (completions) 0..5.
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5
# A LoRA adapter's name (trident's spec allows letters, digits, `_`, `-`, `.`).
ADAPTER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
ROLE_NAMES = ("system", "developer", "user", "assistant", "tool")  # Message.role's


class Refusal(ValueError):
    """A rule a validator checks in code, with its own sentence. `{param}` in it becomes
    the field's path, `{owner}` the path of the object holding the field (`below` names
    the field under the error's place), `{detail}` the client's words (put in last);
    `param` names the field outright for a rule across fields."""

    def __init__(
        self,
        message: str,
        code: str = "invalid_value",
        *,
        below: str | None = None,
        param: str | None = None,
        detail: str = "",
    ):
        super().__init__(message)
        self.message, self.code = message, code
        self.below, self.param, self.detail = below, param, detail


_DEFAULT_LIMITS = Limits()


def _limits(info: ValidationInfo) -> Limits:
    """The runtime limits (protocol.py passes them as the context; tests may not)."""
    context = info.context
    return context["limits"] if context else _DEFAULT_LIMITS


def _unsupported(value: Any, info: ValidationInfo) -> None:
    if value not in (None, [], False):
        name = info.field_name or ""
        raise Refusal(f"{UNSUPPORTED[name]} is not supported", "unsupported_parameter")


def _tenant_only(value: Any, info: ValidationInfo) -> None:
    raise Refusal(
        f"'{info.field_name}' is set by the router from the tenant (the spec's tenants), "
        "never by a request",
        "unsupported_parameter",
    )


Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Penalty = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2, le=2)]
Tokens = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]
NonEmpty = Annotated[str, Field(strict=True, min_length=1)]
Name = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Unsupported = Annotated[Any, AfterValidator(_unsupported)]
TenantOnly = Annotated[Any, AfterValidator(_tenant_only)]


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


def _text_or_parts(value: Any) -> str:
    return "text-parts" if isinstance(value, list) else "a-string"


# A string or text parts, tried as the one its JSON type says: a bad part is named
# (`messages[0].content[1]`), not lost among both shapes' errors. The tags are no
# identifiers, so the field's path in an error leaves them out (protocol.refusal).
Content = Annotated[
    Annotated[StrictStr, Tag("a-string")] | Annotated[list[TextPart], Tag("text-parts")],
    Discriminator(_text_or_parts),
]


class CalledFunction(BaseModel):
    name: StrictStr
    arguments: StrictStr  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    id: Any = None
    function: CalledFunction


class Message(BaseModel):
    """One turn. Its text parts are joined into one string; other fields (`name`) are
    dropped, as the chat templates take role, content and the tool parts only."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None  # text parts are joined (_complete)
    tool_calls: list[ToolCall] | None = None  # the assistant's earlier calls
    tool_call_id: Any = None  # a tool's answer: the call it answers

    @model_validator(mode="after")
    def _complete(self, info: ValidationInfo) -> Message:
        if self.role == "tool" and not (self.tool_call_id and isinstance(self.tool_call_id, str)):
            raise Refusal(
                "{owner}: a tool message needs the tool_call_id of the call it answers",
                below="tool_call_id",
            )
        content = self.content
        if isinstance(content, list):
            content = self.content = "\n".join(part.text for part in content)
        if content is None and self.role == "assistant" and self.tool_calls is not None:
            content = self.content = ""  # an assistant turn that only called tools
        if content is None:
            raise Refusal("{owner} has no content", below="content")
        limit = _limits(info).max_message_chars
        if len(content) > limit:
            raise too_long(len(content), limit, below="content")
        return self


def too_long(size: int, limit: int, below: str | None = None) -> Refusal:
    return Refusal(
        f"{{param}} is {size} characters, more than the limit of {limit}", "too_long", below=below
    )


class FunctionTool(BaseModel):
    name: Name
    parameters: Any = None  # a JSON Schema (checked only when given, null included)

    @field_validator("parameters")
    @classmethod
    def _schema(cls, parameters: Any) -> Any:
        _check_schema(parameters)
        return parameters


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionTool


class NamedFunction(BaseModel):
    name: StrictStr


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchema(BaseModel):
    name: Name
    strict: StrictBool | None = None
    # `schema` is BaseModel's (deprecated) method: the field takes the name as its alias.
    schema_: Any = Field(None, alias="schema")

    @field_validator("schema_")
    @classmethod
    def _schema(cls, schema: Any) -> Any:
        if schema is not None:  # null: OpenAI's default, any JSON object
            _check_schema(schema)
        return schema


JSON_SCHEMA_SHAPE = "'response_format.json_schema' must be an object with 'name' and 'schema'"


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _complete(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise Refusal(JSON_SCHEMA_SHAPE, below="json_schema")
        return self


def _check_schema(schema: Any) -> None:
    problem = schema_problem(schema)
    if problem is not None:
        raise Refusal("'{param}' {detail}", detail=problem)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Request(BaseModel):
    """The fields both endpoints take: OpenAI's, vLLM's sampling extras, trident's
    adapter and routing hints, and the tenant inputs (to refuse them by name)."""

    model_config = ConfigDict(extra="forbid")

    model: NonEmpty
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_N)] | None = None
    max_tokens: Tokens | None = None
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Field(strict=True, ge=-(2**63), lt=2**64)] | None = None
    stop: StrictStr | list[NonEmpty] | None = None
    # Token ids in ASCII digits (pydantic's patterns are Rust's: `[0-9]`, never '²').
    logit_bias: (
        dict[
            Annotated[str, Field(pattern=r"^[0-9]+$")],
            Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-100, le=100)],
        ]
        | None
    ) = None
    # `user` names the end user to OpenAI's abuse monitoring: checked, then not used (no
    # tenant, no hint) and not logged (it may be personal data).
    user: StrictStr | None = None
    top_k: StrictInt | None = None
    min_p: Finite | None = None
    repetition_penalty: Finite | None = None
    min_tokens: StrictInt | None = None
    ignore_eos: StrictBool | None = None
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    # the adapter, as vllm_backend's clients name it
    lora_name: Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_.-]{1,128}$")] | None = None
    route: NonEmpty | None = None
    task: NonEmpty | None = None
    family: NonEmpty | None = None
    tenant: NonEmpty | None = None
    tier: NonEmpty | None = None
    conversation_id: NonEmpty | None = None
    shared_prefix: NonEmpty | None = None
    priority: TenantOnly = None
    cache_salt: TenantOnly = None

    @model_validator(mode="after")
    def _streamed(self) -> _Request:
        if self.stream_options is not None and not self.stream:
            raise Refusal(RULES_BOTH["stream_options"], param="stream_options")
        return self


def _counted(messages: Any, info: ValidationInfo) -> Any:
    """The count is checked before a message is: a long list costs nothing more."""
    limit = _limits(info).max_messages
    if isinstance(messages, list) and len(messages) > limit:
        raise Refusal(
            f"'messages' holds {len(messages)} messages, more than the limit of {limit}",
            "too_many_messages",
        )
    return messages


class ChatRequest(_Request):
    """POST /v1/chat/completions. OpenAI's bookkeeping and features with no engine
    counterpart (metadata ... verbosity, function_call without functions) are taken and
    not acted on."""

    messages: Annotated[list[Message], Field(min_length=1), BeforeValidator(_counted)]
    max_completion_tokens: Tokens | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    modalities: Annotated[list[Literal["text"]], Field(min_length=1, max_length=1)] | None = None
    functions: Unsupported = None
    audio: Unsupported = None
    prediction: Unsupported = None
    web_search_options: Unsupported = None
    function_call: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None
    moderation: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None

    @model_validator(mode="after")
    def _together(self) -> ChatRequest:
        """The rules across fields: tool_choice against the tools, top_logprobs."""
        choice = self.tool_choice
        if self.tools is None and choice not in (None, "none"):
            raise Refusal("'tool_choice' needs 'tools'", param="tool_choice")
        if self.parallel_tool_calls is False and choice == "required" and self.tools:
            # A forced choice's schema takes one call or more (tool_calls.forced_schema).
            raise Refusal(
                "parallel_tool_calls=false with tool_choice 'required' is not supported",
                "unsupported_parameter",
                param="parallel_tool_calls",
            )
        if isinstance(choice, NamedToolChoice) and self.tools is not None:
            name = choice.function.name
            if name not in {tool.function.name for tool in self.tools}:
                raise Refusal(
                    f"'tool_choice' names function {name[:64]!r}, which is not among the tools",
                    param="tool_choice",
                )
        if self.top_logprobs is not None and not self.logprobs:
            raise Refusal("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return self


def _one_prompt(prompt: Any) -> Any:
    """A list of one string is that string (what the openai SDK may send)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    return prompt


def _prompt_size(prompt: str, info: ValidationInfo) -> str:
    if not prompt:
        raise Refusal("'prompt' is empty")
    limit = _limits(info).max_message_chars
    if len(prompt) > limit:
        raise too_long(len(prompt), limit)
    return prompt


class CompletionRequest(_Request):
    """POST /v1/completions."""

    prompt: Annotated[StrictStr, BeforeValidator(_one_prompt), AfterValidator(_prompt_size)]
    echo: StrictBool = False  # the prompt before the answer
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    best_of: Literal[1] | None = None
    suffix: Unsupported = None

    @model_validator(mode="after")
    def _together(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            # OpenAI's echo with logprobs scores the prompt's tokens too; the engine
            # models return the logprobs of generated tokens only.
            raise Refusal(
                "'echo' with 'logprobs' is not supported: the engines "
                "return logprobs for generated tokens only, not for the prompt",
                "unsupported_parameter",
                param="echo",
            )
        return self


MODELS: dict[str, type[_Request]] = {"chat": ChatRequest, "completion": CompletionRequest}
# Every body field an endpoint knows (OpenAI's for it, trident's extensions, the tenant
# inputs to refuse): any other is a 400 `unknown_parameter` naming it.
KNOWN_FIELDS = {
    kind: frozenset(field.alias or name for name, field in model.model_fields.items())
    for kind, model in MODELS.items()
}

# What a client is told about a field that fails its type or bounds: `{param}` is the
# field's path (`messages[2].content`), `{got}` its value, cut short. A path not listed
# takes the sentence of the nearest listed field above it.
_SAMPLING_EXTRAS = {name: f"'{name}' has the wrong type: {{got}}" for name in EXTRAS}
RULES_BOTH = {
    "": "the request body must be a JSON object",
    "model": "'model' must name a model (see GET /v1/models)",
    "stream": "'stream' must be a boolean",
    "stream_options": "'stream_options' is an object, only with stream=true",
    "stream_options.include_usage": "'include_usage' must be a boolean",
    "n": f"'n' must be an integer from 1 to {MAX_N}, got {{got}}",
    "max_tokens": f"'max_tokens' must be an integer from 1 to {INT32_MAX}, got {{got}}",
    "temperature": "'temperature' must be a number from 0 to 2, got {got}",
    "top_p": "'top_p' must be a number above 0, at most 1, got {got}",
    "presence_penalty": "'presence_penalty' must be a number from -2 to 2, got {got}",
    "frequency_penalty": "'frequency_penalty' must be a number from -2 to 2, got {got}",
    "seed": "'seed' must be an integer, got {got}",
    "stop": "'stop' must be a string or a list of non-empty strings",
    "logit_bias": "'logit_bias' maps token ids to numbers from -100 to 100",
    "user": "'user' must be a string, got {got}",
    "lora_name": "'lora_name' must name an adapter (letters, digits, '_', '-', '.'), got {got}",
    **_SAMPLING_EXTRAS,
    **{name: f"'{name}' must be a non-empty string" for name in HINTS},
}
_CHAT = {
    "messages": "'messages' must be a non-empty list of messages",
    "messages[]": "{param} must be an object with 'role' and 'content'",
    "messages[].role": f"{{param}} must be one of {', '.join(ROLE_NAMES)}, got {{got}}",
    "messages[].content": "{param} must be a string or a list of text parts",
    "messages[].content[]": '{param}: only text parts ({"type": "text", "text": ...}) '
    "are supported",
    "messages[].tool_calls": "{param} must be a list",
    "messages[].tool_calls[]": '{param} must be {"id", "type": "function", "function": '
    '{"name", "arguments"}}',
    "max_completion_tokens": "'max_completion_tokens' must be an integer from 1 to "
    f"{INT32_MAX}, got {{got}}",
    "logprobs": "'logprobs' must be a boolean, got {got}",
    "top_logprobs": f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {{got}}",
    "tools": "'tools' must be a non-empty list of function tools",
    "tools[]": '{param} must be {"type": "function", "function": {...}} '
    "(only function tools are supported)",
    "tools[].function.name": "{param} must be 1 to 64 letters, digits, '_' or '-'",
    "tool_choice": "'tool_choice' must be none, auto, required or "
    '{"type": "function", "function": {"name": ...}}',
    "parallel_tool_calls": "'parallel_tool_calls' must be a boolean",
    "response_format": "'response_format' must be an object with a 'type'",
    "response_format.type": "'response_format.type' must be text, json_object or "
    "json_schema, got {got}",
    "response_format.json_schema": JSON_SCHEMA_SHAPE,
    "response_format.json_schema.name": "'json_schema.name' must be 1 to 64 letters, "
    "digits, '_' or '-'",
    "response_format.json_schema.strict": "'json_schema.strict' must be a boolean",
    "modalities": "only the text modality is supported",
}
_COMPLETION = {
    "prompt": "'prompt' must be a string (or a list of one string); batches and token ids "
    "are not supported",
    "echo": "'echo' must be a boolean",
    "logprobs": f"'logprobs' must be an integer from 0 to {MAX_COMPLETION_LOGPROBS}, got {{got}}",
    "best_of": "only best_of=1 is supported",
}
RULES = {"chat": {**RULES_BOTH, **_CHAT}, "completion": {**RULES_BOTH, **_COMPLETION}}
# Rules whose refusal is of something trident does not serve, not a wrong value.
UNSUPPORTED_RULES = frozenset({"modalities", "best_of"})
