"""trident's real vLLM model on the paced AsyncLLM double (support/vllm_double.py), in a
real tritonserver: what bench/gpu_rate.py stands on. The double must be what the stub's
`import vllm` gets (through EXECUTION_ENV_PATH), answer at the configured pace, direct and
through the router, and take a new rate from its control file without a reload.
Lower bounds on time only: a busy machine can make the double later, never sooner."""
from __future__ import annotations

import pytest

from support.grpc_stream import generate
from support.pacing import Rate
from support.vllm_double import make_environment, use_double, write_rate
from tests.helpers.servers import ROOT, render, start_server

pytestmark = pytest.mark.server
MODEL = "smollm2"


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm-double")
    repo = render(ROOT / "deploy" / "default.yaml", tmp / "repo")
    control = tmp / "rate.json"
    use_double(repo, MODEL, make_environment(tmp / "env"), control,
               Rate(ttft_s=0.2, tokens_per_s=50))
    server = start_server(repo, tmp, timeout_s=60)
    yield server, control
    server.stop()


@pytest.mark.parametrize("model", [MODEL, "router"])
def test_the_vllm_model_streams_at_the_doubles_pace(paced, model):
    server, _ = paced
    result = generate(server.grpc_url, model, prompt="go", max_tokens=20,
                      sampling={"temperature": 0, "ignore_eos": True})
    assert not result.errors, result.errors
    assert result.output_tokens == 20 and result.finish_reason == "length"
    assert result.text == "".join(f" w{i}" for i in range(20))    # the double's words
    assert result.ttft_s >= 0.2 and result.served_by == MODEL


def test_a_new_rate_applies_to_the_next_request(paced):
    server, control = paced
    write_rate(control, Rate(ttft_s=0.5, tokens_per_s=1000))
    result = generate(server.grpc_url, MODEL, prompt="go", max_tokens=50)
    assert not result.errors and result.output_tokens == 50
    assert result.ttft_s >= 0.5
