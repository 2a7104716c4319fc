"""trident's SGLang model (python_backends/sglang/model.py) on the CPU.

SGLang cannot start here, so the real model.py runs against test doubles installed via
sys.modules: support/fake_sglang.py (sglang.Engine's async interface) and
tests/fakes/fake_pb_utils.py (the stub's triton_python_backend_utils). The model is
driven through initialize / execute / finalize exactly as Triton drives it; the GPU
check (tests/gpu/check_sglang.sh) does the same against the real SGLang.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from builder.cli import main as cli
from builder.engines.jobs import ServedEngine
from builder.pipeline import build_repository
from builder.plan.planner import plan_for_spec
from builder.plan.replicas import routed_replicas
from builder.render.context import RenderContext
from builder.render.repository import render_files
from builder.spec import load_spec, parse_spec
from builder.spec.engine_args import SGLANG_ARGS
from support import fake_sglang
from support.pacing import Rate, RateSource
from tests.fakes import fake_pb_utils as pb
from tests.helpers import wait_for
from trident_common import trust
from trident_common.interface import (
    ENGINE_GAUGES_DIR_ENV,
    ERRORS_IN_BAND,
    ROUTER_PROOF,
    ROUTER_SECRET_ENV,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL_PY = ROOT / "python_backends" / "sglang" / "model.py"
REPLY_WORDS = fake_sglang.REPLY.split()
SECRET = "sglang-unit-test-router-secret-0123456789"


def sglang_spec(**engine_args) -> dict:
    return {
        "name": "sgl",
        "hardware": {"gpu": "cpu"},
        "models": [
            {
                "name": "qwen",
                "engine": "sglang",
                "model": "/models/qwen2.5-0.5b",
                "family": "qwen",
                "tasks": ["chat"],
                "engine_args": {
                    "context_length": 64,
                    "mem_fraction_static": 0.8,
                    "schedule_policy": "lpm",
                    **engine_args,
                },
            }
        ],
        "router": {"default": ["qwen"]},
    }


@contextlib.contextmanager
def fake_stub_modules():
    """For the block, `import sglang` (which the model does when its engine starts) gets
    the double; pb_utils is the double for the whole run (tests/conftest.py)."""
    saved_sglang = sys.modules.get("sglang")
    sys.modules["sglang"] = types.SimpleNamespace(Engine=fake_sglang.Engine)
    try:
        yield
    finally:
        sys.modules.pop("sglang", None)
        if saved_sglang is not None:
            sys.modules["sglang"] = saved_sglang


def load_model_module():
    return importlib.import_module("python_backends.sglang.model")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang") / "repo"
    build_repository(parse_spec(sglang_spec(), "<test>"), out)
    return out


class Served:
    """One initialized model instance plus helpers to talk to it."""

    def __init__(self, module, model, engine):
        self.module, self.model, self.engine = module, model, engine

    def send(self, router=False, proof=None, in_band=False, **inputs) -> pb.ResponseSender:
        """Send a request, as the router (with its proof, trust.py) or as a direct
        client (with `proof` as its parameter, if given); `in_band` asks for errors in
        band (interface.ERRORS_IN_BAND), as the router does."""
        if router:
            proof = router_proof(**inputs)
        request = make_request(**inputs)
        parameters = {} if proof is None else {ROUTER_PROOF: proof}
        if in_band:
            parameters[ERRORS_IN_BAND] = True
        if parameters:
            request.parameters = lambda: json.dumps(parameters)
        self.model.execute([request])
        return request.sender

    def run(self, router=False, proof=None, in_band=False, **inputs) -> pb.ResponseSender:
        sender = self.send(router, proof, in_band, **inputs)
        sender.wait_closed()
        return sender

    def metric(self, name: str) -> float:
        return pb.metric(name, model="qwen").value()

    def wait_metric(self, name: str, value: float) -> None:
        """For metrics the model updates after it sent the final response."""
        wait_for(lambda: self.metric(name) == value)


@pytest.fixture
def served(repo, monkeypatch):
    yield from _serve(repo, monkeypatch)


def with_engine_args(repo: Path, tmp_path: Path, engine_args: dict) -> Path:
    """A copy of the rendered repository whose model.json has extra engine arguments."""
    copy = tmp_path / "repo"
    shutil.copytree(repo, copy)
    model_json = copy / "qwen" / "1" / "model.json"
    model_json.write_text(json.dumps({**json.loads(model_json.read_text()), **engine_args}))
    return copy


def router_proof(**inputs) -> str:
    """What bls/model.py (a request) or bls/control.py (an abort) sends for these inputs."""
    key = trust.proof_key({ROUTER_SECRET_ENV: SECRET})
    if "abort_request_id" in inputs:
        return trust.abort_proof(key, inputs["abort_request_id"])
    return trust.generate_proof(
        key, inputs.get("request_id", ""), inputs.get("priority"), inputs.get("cache_salt")
    )


def _serve(repo: Path, monkeypatch, secret=SECRET):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    if secret is None:
        monkeypatch.delenv(ROUTER_SECRET_ENV, raising=False)
    else:
        monkeypatch.setenv(ROUTER_SECRET_ENV, secret)  # as `trident serve` starts servers
    with fake_stub_modules():
        module = load_model_module()
        model = module.TritonPythonModel()
        model.initialize(
            {
                "model_name": "qwen",
                "model_repository": str(repo / "qwen"),
                "model_version": "1",
                "model_instance_kind": "CPU",
                "model_instance_name": "qwen_0_0",
                "model_config": "{}",
            }
        )
        try:
            yield Served(module, model, model.engine)
        finally:
            model.finalize()


def make_request(**inputs) -> pb.InferenceRequest:
    tensors = {}
    for name, value in inputs.items():
        if isinstance(value, bool):
            array = np.array([value], dtype=bool)
        elif isinstance(value, int):
            array = np.array([value], dtype=np.int32)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            array = np.array([text.encode()], dtype=np.object_)
        tensors[name] = pb.Tensor(name, array)
    return pb.InferenceRequest(tensors)


def texts(sender) -> list[str]:
    return [r.value("text_output") for r in sender.responses()]


def common_prefix(a: list, b: list) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def expected_text(words) -> str:
    return "".join(" " + w for w in words)


# -- pure mapping ------------------------------------------------------------------------


def test_sampling_names_are_mapped_to_sglang():
    module = _module_without_stub()
    mapped = module.map_sampling(
        {
            "temperature": 0.0,
            "seed": 7,
            "min_tokens": 2,
            "stop": ["\n"],
            "include_stop_str_in_output": True,
            "top_k": -1,
            "repetition_penalty": 1.1,
        },
        max_tokens=32,
    )
    assert mapped == {
        "temperature": 0.0,
        "sampling_seed": 7,
        "min_new_tokens": 2,
        "stop": ["\n"],
        "no_stop_trim": True,
        "top_k": -1,
        "repetition_penalty": 1.1,
        "max_new_tokens": 32,
    }
    assert set(mapped) <= fake_sglang.SAMPLING_FIELDS


def test_every_mapped_name_is_an_sglang_sampling_field():
    module = _module_without_stub()
    assert set(module.SAMPLING_NAMES.values()) <= fake_sglang.SAMPLING_FIELDS


def test_json_schema_object_is_sent_as_text():
    module = _module_without_stub()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    mapped = module.map_sampling({"json_schema": schema}, max_tokens=8)
    assert json.loads(mapped["json_schema"]) == schema


def test_unknown_sampling_keys_are_rejected_by_name():
    module = _module_without_stub()
    with pytest.raises(module.BadRequest, match="best_of, max_new_tokens"):
        module.map_sampling({"max_new_tokens": 5, "best_of": 2, "top_p": 0.9}, 8)


@pytest.mark.parametrize("incremental", [False, True])
def test_text_deltas_concatenate_to_the_text(incremental):
    module = _module_without_stub()
    cumulative = ["He", "Hello", "Hello, wor", "Hello, world"]
    chunks = cumulative if not incremental else ["He", "llo", ", wor", "ld"]
    deltas = module.TextDeltas(incremental)
    assert "".join(deltas.next(c) for c in chunks) == "Hello, world"


def test_finish_reasons():
    module = _module_without_stub()
    assert module.finish_reason({"finish_reason": None}) is None
    assert module.finish_reason({"finish_reason": {"type": "length", "length": 8}}) == "length"
    assert module.finish_reason({"finish_reason": {"type": "stop", "matched": 2}}) == "stop"
    assert (
        module.finish_reason(
            {"finish_reason": {"type": "abort", "message": "Aborted", "status_code": None}}
        )
        == "abort"
    )
    with pytest.raises(module.BadRequest, match="longer than"):
        module.finish_reason(
            {
                "finish_reason": {
                    "type": "abort",
                    "status_code": 400,
                    "message": "input is longer than 8",
                }
            }
        )
    with pytest.raises(RuntimeError, match="out of memory"):
        module.finish_reason(
            {"finish_reason": {"type": "abort", "status_code": 503, "message": "out of memory"}}
        )


def _module_without_stub():
    with fake_stub_modules():
        return load_model_module()


# -- the rendered model ------------------------------------------------------------------


def test_sglang_model_renders_and_validates(repo, capsys):
    assert cli.main(["validate", str(repo)]) == 0
    config = json.loads((repo / "qwen" / "1" / "model.json").read_text())
    assert config == {
        "model_path": "/models/qwen2.5-0.5b",
        "context_length": 64,
        "mem_fraction_static": 0.8,
        "schedule_policy": "lpm",
    }
    version = repo / "qwen" / "1"
    assert (version / "python_backends" / "sglang" / "model.py").read_bytes() == (
        MODEL_PY.read_bytes()
    )
    assert "from python_backends.sglang.model import TritonPythonModel" in (
        (version / "model.py").read_text()
    )
    assert (repo / "qwen" / "1" / "trident_common" / "engine_model.py").is_file()
    pbtxt = (repo / "qwen" / "config.pbtxt").read_text()
    assert "decoupled: true" in pbtxt and 'backend: "python"' in pbtxt


def test_engine_args_table_names_real_server_args():
    assert set(SGLANG_ARGS) <= fake_sglang.SERVER_ARGS


SHIPPED_SPECS = sorted((ROOT / "deploy").rglob("*.yaml"))


@pytest.mark.parametrize("spec_file", SHIPPED_SPECS, ids=lambda p: p.name)
def test_shipped_sglang_models_start_with_their_rendered_args(spec_file):
    spec = load_spec(spec_file)
    engines = {
        m.name: ServedEngine("/engines/" + "ab" * 32, "ab" * 32)
        for m in spec.models
        if m.engine == "tensorrt_llm"
    }
    plan = plan_for_spec(spec)
    files = render_files(RenderContext(spec, {}, engines, plan))
    replicas = routed_replicas(spec, plan)
    for model in (m for m in spec.models if m.engine == "sglang"):
        # A model behind the router with several instances runs as its replicas.
        for name in replicas.get(model.name, (model.name,)):
            config = json.loads(files[f"{name}/1/model.json"])
            engine = fake_sglang.Engine(**config)  # TypeError on a non-ServerArgs name
            assert engine.server_args.model_path == model.model


def test_h100x8_serves_an_sglang_model():
    spec = load_spec(ROOT / "deploy" / "examples" / "h100x8.yaml")
    assert [m.name for m in spec.models if m.engine == "sglang"] == ["llama8b-sglang"]


# -- streaming relay ---------------------------------------------------------------------


def test_stream_relays_deltas_with_one_final_flag(served):
    sender = served.run(
        text_input="What is the capital of France ?",
        stream=True,
        max_tokens=6,
        sampling_parameters={"temperature": 0},
    )
    assert "".join(texts(sender)) == expected_text(REPLY_WORDS[:6])
    # One response per chunk, or fewer: chunks that were ready together leave together.
    count = len(sender.responses())
    assert 1 <= count <= 6 and sender.final_flags() == 1
    last = sender.responses()[-1]
    assert last.value("finish_reason") == "length"
    assert last.value("num_input_tokens") == 7
    assert last.value("num_output_tokens") == 6
    assert {r.value("served_by") for r in sender.responses()} == {"qwen"}
    assert [r.value("finish_reason") for r in sender.responses()[:-1]] == [""] * (count - 1)
    call = served.engine.calls[-1]
    assert call["sampling_params"] == {"temperature": 0, "max_new_tokens": 6}
    assert call["stream"] is True and call["rid"].startswith("qwen-")
    assert served.metric("trident_generation_tokens_total") == 6
    assert served.metric("trident_prompt_tokens_total") == 7


@pytest.mark.parametrize("incremental,per_chunk", [(False, 3), (True, 1), (True, 4)])
def test_stream_text_is_right_whatever_sglang_streams(
    repo, tmp_path, monkeypatch, incremental, per_chunk
):
    args = {"incremental_streaming_output": incremental}
    for served in _serve(with_engine_args(repo, tmp_path, args), monkeypatch):
        assert served.engine.server_args.incremental_streaming_output is incremental
        served.engine.tokens_per_chunk = per_chunk
        sender = served.run(text_input="hi", stream=True, max_tokens=128)
        assert "".join(texts(sender)) == expected_text(REPLY_WORDS)
        assert sender.responses()[-1].value("finish_reason") == "stop"
        assert sender.responses()[-1].value("num_output_tokens") == len(REPLY_WORDS)


def test_sglang_writes_its_load_gauges_in_the_instance_folder(repo, tmp_path, monkeypatch):
    """With the server's engine-gauge folder named (trident_common/engine_gauges.py), the
    model turns SGLang's metrics on and points its scheduler (PROMETHEUS_MULTIPROC_DIR)
    at its instance's folder, emptied first: an engine killed with an earlier stub left
    its files there. The frontend's reader then finds the double's running request."""
    from builder.serve.openai.pod_metrics import (
        SGLANG_KV_USAGE,
        SGLANG_RUNNING,
        SGLANG_WAITING,
        sglang_gauges,
    )

    root = tmp_path / "gauges"
    stale = root / "qwen" / "qwen_0_0" / "gauge_mostrecent_1.db"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier engine's")
    monkeypatch.setenv(ENGINE_GAUGES_DIR_ENV, str(root))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # restored (unset) after the test
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")

    def load() -> dict[str, float]:
        return {sample.name: sample.value for sample in sglang_gauges(root, ["qwen"])}

    idle = {SGLANG_RUNNING: 0, SGLANG_WAITING: 0, SGLANG_KV_USAGE: 0}
    # A KV pool of 100 tokens: SGLang rounds token usage to 2 digits.
    for served in _serve(with_engine_args(repo, tmp_path, {"max_total_tokens": 100}), monkeypatch):
        assert served.engine.server_args.extra["enable_metrics"] is True
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(stale.parent)
        assert not stale.exists()
        served.engine.hold_after = 1
        sender = served.send(text_input="hi", stream=True)
        wait_for(sender.responses)
        busy = load()
        assert busy[SGLANG_RUNNING] == 1 and busy[SGLANG_WAITING] == 0, busy
        assert 0 < busy[SGLANG_KV_USAGE] < 1, busy
        served.engine.release()
        sender.wait_closed()
        wait_for(lambda: load() == idle)


def test_sglang_metrics_turned_off_in_the_spec_stay_off(repo, tmp_path, monkeypatch):
    monkeypatch.setenv(ENGINE_GAUGES_DIR_ENV, str(tmp_path / "gauges"))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # restored (unset) after the test
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    for served in _serve(with_engine_args(repo, tmp_path, {"enable_metrics": False}), monkeypatch):
        assert served.engine.server_args.extra["enable_metrics"] is False
        assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_stop_string_and_request_ids_are_passed_through(served):
    first = served.run(text_input="a", stream=True, sampling_parameters={"stop": "Paris"})
    second = served.run(text_input="b", stream=True)
    assert "".join(texts(first)) == expected_text(REPLY_WORDS[:5])
    assert first.responses()[-1].value("finish_reason") == "stop"
    rids = [c["rid"] for c in served.engine.calls]
    assert len(set(rids)) == 2 and second.final_flags() == 1


def test_non_streaming_sends_one_response_with_the_prompt(served):
    sender = served.run(text_input="Tell me", max_tokens=4)
    assert len(sender.sent) == 1 and sender.final_flags() == 1
    (response,) = sender.responses()
    assert response.value("text_output") == "Tell me" + expected_text(REPLY_WORDS[:4])
    assert response.value("num_output_tokens") == 4
    excluded = served.run(text_input="Tell me", max_tokens=4, exclude_input_in_output=True)
    assert texts(excluded) == [expected_text(REPLY_WORDS[:4])]


def test_chat_messages_use_the_engines_chat_template(served):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ]
    sender = served.run(messages=messages, stream=True, max_tokens=3)
    expected_prompt = fake_sglang.FakeTokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert served.engine.calls[-1]["prompt"] == expected_prompt
    assert "".join(texts(sender)) == expected_text(REPLY_WORDS[:3])


def test_messages_without_a_tokenizer_are_a_clear_error(repo, tmp_path, monkeypatch):
    args = {"skip_tokenizer_init": True}
    for served in _serve(with_engine_args(repo, tmp_path, args), monkeypatch):
        sender = served.run(messages=[{"role": "user", "content": "hi"}])
        (response,) = sender.responses()
        assert "no tokenizer" in response.error().message()
        assert served.engine.calls == []


# -- bad requests ------------------------------------------------------------------------


def test_unknown_sampling_key_is_an_error_naming_it(served):
    sender = served.run(
        text_input="hi", stream=True, sampling_parameters={"temprature": 0.5, "top_p": 0.9}
    )
    (response,) = sender.responses()
    assert response.has_error() and sender.final_flags() == 1
    assert "unknown sampling parameter(s) for sglang: temprature" in response.error().message()
    assert response.error().code() == pb.TritonError.INVALID_ARG
    assert served.engine.calls == []
    assert served.metric("trident_request_errors_total") == 1


def test_engine_validation_errors_become_bad_requests(served):
    too_long = served.run(text_input=" ".join(["word"] * 80), stream=True)
    bad_value = served.run(text_input="hi", sampling_parameters={"temperature": -1})
    assert "longer than the model's context length (64" in too_long.responses()[0].error().message()
    assert "temperature must be non-negative" in bad_value.responses()[0].error().message()
    assert too_long.responses()[0].error().code() == pb.TritonError.INVALID_ARG


def test_a_caller_that_asks_gets_its_refusal_in_band_with_the_final_flag(served):
    # The router asks (interface.ERRORS_IN_BAND): python_backend loses an error response
    # to a BLS call. Refused while read (execute) and by the engine's checks (the task).
    read = served.run(in_band=True, text_input="hi", sampling_parameters={"temperature": -1})
    checked = served.run(in_band=True, text_input=" ".join(["word"] * 80), stream=True)
    for sender, words in ((read, "temperature must be"), (checked, "context length")):
        ((response, flags),) = sender.sent  # one response, the final flag on it
        assert not response.has_error() and flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        error = response.value("error")
        assert error.startswith("invalid request: ") and words in error, error
        assert response.value("finish_reason") == "error"


# -- cancellation ------------------------------------------------------------------------


@pytest.fixture
def paced(repo, monkeypatch):
    """An engine making 100 tokens/s per stream, as a GPU would: a stream is still being
    generated when what its client did is seen (at its next response, by the outbox)."""
    monkeypatch.setattr(fake_sglang, "PACE", RateSource(Rate(0.0, 100.0)))
    yield from _serve(repo, monkeypatch)


def test_client_cancel_aborts_the_sglang_request(paced, monkeypatch):
    import trident_common.engine_model as engine_model

    monkeypatch.setattr(engine_model, "CANCEL_CHECK_S", 0.0)  # check on every chunk
    paced.engine.hold_after = 2
    sender = paced.send(text_input="long answer", stream=True)
    wait_for(lambda: sender.responses())
    sender.cancelled = True
    paced.engine.release()
    sender.wait_closed()
    rid = paced.engine.calls[-1]["rid"]
    wait_for(lambda: paced.engine.aborts == [rid])  # the final flag goes out first
    assert sender.sent[-1] == (None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sender.final_flags() == 1
    assert len("".join(texts(sender)).split()) < len(REPLY_WORDS)  # cut short
    assert paced.metric("trident_requests_aborted_total") == 1
    paced.wait_metric("trident_requests_in_flight", 0)


def test_router_abort_by_request_id(served):
    served.engine.hold_after = 1
    stream = served.send(True, text_input="long answer", stream=True, request_id="router-17")
    wait_for(lambda: len(stream.sent) == 1)
    control = served.run(True, abort_request_id="router-17")
    stream.wait_closed()
    assert control.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    wait_for(lambda: served.engine.aborts == [served.engine.calls[-1]["rid"]])  # after final
    assert stream.final_flags() == 1 and len(stream.responses()) == 1
    served.engine.hold_after = None
    assert served.run(text_input="next", stream=True).final_flags() == 1


def test_abort_of_an_unknown_request_only_closes_the_control_request(served):
    control = served.run(True, abort_request_id="never-seen")
    assert control.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    assert served.engine.aborts == []


# -- engine failures ---------------------------------------------------------------------


def test_failure_before_the_first_token_is_an_error_response(served):
    served.engine.fail_before_first = RuntimeError("scheduler died")
    sender = served.run(text_input="hi", stream=True)
    # The error, then the final flag on its own (a gRPC stream client sees both).
    assert len(sender.sent) == 2
    assert sender.sent[1] == (None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sender.responses()[0].error().message() == "sglang error: scheduler died"
    assert sender.responses()[0].error().code() == pb.TritonError.INTERNAL
    served.engine.fail_before_first = None
    again = served.run(text_input="hi", stream=True, max_tokens=2)
    assert "".join(texts(again)) == expected_text(REPLY_WORDS[:2])


def test_failure_after_the_first_token_is_an_error_output_then_final(served):
    served.engine.fail_after_chunks = 2
    sender = served.run(text_input="hi", stream=True)
    *data, error_output, final = sender.sent
    # Two chunks, in one response or two (chunks ready together leave together).
    assert "".join(r.value("text_output") for r, _ in data) == expected_text(REPLY_WORDS[:2])
    assert [r.value("error") for r, _ in data] == [""] * len(data) and len(data) <= 2
    assert error_output[1] == 0
    assert error_output[0].value("finish_reason") == "error"
    assert "illegal memory access" in error_output[0].value("error")
    assert final == (None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    served.engine.fail_after_chunks = None
    assert served.run(text_input="hi", stream=True, max_tokens=1).final_flags() == 1
    assert served.metric("trident_request_errors_total") == 1
    served.wait_metric("trident_requests_total", 2)


def test_engine_side_abort_with_a_status_is_reported_as_an_error(served):
    served.engine.abort_with_status = (503, "KV cache is full")
    sender = served.run(text_input="hi", stream=True, max_tokens=3)
    assert "KV cache is full (status 503)" in sender.responses()[-1].value("error")
    assert sender.final_flags() == 1


# -- prefix cache ------------------------------------------------------------------------


def test_cached_tokens_of_a_second_turn_are_counted(served):
    turn1 = [{"role": "user", "content": "What is the capital of France ?"}]
    first = served.run(messages=turn1, stream=True, max_tokens=6)
    assert served.metric("trident_prefix_cached_tokens_total") == 0
    answer = "".join(texts(first)).strip()
    turn2 = turn1 + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And of Italy ?"},
    ]
    served.run(messages=turn2, stream=True, max_tokens=6)
    prompts = [c["prompt"].split() for c in served.engine.calls]
    history = prompts[0] + answer.split()
    shared = common_prefix(history, prompts[1])
    assert shared == len(history)  # the whole first turn, answer included
    assert served.metric("trident_prefix_cached_tokens_total") == shared


def test_cached_tokens_of_an_aborted_request_are_counted(served):
    served.run(text_input="one two three four five", stream=True, max_tokens=2)
    served.engine.hold_after = 1
    sender = served.send(text_input="one two three four six", stream=True)
    wait_for(lambda: len(sender.sent) == 1)
    sender.cancelled = True
    served.engine.release()
    sender.wait_closed()
    served.wait_metric("trident_prefix_cached_tokens_total", 4)


def test_finalize_shuts_the_engine_down_and_keeps_the_metrics(repo, monkeypatch):
    pb.metric_violations.clear()
    for served in _serve(repo, monkeypatch):
        engine = served.engine
        served.run(text_input="hi", stream=True, max_tokens=1)
    import gc

    gc.collect()
    assert engine.shut_down
    assert pb.metric_violations == []
    # Never deleted: the model's next instance writes the same series (trident_common.metrics).
    assert pb.metric("trident_prefix_cached_tokens_total", model="qwen") is not None


# -- session affinity (the router's policy) ----------------------------------------------


def test_all_turns_of_a_conversation_go_to_the_same_sglang_backend():
    from bls.policy import Policy, features_from
    from builder.render.router_json import router_config

    data = sglang_spec()
    data["models"] = [{**data["models"][0], "name": f"qwen{i}"} for i in range(3)]
    data["router"] = {
        "default": ["qwen0"],
        "rules": [
            {"name": "chat", "match": {"task": "chat"}, "backends": ["qwen0", "qwen1", "qwen2"]}
        ],
    }
    policy = Policy(router_config(parse_spec(data, "<test>")))
    firsts = {}
    for conversation in (f"conv-{i}" for i in range(12)):
        messages = []
        for turn in range(4):
            messages += [{"role": "user", "content": f"question {turn} " * 20}]
            features = features_from(
                None, messages, {"task": "chat", "conversation_id": conversation}
            )
            firsts.setdefault(conversation, set()).add(policy.candidates(features)[1][0])
            messages += [{"role": "assistant", "content": "answer " * 30}]
    assert all(len(backends) == 1 for backends in firsts.values())
    assert len({b for backends in firsts.values() for b in backends}) > 1  # spread


def test_engine_start_failure_fails_the_load_with_the_reason(repo, tmp_path, monkeypatch):
    pb.metric_violations.clear()
    bad = with_engine_args(repo, tmp_path, {"tensor_parallel_size": 2})  # vLLM's name
    with pytest.raises(TypeError, match="tensor_parallel_size"):
        for _ in _serve(bad, monkeypatch):
            pass
    import gc

    gc.collect()
    assert pb.metric_violations == []


# -- abort ownership, races and a dead engine ----------------------------------------------


def test_engine_ids_cannot_be_aborted_from_outside(served):
    served.engine.hold_after = 1
    stream = served.send(text_input="long answer", stream=True, max_tokens=6)
    wait_for(lambda: len(stream.sent) == 1)
    rid = served.engine.calls[-1]["rid"]
    for guess in [rid] + [f"qwen-{n}" for n in range(8)]:
        assert served.run(abort_request_id=guess).final_flags() == 1
    served.engine.release()
    stream.wait_closed()
    assert served.engine.aborts == []
    assert "".join(texts(stream)) == expected_text(REPLY_WORDS[:6])


def test_an_abort_that_overtakes_its_request_stops_it(served):
    served.run(True, abort_request_id="router-early")
    stream = served.run(True, text_input="hi", stream=True, request_id="router-early")
    assert stream.sent == [(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    assert served.engine.calls == []
    assert served.metric("trident_requests_aborted_total") == 1
    assert served.metric("trident_requests_in_flight") == 0


def test_a_duplicate_request_id_does_not_take_over_the_abort(served):
    served.engine.hold_after = 1
    first = served.send(True, text_input="one", stream=True, request_id="dup")
    wait_for(lambda: len(first.sent) == 1)
    second = served.send(True, text_input="two", stream=True, request_id="dup")
    wait_for(lambda: len(second.sent) == 1)
    served.run(True, abort_request_id="dup")
    first.wait_closed()
    wait_for(lambda: served.engine.aborts == [served.engine.calls[0]["rid"]])  # after final
    served.engine.release()
    second.wait_closed()
    assert second.responses()[-1].value("finish_reason") == "stop"
    served.wait_metric("trident_requests_in_flight", 0)


def test_a_send_that_fails_on_a_cancelled_stream_still_ends_the_request(paced):
    paced.engine.hold_after = 1
    stream = paced.send(text_input="long answer", stream=True)
    wait_for(lambda: len(stream.sent) == 1)
    stream.cancelled = True
    stream.fail_sends = True  # Triton closed the stream: every send now raises
    paced.engine.release()
    wait_for(lambda: paced.engine.aborts == [paced.engine.calls[-1]["rid"]])
    paced.wait_metric("trident_requests_in_flight", 0)
    paced.wait_metric("trident_requests_aborted_total", 1)
    assert paced.metric("trident_request_errors_total") == 0


def test_a_failed_final_send_is_never_followed_by_a_cancellation_check():
    """Triton 2.51 deletes a request's response factory with its final flag, even when
    that send fails, and answers a later is_cancelled() from the freed memory (a CI run's
    vLLM server ended with Signal 11 in libtriton_python.so right after a cancel). When
    the final response's send raised (the client gone), the failure is classed without
    asking (tests/conftest.py fails any test whose model asks after the final flag)."""
    from trident_common import engine_model

    sender = pb.ResponseSender()
    sender.fail_sends = True
    with pytest.raises(pb.TritonModelException):
        sender.send(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    active = engine_model._Active("qwen-9", "", sender)
    active.closed = True  # as _relay marks it when it queues the final response
    # _failed's question (on the loop, after a send raised): was it the client's leaving?
    assert engine_model.AsyncEngineModel._client_gone(active) is True
    assert pb.cancel_checks_after_final == []


def test_a_client_that_left_after_its_last_token_counts_as_aborted(served, monkeypatch):
    """Unpaced, the engine may be done before the outbox finds the client gone: the
    request still counts as aborted (not served), and its request still ends once."""
    import trident_common.engine_model as engine_model

    monkeypatch.setattr(engine_model, "CANCEL_CHECK_S", 0.0)
    served.engine.hold_after = 1
    stream = served.send(text_input="long answer", stream=True)
    wait_for(lambda: len(stream.sent) == 1)
    stream.cancelled = True
    served.engine.release()
    stream.wait_closed()
    assert stream.final_flags() == 1 and len(stream.responses()) == 1
    served.wait_metric("trident_requests_aborted_total", 1)
    served.wait_metric("trident_requests_in_flight", 0)
    assert served.metric("trident_requests_total") == 1


def test_a_hanging_engine_abort_does_not_hold_the_final_flag(served, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="trident")
    import trident_common.engine_model as engine_model

    monkeypatch.setattr(engine_model, "ABORT_TIMEOUT_S", 0.2)
    hung = []

    async def hang(engine_id):
        hung.append(engine_id)
        await asyncio.sleep(3600)

    served.model.abort = hang
    served.engine.hold_after = 1
    stream = served.send(True, text_input="long answer", stream=True, request_id="r-1")
    wait_for(lambda: len(stream.sent) == 1)
    served.run(True, abort_request_id="r-1")
    stream.wait_closed()
    assert stream.final_flags() == 1
    wait_for(lambda: hung)  # the engine abort starts after the final flag went out
    served.wait_metric("trident_requests_in_flight", 0)  # once the abort gives up
    served.engine.release()
    lines = [r.getMessage() for r in caplog.records]
    assert "[sglang] Cancelling the request r-1" in lines
    assert any(
        line.startswith(f"[sglang] Aborting {hung[0]} in the engine failed") for line in lines
    )


def test_a_dead_engine_ends_requests_in_flight_and_refuses_new_ones(served, monkeypatch):
    import trident_common.engine_model as engine_model

    monkeypatch.setattr(engine_model, "HEALTH_CHECK_S", 0.05)
    served.wait_metric("trident_engine_healthy", 1)
    served.engine.hold_after = 1
    stream = served.send(text_input="long answer", stream=True)
    wait_for(lambda: len(stream.sent) == 1)
    served.model.engine_dead = lambda: "the engine core exited"
    stream.wait_closed(timeout_s=10)  # the health check runs every 2 s
    error = stream.responses()[-1].value("error")
    assert error == "sglang engine is dead: the engine core exited"
    assert stream.sent[-1] == (None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    served.wait_metric("trident_engine_healthy", 0)
    after = served.run(text_input="hi", stream=True)
    message = after.responses()[0].error().message()
    assert message == "sglang engine is dead: the engine core exited"
    assert after.responses()[0].error().code() == pb.TritonError.INTERNAL
    assert after.final_flags() == 1 and len(served.engine.calls) == 1
    served.wait_metric("trident_requests_in_flight", 0)
    served.engine.release()


def test_string_sampling_values_reach_sglang_typed(served):
    served.run(
        text_input="hi",
        stream=True,
        sampling_parameters={"temperature": "0", "seed": "5", "top_k": "-1"},
    )
    assert served.engine.calls[-1]["sampling_params"] == {
        "temperature": 0.0,
        "sampling_seed": 5,
        "top_k": -1,
        "max_new_tokens": 128,
    }


# -- who may set what: the router's proof (trust.py, issue 21) ---------------------------------


def test_a_second_connection_cannot_end_a_direct_clients_stream(served):
    served.engine.hold_after = 1
    victim = served.send(text_input="long answer", stream=True, max_tokens=6, request_id="mine")
    wait_for(lambda: len(victim.sent) == 1)
    attacker = served.run(abort_request_id="mine")
    assert (
        attacker.responses()[0]
        .error()
        .message()
        .startswith("invalid request: abort_request_id is the router's own input")
    )
    served.engine.release()
    victim.wait_closed()
    assert served.engine.aborts == []
    assert "".join(texts(victim)) == expected_text(REPLY_WORDS[:6])


def test_a_direct_client_cannot_pre_abort_a_request_nor_the_routers(served):
    served.run(abort_request_id="next")  # refused, not remembered
    later = served.run(text_input="hi", stream=True, max_tokens=3, request_id="next")
    assert "".join(texts(later)) == expected_text(REPLY_WORDS[:3])
    served.run(True, abort_request_id="router-9")  # the router's is remembered...
    direct = served.run(text_input="hi", stream=True, max_tokens=3, request_id="router-9")
    assert "".join(texts(direct)) == expected_text(REPLY_WORDS[:3])  # ...for its own only
    served.engine.hold_after = 1
    routed = served.send(True, text_input="hi", stream=True, max_tokens=4, request_id="r-7")
    wait_for(lambda: len(routed.sent) == 1)
    served.run(abort_request_id="r-7")  # a client guessing its id
    served.engine.release()
    routed.wait_closed()
    assert "".join(texts(routed)) == expected_text(REPLY_WORDS[:4])
    assert served.metric("trident_requests_aborted_total") == 0


@pytest.mark.parametrize(
    "inputs,name", [({"cache_salt": "f" * 32}, "cache_salt"), ({"priority": 0}, "priority")]
)
def test_direct_salt_or_priority_is_refused_naming_it(served, inputs, name):
    for proof in (None, "0" * 64):  # none, or a forged one
        sender = served.run(proof=proof, text_input="hi", stream=True, **inputs)
        error = sender.responses()[0].error()
        assert error.message().startswith(f"invalid request: {name} is set by the router")
        assert error.code() == pb.TritonError.INVALID_ARG and sender.final_flags() == 1
    assert served.engine.calls == []
    routed = served.run(True, text_input="hi", stream=True, max_tokens=2, **inputs)
    assert "".join(texts(routed)) == expected_text(REPLY_WORDS[:2])


def test_without_a_secret_no_caller_sets_tenant_values(repo, monkeypatch):
    for served in _serve(repo, monkeypatch, secret=None):
        refused = served.run(True, text_input="hi", stream=True, cache_salt="s")
        assert "cache_salt is set by the router only" in refused.responses()[0].error().message()
        plain = served.run(text_input="hi", stream=True, max_tokens=1)
        assert plain.final_flags() == 1 and not plain.responses()[0].has_error()


def test_a_short_secret_fails_the_load_in_one_line(repo, monkeypatch):
    monkeypatch.setenv(ROUTER_SECRET_ENV, "short")
    with fake_stub_modules():
        model = load_model_module().TritonPythonModel()
        with pytest.raises(trust.SecretError) as failed:
            model.initialize(
                {
                    "model_name": "qwen",
                    "model_repository": str(repo / "qwen"),
                    "model_version": "1",
                    "model_config": "{}",
                }
            )
    assert "\n" not in str(failed.value) and ROUTER_SECRET_ENV in str(failed.value)
