"""The OpenAI frontend's request and answer mapping, without a server."""

from __future__ import annotations

import json

import pytest

from builder.serve.openai.answers import Answer, finish_reason
from builder.serve.openai.errors import OpenAIError, from_triton
from builder.serve.openai.limits import Limits
from builder.serve.openai.protocol import parse_chat, parse_completion

HELLO = [{"role": "user", "content": "Hello"}]


def chat(**body):
    return parse_chat({"model": "router", "messages": HELLO, **body})


def error_of(call, *args, **kwargs) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_chat_maps_sampling_to_vllm_names_and_max_tokens():
    g = chat(
        temperature=0,
        top_p=0.5,
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=-1,
        stop="\n",
        max_completion_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        top_k=5,
        ignore_eos=True,
    )
    assert g.kind == "chat" and g.model == "router" and g.messages == HELLO
    assert g.sampling == {
        "temperature": 0.0,
        "top_p": 0.5,
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": -1.0,
        "stop": ["\n"],
        "top_k": 5,
        "ignore_eos": True,
    }
    assert g.max_tokens == 12 and g.stream and g.include_usage


def test_max_completion_tokens_wins_over_max_tokens_and_defaults_stay_unset():
    assert chat(max_tokens=3, max_completion_tokens=9).max_tokens == 9
    g = chat()
    assert g.max_tokens is None and g.sampling == {} and not g.stream


def test_messages_text_parts_and_developer_role():
    g = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "name": "x",
                },
            ],
        }
    )
    assert g.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
    ]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"seed": "7"}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        # Issue 34: the losing field was not read at all.
        ({"max_completion_tokens": 8, "max_tokens": "lots"}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": 17}, "n"),
        ({"n": "2"}, "n"),
        ({"user": 5}, "user"),
        ({"stop": 5}, "stop"),
        ({"stop": ["", "x"]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        # A digit to str.isdigit, not to int(): was a 500 "frontend error".
        ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),
        ({"route": 5}, "route"),
        ({"top_k": "5"}, "top_k"),
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": ["hi"]}, "messages[0]"),
    ],
)
def test_bad_chat_requests_are_400_naming_the_parameter(body, param):
    error = error_of(chat, **body)
    assert error.status == 400 and error.param == param
    assert error.body()["error"]["type"] == "invalid_request_error"
    assert error.body()["error"]["message"]


def test_a_body_that_is_not_an_object_is_400():
    assert error_of(parse_chat, ["x"]).status == 400


def test_completion_prompt_forms():
    g = parse_completion({"model": "m", "prompt": ["Once"], "max_tokens": 4, "echo": True})
    assert g.kind == "completion" and g.prompt == "Once" and g.max_tokens == 4 and g.echo
    for prompt in (["a", "b"], [1, 2, 3], "", None):
        assert error_of(parse_completion, {"model": "m", "prompt": prompt}).param == "prompt"
    for field, value in (("best_of", 2), ("suffix", "x"), ("logprobs", 6), ("echo", "y")):
        assert (
            error_of(parse_completion, {"model": "m", "prompt": "a", field: value}).param == field
        )


def test_hints_from_body_first_then_headers():
    g = parse_chat(
        {"model": "router", "messages": HELLO, "route": "fast", "conversation_id": "c1"},
        {
            "X-Trident-Route": "slow",
            "X-Trident-Tenant": "acme",
            "x-trident-conversation-id": "c2",
            "Authorization": "Bearer x",
        },
    )
    assert g.hints == {"route": "fast", "tenant": "acme", "conversation_id": "c1"}


def test_finish_reasons():
    assert [finish_reason(r) for r in ("stop", "length", "eos", "", None, "abort")] == [
        "stop",
        "length",
        "stop",
        None,
        None,
        "stop",
    ]


def test_whole_chat_answer_shape():
    answer = Answer(chat(), id="chatcmpl-1", created=5)
    body = answer.whole("Paris.", "stop", 37, 8)
    assert body == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 5,
        "model": "router",
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Paris."},
            }
        ],
        "usage": {"prompt_tokens": 37, "completion_tokens": 8, "total_tokens": 45},
    }


def test_stream_chunks_carry_null_usage_only_when_asked():
    answer = Answer(chat(stream=True, stream_options={"include_usage": True}))
    first = answer.chunk("The", first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "The"}
    assert first["usage"] is None and first["object"] == "chat.completion.chunk"
    last = answer.chunk(None, "length")
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert answer.usage_chunk(3, 4)["choices"] == []
    assert answer.usage_chunk(3, 4)["usage"]["total_tokens"] == 7
    assert "usage" not in Answer(chat(stream=True)).chunk("x")


def test_a_text_chunk_from_the_template_is_the_chunk_json():
    texts = ["Paris", ' "quoted" \\ back', "caf\u00e9 \u4e16\u754c", "\0 nul", "line\n", ""]
    for answer in (
        Answer(chat(stream=True, stream_options={"include_usage": True})),
        Answer(chat(stream=True)),
        Answer(parse_completion({"model": "m", "prompt": "Say", "echo": True, "stream": True})),
    ):
        answer.chunk("first", first=True)
        for text in texts:
            assert answer.text_chunk_json(text) == json.dumps(
                answer.chunk(text), ensure_ascii=False
            )


def test_completion_echo_prefixes_the_prompt_once():
    g = parse_completion({"model": "m", "prompt": "Say", "echo": True, "stream": True})
    answer = Answer(g)
    assert answer.chunk(" hi", first=True)["choices"][0]["text"] == "Say hi"
    assert answer.chunk(" more")["choices"][0]["text"] == " more"
    assert answer.whole(" hi", "stop", 1, 1)["choices"][0]["text"] == "Say hi"
    assert answer.whole(" hi", "stop", 1, 1)["object"] == "text_completion"


@pytest.mark.parametrize(
    "message, status, param",
    [
        ("invalid request: sampling_parameters.seed: expected an integer, got 'x'", 400, "seed"),
        ("[request id: 1] invalid request: messages[0] must be an object", 400, "messages[0]"),
        ("invalid request: max_tokens must be a positive integer", 400, "max_tokens"),
        ("invalid request: invalid sampling_parameters: min_p must be in [0, 1]", 400, "min_p"),
        ("invalid request: [route] unknown route 'x' (valid routes: a)", 400, "route"),
        ("invalid request: [tenant] tenant '%' is not a tenant name", 400, "tenant"),
        ("Request for unknown model: 'x' is not found", 404, "model"),
        ("rate limit: tenant 'alice' is over 3 requests per minute", 429, None),
        ("overloaded: every backend of route 'default' is at its limit", 503, None),
        (
            "unavailable: no backend available for route 'default': smollm2: circuit breaker open",
            503,
            None,
        ),
        # Classes are read from a message's start only: words inside are not a class.
        ("every backend failed before its first token: smollm2: not ready, overloaded", 500, None),
        ("smollm2 failed mid-stream: invalid request: x", 500, None),
        ("Stub process 'smollm2_0_0' is not healthy.", 500, None),  # the engine crashed
        ("vllm error: RuntimeError (boom)", 500, None),
    ],
)
def test_triton_errors_map_to_openai_errors(message, status, param):
    # Before: by loose substrings ("overloaded", "unavailable", "not healthy" anywhere:
    # 503; "bad request: ..." and "unknown route" 500); now by the class's marker.
    error = from_triton(message, "router")
    assert (error.status, error.param) == (status, param)
    assert error.body()["error"]["message"]
    if status == 400:
        assert not error.message.startswith("invalid request")
    if status >= 500:
        assert error.body()["error"]["type"] == "server_error" and "router" in error.message


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [2**31, 2**32 + 5, 2**63, 2**64 + 1])
def test_max_tokens_above_int32_is_400_naming_the_field(field, value):
    # Before: accepted, then wrapped in the INT32 tensor (2**32+5 became 5 tokens) or
    # failed to convert (2**63: a 500 with numpy's overflow).
    error = error_of(chat, **{field: value})
    assert (error.status, error.param) == (400, field)
    assert str(2**31 - 1) in error.message
    assert chat(**{field: 2**31 - 1}).max_tokens == 2**31 - 1


def test_messages_count_and_size_and_the_prompt_are_bounded():
    limits = Limits(max_messages=3, max_message_chars=10)
    many = [{"role": "user", "content": "x"}] * 4
    error = error_of(parse_chat, {"model": "m", "messages": many}, {}, limits)
    assert (error.status, error.param) == (400, "messages") and "3" in error.message
    assert len(parse_chat({"model": "m", "messages": many[:3]}, {}, limits).messages) == 3
    long = [{"role": "user", "content": "x"}, {"role": "user", "content": "y" * 11}]
    assert (
        error_of(parse_chat, {"model": "m", "messages": long}, {}, limits).param
        == "messages[1].content"
    )
    parts = [{"role": "user", "content": [{"type": "text", "text": "y" * 6}] * 2}]
    assert (
        error_of(parse_chat, {"model": "m", "messages": parts}, {}, limits).param
        == "messages[0].content"
    )
    assert (
        error_of(parse_completion, {"model": "m", "prompt": "z" * 11}, {}, limits).param == "prompt"
    )
    assert parse_completion({"model": "m", "prompt": "z" * 10}, {}, limits).prompt


def test_defaults_bound_a_request_of_a_thousand_messages_or_a_megabyte():
    # Before: no bound at all (a 400 MB body of messages was parsed and forwarded).
    many = [{"role": "user", "content": "x"}] * 1025
    assert error_of(chat, messages=many).param == "messages"
    huge = [{"role": "user", "content": "x" * (2**20 + 1)}]
    assert error_of(chat, messages=huge).param == "messages[0].content"


def test_lora_name_is_taken_from_the_body_and_checked():
    assert chat(lora_name="support-v1.2").lora_name == "support-v1.2"
    assert chat().lora_name is None
    for bad in ("", 5, "a/b", "x" * 200):
        assert error_of(chat, lora_name=bad).param == "lora_name"


@pytest.mark.parametrize(
    "message",
    [
        "invalid request: [lora_name] unknown adapter 'nope': no backend holds it (adapters: "
        "legal (smollm2))",
        "invalid request: [lora_name] route 'fast' has no backend holding adapter 'nope' "
        "(held by: smollm2)",
        "invalid request: unknown adapter 'nope' (sampling_parameters.lora_name): model "
        "smollm2 has adapters: legal, support",
    ],
)
def test_an_unknown_adapter_is_400_naming_it_and_no_backend(message):
    # Before: the router's refusal was a 500 backend_error listing the engine models.
    error = from_triton(message, "router", {"lora_name": "nope"})
    assert (error.status, error.param, error.code) == (400, "lora_name", "adapter_not_found")
    assert "'nope'" in error.message and "smollm2" not in error.message


# -- unknown body fields (issue 34: they were taken and ignored without a word) -------------

PROMPT = {"model": "m", "prompt": "Once"}


@pytest.mark.parametrize(
    "parse, body, field",
    [
        (parse_chat, {"model": "router", "messages": HELLO}, "max_token"),  # a typo
        (parse_chat, {"model": "router", "messages": HELLO}, "guided_json"),  # vLLM's, not ours
        (parse_chat, {"model": "router", "messages": HELLO}, "chat_template_kwargs"),
        (parse_chat, {"model": "router", "messages": HELLO}, "echo"),  # completions' field
        (parse_chat, {"model": "router", "messages": HELLO}, "prompt"),
        (parse_completion, PROMPT, "max_completion_tokens"),  # chat's field
        (parse_completion, PROMPT, "response_format"),
        (parse_completion, PROMPT, "messages"),
        (parse_completion, PROMPT, "extra_body"),  # the SDK's argument sent as a field
    ],
)
def test_an_unknown_body_field_is_400_naming_it(parse, body, field):
    for value in (1, None, {"x": 1}):  # a null is no excuse: OpenAI refuses it too
        error = error_of(parse, {**body, field: value})
        assert error.status == 400 and error.param == field
        assert error.code == "unknown_parameter" and error.type == "invalid_request_error"
        assert "unknown" in error.message and field in error.message
        assert "\n" not in error.message


def test_an_unknown_fields_name_is_shown_on_one_line_and_bounded():
    name = "x\n" * 1000
    error = error_of(chat, **{name: 1, "other": 2})
    assert error.code == "unknown_parameter" and "\n" not in error.message
    assert len(error.message) < 400 and len(error.param) <= 103
    assert "1 more" in error.message


@pytest.mark.parametrize("field", ["priority", "cache_salt"])
def test_a_tenant_input_in_the_body_is_400_naming_it(field):
    # The router sets them from the spec's tenants (interface.py TENANT_INPUTS); a client's
    # were dropped without a word.
    for parse, body in (
        (parse_chat, {"model": "router", "messages": HELLO}),
        (parse_completion, PROMPT),
    ):
        error = error_of(parse, {**body, field: 0})
        assert error.status == 400 and error.param == field
        assert error.code == "unsupported_parameter" and "tenant" in error.message


def sdk_fields(module) -> set:
    """Every body field the openai SDK's create() can send for an endpoint."""
    params = module.CompletionCreateParamsStreaming
    return set(params.__required_keys__ | params.__optional_keys__)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_no_field_the_openai_sdk_sends_is_refused_as_unknown(kind):
    openai_types = pytest.importorskip("openai.types")
    if kind == "chat":
        from openai.types.chat import completion_create_params as params

        parse, body = parse_chat, {"model": "router", "messages": HELLO}
    else:
        params = openai_types.completion_create_params
        parse, body = parse_completion, PROMPT
    fields = sdk_fields(params)
    assert {"model", "stream", "temperature"} <= fields
    for field in sorted(fields - set(body)):
        try:
            parse({**body, field: None})
        except OpenAIError as error:  # refused for its own reason (`stream: null`) only
            assert error.code != "unknown_parameter", (field, error.message)


def test_the_known_fields_are_the_models_fields_with_the_extensions_on_both_endpoints():
    # The models (schema.py) are the one list: a field they lack is refused before it
    # is read, and every routing hint, sampling extra and tenant input is on both.
    from builder.serve.openai.schema import EXTRAS, HINTS, KNOWN_FIELDS, TENANT_ONLY, UNSUPPORTED

    both = {"model", "stream", "n", "max_tokens", "lora_name", *HINTS, *EXTRAS, *TENANT_ONLY}
    assert both <= KNOWN_FIELDS["chat"] & KNOWN_FIELDS["completion"]
    assert {"messages", "tools", "response_format"} <= KNOWN_FIELDS["chat"]
    assert {"prompt", "echo", "best_of"} <= KNOWN_FIELDS["completion"]
    assert set(UNSUPPORTED) <= KNOWN_FIELDS["chat"] | KNOWN_FIELDS["completion"]


def test_the_extensions_are_accepted_on_both_endpoints():
    extensions = {
        "lora_name": "fr",
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "min_tokens": 1,
        "ignore_eos": True,
        "stop_token_ids": [2],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "route": "fast",
        "task": "chat",
        "family": "small",
        "tenant": "acme",
        "tier": "gold",
        "conversation_id": "c1",
        "shared_prefix": "p",
    }
    for g in (chat(**extensions), parse_completion({**PROMPT, **extensions})):
        assert g.lora_name == "fr" and g.sampling["top_k"] == 5 and g.hints["route"] == "fast"
