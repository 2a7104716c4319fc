"""trident_common.request: parsing and checking a generate request, as pure Python."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trident_common import trust
from trident_common.interface import ROUTER_PROOF
from trident_common.request import (
    AbortRequest,
    BadRequest,
    coerce_sampling,
    describe,
    parse_generate,
    parse_messages,
)


def getter(**inputs):
    """What a backend's input getter returns: numpy arrays, or None when absent."""

    def get(name):
        value = inputs.get(name)
        if value is None:
            return None
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        if isinstance(value, str):
            value = value.encode()
        return np.array([value], dtype=np.object_ if isinstance(value, bytes) else None)

    return get


def refused(match: str, **inputs):
    with pytest.raises(BadRequest, match=match):
        parse_generate(getter(**inputs))


# -- the strings dialect of vllm_backend clients ---------------------------------------------


def test_strings_become_the_types_of_sampling_params():
    sampling = coerce_sampling(
        {
            "temperature": "0",
            "top_p": "1",
            "max_tokens": "8",
            "seed": "5",
            "ignore_eos": "false",
            "top_k": "-1",
            "skip_special_tokens": "True",
            "stop_token_ids": "[2, 3]",
        }
    )
    assert sampling == {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 8,
        "seed": 5,
        "ignore_eos": False,
        "top_k": -1,
        "skip_special_tokens": True,
        "stop_token_ids": [2, 3],
    }
    assert type(sampling["seed"]) is int and type(sampling["temperature"]) is float


def test_values_of_the_right_type_pass_unchanged():
    values = {
        "temperature": 0.7,
        "top_k": 40,
        "stop": ["\n", "."],
        "seed": 1,
        "logit_bias": {"5": -1},
    }
    assert coerce_sampling(values) == {**values, "logit_bias": {5: -1.0}}


def test_null_means_the_default_and_n_of_one_is_dropped():
    assert coerce_sampling({"seed": None, "temperature": None, "n": "1"}) == {}


def test_unknown_keys_are_left_for_the_engine_to_name():
    assert coerce_sampling({"temprature": "x"}) == {"temprature": "x"}


@pytest.mark.parametrize(
    "values,message",
    [
        ({"temperature": "hot"}, "sampling_parameters.temperature: expected a number, got 'hot'"),
        ({"seed": "five"}, "sampling_parameters.seed: expected an integer"),
        ({"seed": True}, "sampling_parameters.seed: expected an integer"),
        ({"top_k": 1.5}, "sampling_parameters.top_k: expected an integer, got 1.5"),
        ({"temperature": float("nan")}, "sampling_parameters.temperature: expected a number"),
        ({"presence_penalty": "Infinity"}, "sampling_parameters.presence_penalty"),
        ({"stop": 5}, "sampling_parameters.stop: expected a string or a list of strings"),
        ({"stop": [1, 2]}, "sampling_parameters.stop"),
        ({"ignore_eos": "maybe"}, "sampling_parameters.ignore_eos: expected a boolean"),
        ({"logit_bias": "nope"}, "sampling_parameters.logit_bias"),
        ({"logit_bias": {"abc": 1}}, "sampling_parameters.logit_bias"),
        ({"structured_outputs": "{{"}, "sampling_parameters.structured_outputs: expected a JSON"),
        ({"temperature": {"x": 1}}, "sampling_parameters.temperature"),
        ({"n": 5}, "sampling_parameters.n: only n=1 is supported"),
        ({"regex": 5}, "sampling_parameters.regex: expected a string"),
    ],
)
def test_values_that_do_not_convert_are_refused_by_field(values, message):
    with pytest.raises(BadRequest) as refusal:
        coerce_sampling(values)
    assert str(refusal.value).startswith(message)


def test_a_huge_bad_value_is_cut_short_in_the_message():
    with pytest.raises(BadRequest) as refusal:
        coerce_sampling({"temperature": "x" * 100_000})
    assert len(str(refusal.value)) < 120


# -- parse_generate --------------------------------------------------------------------------


def test_string_values_arrive_typed_and_max_tokens_comes_out_of_sampling():
    request = parse_generate(
        getter(
            text_input="hi",
            sampling_parameters={"temperature": "0", "max_tokens": "8", "seed": "5"},
        )
    )
    assert request.sampling == {"temperature": 0.0, "seed": 5}
    assert request.max_tokens == 8


def test_request_parameters_are_sampling_values_without_a_tensor():
    request = parse_generate(
        getter(text_input="hi"), {"temperature": 0, "max_tokens": 5, "route": "fast"}
    )
    assert request.sampling == {"temperature": 0.0}  # the hint is not a sampling value
    assert request.max_tokens == 5


def test_the_sampling_tensor_wins_over_request_parameters():
    request = parse_generate(
        getter(text_input="hi", sampling_parameters={"top_p": 0.5}), {"temperature": 0}
    )
    assert request.sampling == {"top_p": 0.5}


def test_bad_request_parameters_are_refused_by_field():
    with pytest.raises(BadRequest, match="sampling_parameters.temperature"):
        parse_generate(getter(text_input="hi"), {"temperature": "hot"})


@pytest.mark.parametrize(
    "inputs,match",
    [
        ({}, "one of 'text_input' or 'messages' is required"),
        ({"text_input": "hi", "messages": [{"role": "user", "content": "hi"}]}, "not both"),
        ({"text_input": ""}, "text_input is empty"),
        ({"text_input": b"\xff\xfe"}, "not valid UTF-8"),
        ({"messages": "[{role"}, "messages is not valid JSON"),
        ({"messages": {"role": "user"}}, r"messages\[0\] must be"),
        ({"messages": []}, r"a JSON list of \{role, content\} objects \(not empty\)"),
        ({"messages": "hi"}, "messages is not valid JSON"),
        ({"messages": '"hi"'}, "messages must be a JSON list"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\] must be"),
        ({"messages": "[" * 5000 + "]" * 5000}, "nested too deeply"),
        ({"text_input": "hi", "sampling_parameters": "[1]"}, "must be a JSON object"),
        (
            {"text_input": "hi", "sampling_parameters": '{"a":' * 3000 + "1" + "}" * 3000},
            "nested too deeply",
        ),
        (
            {"text_input": "hi", "sampling_parameters": {"max_tokens": "many"}},
            "sampling_parameters.max_tokens",
        ),
        ({"text_input": "hi", "sampling_parameters": {"max_tokens": 0}}, "max_tokens must be"),
    ],
)
def test_malformed_requests_are_refused_in_words(inputs, match):
    refused(match, **inputs)


def test_text_input_must_be_text():
    get = lambda name: np.array([5], dtype=np.int32) if name == "text_input" else None  # noqa: E731
    with pytest.raises(BadRequest, match="text_input must be a string"):
        parse_generate(get)


# -- chat messages: one checker for the router and the engine models ------------------------

HI = {"role": "user", "content": "hi"}


def tensor(*items):
    return np.array([json.dumps(item).encode() for item in items], dtype=np.object_)


@pytest.mark.parametrize(
    "value, rewritten",
    [
        (tensor([HI, {"role": "assistant", "content": "hello"}]), None),  # the documented form
        (tensor(HI), [HI]),  # one object
        (tensor(HI, HI), [HI, HI]),  # one per element
        (tensor(HI).reshape(1, 1), [HI]),  # batch dims
    ],
)
def test_every_accepted_shape_of_messages(value, rewritten):
    messages, forwarded = parse_messages(value)
    assert messages == (rewritten or json.loads(value[0]))
    assert (json.loads(forwarded) if forwarded else None) == rewritten


@pytest.mark.parametrize(
    "value, match",
    [
        (np.array([b"[]"], dtype=np.object_), "not empty"),
        (np.array([5], dtype=np.int32), "must be a JSON string"),
        (np.array([], dtype=np.object_), "must be a JSON string"),
        (tensor(HI, [HI]), "messages must be a JSON list"),
        (tensor({"role": "user", "content": 5}), r"messages\[0\] must be"),
        (tensor([HI, "hi"]), r"messages\[1\] must be"),
        (np.array([b"\xff"], dtype=np.object_), "not valid UTF-8"),
    ],
)
def test_messages_in_no_accepted_shape_are_refused(value, match):
    with pytest.raises(BadRequest, match=match):
        parse_messages(value)


def test_an_engine_model_reads_a_single_message_object_too():
    request = parse_generate(getter(messages=HI))
    assert request.messages == [HI] and request.prompt is None


def test_abort_request():
    key = b"k" * 32
    proof = {ROUTER_PROOF: trust.abort_proof(key, "abc")}
    assert parse_generate(getter(abort_request_id="abc"), proof, key) == AbortRequest("abc")


# -- describe ----------------------------------------------------------------------------------


def test_describe_never_returns_an_empty_message():
    class EngineGenerateError(Exception):
        pass

    try:
        try:
            raise TypeError("'<' not supported")
        except TypeError as cause:
            raise EngineGenerateError() from cause
    except EngineGenerateError as e:
        assert describe(e) == "EngineGenerateError (TypeError: '<' not supported)"
    assert describe(RuntimeError()) == "RuntimeError"
    assert describe(ValueError("bad")) == "bad"


@pytest.mark.parametrize(
    "values, field",
    [
        ({"logit_bias": {99_999_999: 5.0}}, "logit_bias"),
        ({"logit_bias": {-1: 5.0}}, "logit_bias"),
        ({"stop_token_ids": [2, 49152]}, "stop_token_ids"),
        ({"allowed_token_ids": [0, 10**9]}, "allowed_token_ids"),
    ],
)
def test_a_token_id_past_the_vocabulary_is_refused_naming_its_field(values, field):
    """Issue 34: vLLM's own check said it deep in generation, with no parameter."""
    from trident_common.error_classes import CLIENT, parse
    from trident_common.sampling import check_token_ids

    with pytest.raises(BadRequest) as refused:
        check_token_ids(values, 49152, "smollm2")
    assert parse(CLIENT.mark(str(refused.value))).param == field
    assert "not in the vocabulary of model smollm2 (ids 0 to 49151)" in str(refused.value)
    check_token_ids({"logit_bias": {0: 1.0, 49151: -1.0}, "stop_token_ids": [2]}, 49152, "m")
