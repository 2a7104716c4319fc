"""vllm_backend's return_* flags and the exclude_input_in_output rule of streams."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.python_backends.test_request import getter, refused
from trident_common.request import parse_generate
from trident_common.returns import Outputs, logprobs_json, wants_logprobs


def test_no_flag_means_the_usual_outputs():
    assert parse_generate(getter(text_input="hi")).returns is None


def test_flags_name_the_outputs_asked_for():
    request = parse_generate(
        getter(
            text_input="hi",
            return_finish_reason=True,
            return_logprobs=False,
            return_num_output_tokens=True,
        )
    )
    assert request.returns == {"finish_reason", "num_output_tokens"}
    only_false = parse_generate(getter(text_input="hi", return_logprobs=False))
    assert only_false.returns == frozenset()  # a flag was sent: text_output alone
    assert wants_logprobs(frozenset({"cumulative_logprob"}))
    assert not wants_logprobs(None) and not wants_logprobs(frozenset({"finish_reason"}))


def test_streaming_with_the_prompt_in_the_output_is_refused():
    refused(
        "exclude_input_in_output=false", text_input="hi", stream=True, exclude_input_in_output=False
    )
    assert parse_generate(getter(text_input="hi", stream=True)).stream
    assert parse_generate(
        getter(text_input="hi", stream=True, exclude_input_in_output=True)
    ).exclude_input_in_output


def Delta(
    text, finish_reason, input_tokens, output_tokens, logprobs, cumulative_logprob, tool_calls=None
):
    """engine_model.Delta's fields (that module needs Triton's stub to import)."""
    return SimpleNamespace(
        text=text,
        finish_reason=finish_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        logprobs=logprobs,
        cumulative_logprob=cumulative_logprob,
        tool_calls=tool_calls,
    )


DELTAS = [
    Delta("Par", None, 7, 2, [{"1": {}}, {"2": {}}], -0.5),
    Delta("is", "stop", 7, 3, [{"3": {}}], -0.75),
]


def test_usual_outputs_carry_running_totals():
    outputs = Outputs(None, stream=True)
    plain = [
        Delta(d.text, d.finish_reason, d.input_tokens, d.output_tokens, None, None) for d in DELTAS
    ]
    values = [outputs.values(d, d.text) for d in plain]
    assert values[1] == {
        "text_output": "is",
        "finish_reason": "stop",
        "num_input_tokens": 7,
        "num_output_tokens": 3,
    }
    assert [v["num_output_tokens"] for v in values] == [2, 3]


@pytest.mark.parametrize("stream", [True, False])
def test_usual_outputs_carry_the_logprobs_the_engine_computed(stream):
    # The OpenAI frontend asks for logprobs through sampling_parameters alone and keeps
    # the usual outputs (served_by, error, running totals). Before: no logprobs output.
    outputs = Outputs(None, stream=stream)
    for delta in DELTAS:
        outputs.take(delta)
    values = outputs.values(DELTAS[-1], "Paris")
    want = DELTAS[-1].logprobs if stream else DELTAS[0].logprobs + DELTAS[1].logprobs
    assert json.loads(values["logprobs"]) == want
    assert values["num_output_tokens"] == 3 and values["finish_reason"] == "stop"


def test_streamed_counts_are_per_response_when_asked():
    outputs = Outputs(
        frozenset({"num_output_tokens", "logprobs", "cumulative_logprob"}), stream=True
    )
    values = [outputs.values(d, d.text) for d in DELTAS]
    assert [v["num_output_tokens"] for v in values] == [2, 1]
    assert json.loads(values[1]["logprobs"]) == [{"3": {}}]
    assert values[1]["cumulative_logprob"] == -0.75 and "finish_reason" not in values[1]


@pytest.mark.parametrize("asked", [frozenset(), frozenset({"finish_reason", "logprobs"})])
def test_a_whole_answer_has_only_what_was_asked(asked):
    outputs = Outputs(asked, stream=False)
    for delta in DELTAS:
        outputs.take(delta)
    values = outputs.values(DELTAS[-1], "Paris")
    assert set(values) == {"text_output"} | asked
    if "logprobs" in asked:
        assert len(json.loads(values["logprobs"])) == 3


def test_logprobs_are_written_as_vllm_backend_does():
    lp = SimpleNamespace(logprob=-0.1, rank=1, decoded_token="Paris")
    assert logprobs_json([{42: lp}]) == [
        {"42": {"logprob": -0.1, "rank": 1, "decoded_token": "Paris"}}
    ]
