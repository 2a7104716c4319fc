"""vLLM's own metrics and vllm_backend's health check on the real server: the session's
fallback_server (tests/server/conftest.py), SmolLM2 on real vLLM as `primary`, and
tiny-llama as `backup`, whose config.pbtxt has ENABLE_VLLM_HEALTH_CHECK as vllm_backend's
own test does; the server runs in explicit model-control mode (so a model can unload
itself).

The last test is destructive (backup's engine is killed and backup unloads itself): it
runs after the other tests of that server.
"""

from __future__ import annotations

import json
import threading

import pytest
import tritonclient.grpc as grpcclient

from builder.serve.client import build_inputs
from tests.helpers import engine_cores, metric_value, wait_for
from tests.server.test_vllm_clients import Recorded

pytestmark = [pytest.mark.server, pytest.mark.vllm]

# vllm_backend's clients send sampling values as strings.
GREEDY = {"temperature": "0", "top_p": "1"}
PROMPTS = ["The most dangerous animal is", "The capital of France is", "The future of AI is"]
UNHEALTHY = "Model is unavailable due to unhealthy vLLM engine"


@pytest.fixture(scope="module")
def server(fallback_server):
    return fallback_server


def generate(server, prompt, max_tokens=8, sampling=GREEDY, model="primary") -> Recorded:
    inputs = build_inputs(prompt, None, max_tokens, True, sampling)
    recorded = Recorded(server, model=model, raw_inputs=inputs)
    try:
        assert recorded.pump(120), "no final response within 120 s"
        return recorded
    finally:
        recorded.close()


def vllm_metric(server, name, **labels) -> float:
    return metric_value(server.metrics_url, name, model="primary", version="1", **labels)


NAMES = {
    "prompt": "vllm:prompt_tokens_total",
    "generated": "vllm:generation_tokens_total",
    "ttft": "vllm:time_to_first_token_seconds_count",
    "tpot": "vllm:time_per_output_token_seconds_count",
    "e2e": "vllm:e2e_request_latency_seconds_count",
    "per_request": "vllm:request_generation_tokens_sum",
}


def snapshot(server) -> dict:
    values = {key: vllm_metric(server, name) for key, name in NAMES.items()}
    values["length"] = vllm_metric(server, "vllm:request_success_total", finished_reason="length")
    return values


def test_vllm_counters_equal_the_real_token_counts(server):
    before = snapshot(server)
    answers = [generate(server, prompt) for prompt in PROMPTS]
    assert all(not a.errors for a in answers), [a.errors for a in answers]
    prompt_tokens = sum(a.outputs[-1]["num_input_tokens"] for a in answers)
    generated = sum(a.outputs[-1]["num_output_tokens"] for a in answers)
    assert generated == 8 * len(PROMPTS) and prompt_tokens > len(PROMPTS)
    expected = {
        "prompt": prompt_tokens,
        "generated": generated,
        "ttft": len(PROMPTS),
        "tpot": generated - len(PROMPTS),
        "e2e": len(PROMPTS),
        "per_request": generated,
        "length": len(PROMPTS),
    }
    # The writer thread applies vLLM's stats shortly after the final response.
    grew = lambda: {k: snapshot(server)[k] - before[k] for k in expected}  # noqa: E731
    try:
        wait_for(lambda: grew() == expected, timeout_s=20)
    except AssertionError:
        assert grew() == expected
    assert vllm_metric(server, "vllm:num_requests_running") == 0


def test_kv_cache_usage_rises_while_a_request_holds_blocks_and_falls_after(server):
    """vllm:kv_cache_usage_perc (vLLM's own gauge, the one its Prometheus logger exports):
    above 0 while a long answer is being written, 0 again when it is done (its blocks are
    free, though they still cache its prefix)."""
    usage = lambda: vllm_metric(server, "vllm:kv_cache_usage_perc")  # noqa: E731
    seen: list[float] = []
    writing = threading.Thread(
        target=lambda: seen.append(generate(server, PROMPTS[0] * 20, max_tokens=160))
    )
    writing.start()
    try:
        wait_for(lambda: usage() > 0, timeout_s=60, interval_s=0.05)
        assert usage() <= 1.0
    finally:
        writing.join(120)
    assert seen and not seen[0].errors
    wait_for(lambda: usage() == 0, timeout_s=20)


def test_structured_outputs_as_a_json_string(server):
    """vllm_backend's clients send structured_outputs as JSON text; a bad one is refused
    in words, not with an empty message."""
    sampling = {**GREEDY, "structured_outputs": json.dumps({"choice": ["yes", "no"]})}
    answer = generate(server, "Is Paris in France? Answer yes or no.", sampling=sampling)
    assert not answer.errors and answer.text in ("yes", "no")
    bad = {**GREEDY, "structured_outputs": json.dumps({"colour": "blue"})}
    refused = generate(server, "Hi", sampling=bad)
    assert refused.errors and "structured_outputs" in refused.errors[0]
    assert refused.errors[0].split(":", 1)[1].strip(), refused.errors
    not_json = {**GREEDY, "structured_outputs": "{choice"}
    refused = generate(server, "Hi", sampling=not_json)
    assert refused.errors and "structured_outputs" in refused.errors[0], refused.errors


# -- vllm_backend's health check (destructive: it leaves backup without an engine) -------

# The model with ENABLE_VLLM_HEALTH_CHECK in the fallback server (tests/server/conftest.py).
CHECKED = "backup"


def _ready(server) -> bool:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return client.is_model_ready(CHECKED)


def _first_error(server) -> str:
    """The error of one request to CHECKED (a refused request may get no final flag:
    Triton answers a request for an unloaded model with the error alone)."""
    inputs = build_inputs("Hi", None, 2, True, GREEDY)
    recorded = Recorded(server, model=CHECKED, raw_inputs=inputs)
    try:
        wait_for(lambda: recorded.pump(0.05) or recorded.errors, timeout_s=60)
        return recorded.errors[0] if recorded.errors else ""
    finally:
        recorded.close()


@pytest.mark.destructive(rank=2)  # backup unloads itself: after everyone's
def test_a_dead_engine_is_refused_in_vllm_backends_words_and_unloaded(server):
    assert _ready(server) and not generate(server, "Hi", max_tokens=2, model=CHECKED).errors
    cores = engine_cores(server, CHECKED)
    assert cores, f"no vLLM EngineCore process of {CHECKED} found"
    for core in cores:
        core.kill()
    # From now on a request is refused: "engine is dead" while the engine's death is not
    # yet seen, in vllm_backend's words once it is, until the model has unloaded itself
    # (it asks within HEALTH_CHECK_S); then Triton answers that the model is unknown.
    # (tests/python_backends/test_vllm_health.py checks the refusal without the race.)
    errors = [_first_error(server)]
    while "unknown model" not in errors[-1].lower():
        assert len(errors) < 500, errors[-3:]
        errors.append(_first_error(server))
    assert all(UNHEALTHY in e or e.startswith("vllm engine is dead: ") for e in errors[:-1]), set(
        errors
    )
    assert not _ready(server)
    assert "unknown model" in _first_error(server).lower()  # it stays unloaded
