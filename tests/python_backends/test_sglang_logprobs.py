"""SGLang's logprob lists as trident's `logprobs` output (trident_common/sglang_logprobs.py)."""

from __future__ import annotations

import json

import pytest

from tests.python_backends import test_sglang_model as sglang
from trident_common.sglang_logprobs import Positions, request_args

# The SGLang model's fixtures (a rendered repository, a served model on the double).
repo, served = sglang.repo, sglang.served

VOCAB = {1: " The", 2: " capital", 3: " A", 4: " city"}


def decode(token_id: int) -> str:
    return VOCAB[token_id]


def meta(sampled, tops=None) -> dict:
    return {"output_token_logprobs": sampled, "output_top_logprobs": tops}


def test_no_logprobs_asked_means_no_arguments_and_no_positions():
    assert request_args(None) == {}
    assert request_args(2) == {"return_logprob": True, "top_logprobs_num": 2}
    assert Positions(False, decode).next({"prompt_tokens": 3}) is None


def test_the_sampled_token_comes_first_and_the_alternatives_by_rank():
    positions = Positions(False, decode).next(
        meta([(-0.7, 3, None)], [[(-0.2, 1, None), (-0.7, 3, None)]])
    )
    (position,) = positions
    assert list(position) == ["3", "1"]
    assert position["3"] == {"logprob": -0.7, "rank": 2, "decoded_token": " A"}
    assert position["1"]["rank"] == 1


def test_a_sampled_token_below_the_best_ranks_after_them():
    (position,) = Positions(False, decode).next(meta([(-3.0, 4, " city")], [[(-0.1, 1, " The")]]))
    assert position["4"] == {"logprob": -3.0, "rank": 2, "decoded_token": " city"}


def test_cumulative_lists_yield_only_the_new_positions():
    positions = Positions(False, decode)
    first = positions.next(meta([(-0.1, 1, None)]))
    second = positions.next(meta([(-0.1, 1, None), (-0.2, 2, None)]))
    assert [list(p) for p in first] == [["1"]] and [list(p) for p in second] == [["2"]]
    assert positions.next(meta([(-0.1, 1, None), (-0.2, 2, None)])) == []


def test_incremental_lists_are_new_already():
    positions = Positions(True, decode)
    positions.next(meta([(-0.1, 1, None)]))
    (position,) = positions.next(meta([(-0.2, 2, None)]))
    assert position["2"]["decoded_token"] == " capital"


# -- the SGLang model on the engine double ---------------------------------------------------


@pytest.mark.parametrize("incremental, stream", [(False, True), (True, True), (False, False)])
def test_the_sglang_model_returns_logprobs_for_every_token(
    repo, tmp_path, monkeypatch, incremental, stream
):
    # Before: "unknown sampling parameter(s) for sglang: logprobs".
    args = {"incremental_streaming_output": incremental}
    for model in sglang._serve(sglang.with_engine_args(repo, tmp_path, args), monkeypatch):
        model.engine.tokens_per_chunk = 2
        sender = model.run(
            text_input="hi",
            stream=stream,
            max_tokens=5,
            exclude_input_in_output=True,
            sampling_parameters={"logprobs": 2},
        )
        positions = [
            p
            for r in sender.responses()
            if r.value("logprobs")
            for p in json.loads(r.value("logprobs"))
        ]
        text = "".join(sglang.texts(sender))
        assert text == sglang.expected_text(sglang.REPLY_WORDS[:5]) and len(positions) == 5
        assert "".join(next(iter(p.values()))["decoded_token"] for p in positions) == text
        assert all(len(p) == 2 for p in positions)  # the sampled word is the best
        assert "logprobs" not in model.engine.calls[-1]["sampling_params"]


def test_without_logprobs_the_answer_has_none(served):
    sender = served.run(text_input="hi", stream=True, max_tokens=3)
    assert all(not r.value("logprobs") for r in sender.responses())
