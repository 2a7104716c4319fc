"""What a TRT-LLM ensemble cannot do is refused by the router's adapter in words that name
the sampling value (bls/adapters.py TrtllmAdapter, with the fake pb_utils): logprobs,
logit_bias, stop strings and n have no tensor in the ensemble trident renders, so they
are never dropped on the way. The OpenAI frontend refuses them before that for a model
it reaches directly (tests/serve/test_openai_choices.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fakes import fake_pb_utils as pb
from trident_common.faults import BadRequest


def send(sampling: dict):
    request = [
        pb.Tensor("text_input", np.array([b"hi"], dtype=object)),
        pb.Tensor("max_tokens", np.array([8], dtype=np.int32)),
        pb.Tensor("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=object)),
    ]
    from bls import adapters

    return adapters.TrtllmAdapter("llama").inputs(request, "r1")


@pytest.mark.parametrize(
    "sampling, named",
    [
        ({"logprobs": 2}, "logprobs"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"stop": ["."]}, "stop"),
        ({"structured_outputs": {"json": {}}}, "structured_outputs"),
    ],
)
def test_what_the_ensemble_has_no_tensor_for_is_refused_by_name(sampling, named):
    with pytest.raises(ValueError, match=f"'{named}' is not supported by TRT-LLM"):
        send(sampling)


def test_more_than_one_sequence_is_refused_for_every_engine():
    with pytest.raises(BadRequest, match="sampling_parameters.n"):
        send({"n": 2})


def test_what_it_has_a_tensor_for_goes_through():
    sent = {t.name(): t.as_numpy() for t in send({"seed": 7, "temperature": 0.5})}
    assert sent["random_seed"].tolist() == [[7]] and sent["temperature"].dtype == np.float32
