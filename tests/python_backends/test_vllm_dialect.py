"""Small points of vllm_backend's dialect that its clients' tests check."""

from __future__ import annotations

from types import SimpleNamespace

from trident_common.returns import Outputs


def delta(text, finish_reason, output_tokens):
    return SimpleNamespace(
        text=text,
        finish_reason=finish_reason,
        input_tokens=4,
        output_tokens=output_tokens,
        logprobs=None,
        cumulative_logprob=None,
        tool_calls=None,
    )


def test_an_unfinished_response_says_none_when_finish_reason_is_asked():
    outputs = Outputs(frozenset({"finish_reason"}), stream=True)
    first, last = delta("Par", None, 1), delta("is", "length", 2)
    assert outputs.values(first, first.text)["finish_reason"] == "None"
    assert outputs.values(last, last.text)["finish_reason"] == "length"


def test_without_flags_an_unfinished_response_has_an_empty_finish_reason():
    outputs = Outputs(None, stream=True)
    assert outputs.values(delta("Par", None, 1), "Par")["finish_reason"] == ""
