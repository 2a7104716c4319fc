"""A constraint that takes the engine too long to compile is the client's error, not the
backend's (issue 34; trident_common/compile_bound.py): the engine model
ends the request with a client error naming `response_format` or `tools` (the router
neither retries it elsewhere nor counts it against the backend: bls/relay.py's
FINAL_CLASSES), aborts it in the engine, and keeps serving. On trident's SGLang model with
the SGLang double (support/fake_sglang.py: `compile_s`, `grammar_timeout_s`), and on the
vLLM model's stream with an AsyncLLM stand-in whose first output comes late."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tests.helpers import wait_for
from tests.python_backends.test_sglang_model import _serve, repo  # noqa: F401 (fixture)
from tests.python_backends.test_vllm_health import module as vllm_module  # noqa: F401
from trident_common import error_classes
from trident_common.compile_bound import COMPILE_TIMEOUT_S, CompileTimeout, FirstOutputs
from trident_common.structured import needs_compile

MESSAGES = [{"role": "user", "content": "Give me a record"}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FORCED = {
    "tools": [{"type": "function", "function": {"name": "get_time", "parameters": SCHEMA}}],
    "tool_choice": "get_time",
}
BOUND_S = 0.2  # the tests' compile bound (COMPILE_TIMEOUT_S is 30 s)


def structured(**constraint) -> dict:
    return {"sampling_parameters": {"structured_outputs": constraint}}


def in_band_error(sender) -> error_classes.Parsed:
    """The router's view of the answer: errors in band (interface.ERRORS_IN_BAND)."""
    (response,) = [r for r in sender.responses() if r.value("error")]
    return error_classes.parse(response.value("error"))


# -- the bound itself -------------------------------------------------------------------


def test_the_bound_answers_before_the_routers_first_token_timeout():
    from builder.spec.deployment import RouterSpec

    assert COMPILE_TIMEOUT_S <= RouterSpec().first_token_timeout_s / 2


def test_only_a_constraint_that_needs_compiling_is_bounded():
    assert needs_compile({"structured_outputs": {"json": SCHEMA}})
    assert needs_compile({"structured_outputs": {"regex": "a{1,50000}"}})
    assert needs_compile({"structured_outputs": {"choice": ["a", "b"]}})
    assert needs_compile({"structured_outputs": {"grammar": "root ::= 'a'"}})
    assert needs_compile({"regex": "[0-9]+"}) and needs_compile({"ebnf": "root ::= 'a'"})
    assert needs_compile({"json_schema": json.dumps(SCHEMA)})
    # json_object: every engine's one built-in grammar, compiled once.
    assert not needs_compile({"structured_outputs": {"json_object": True}})
    assert not needs_compile(
        {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}
    )
    assert not needs_compile({"structured_outputs": {"json": {"type": "object"}}})
    assert not needs_compile({"json_schema": '{"type": "object"}'})
    assert not needs_compile({"temperature": 0.0})


async def _late(seconds: float, value: str = "first") -> str:
    await asyncio.sleep(seconds)
    return value


def test_a_constrained_request_without_output_within_the_bound_is_the_clients():
    async def scenario():
        outputs = FirstOutputs(BOUND_S)
        late = asyncio.ensure_future(_late(60))
        with pytest.raises(CompileTimeout) as refused:
            await outputs.first("e1", late, "[response_format] ")
        assert late.cancelled()  # the engine's wait is given up: the request ends there
        assert outputs.waiting() == []
        return refused.value

    refused = asyncio.run(scenario())
    assert str(refused).startswith(f"[response_format] no output within {BOUND_S:g} s")
    assert error_classes.parse(refused.marked()).param == "response_format"


def test_in_time_or_unconstrained_the_output_is_awaited_as_it_comes():
    async def scenario():
        outputs = FirstOutputs(BOUND_S)
        assert await outputs.first("e1", _late(0.01), "[tools] ") == "first"
        assert await outputs.first("e2", _late(BOUND_S * 2), "") == "first"  # not bounded

    asyncio.run(scenario())


def test_behind_an_older_request_that_has_not_started_the_queue_is_not_blamed():
    """A request that waits behind older ones which have not started either is waiting
    in the engine's queue: blamed only once none of them waits any more."""

    async def scenario():
        outputs = FirstOutputs(BOUND_S, recheck_s=0.02)
        older = asyncio.ensure_future(outputs.first("old", _late(BOUND_S * 2), ""))
        await asyncio.sleep(0)
        assert outputs.waiting() == ["old"]
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(CompileTimeout):
            await outputs.first("new", _late(60), "[response_format] ")
        assert loop.time() - started >= BOUND_S * 2 - 0.05  # not at BOUND_S
        assert older.done() and older.result() == "first"

    asyncio.run(scenario())


# -- SGLang -----------------------------------------------------------------------------


@pytest.fixture
def served(repo, monkeypatch):  # noqa: F811
    for served in _serve(repo, monkeypatch):
        served.model.first_outputs.timeout_s = BOUND_S
        yield served


@pytest.mark.parametrize(
    "inputs, param",
    [(structured(json=SCHEMA), "response_format"), (FORCED, "tools")],
)
def test_sglang_a_compile_past_the_bound_is_a_client_error_and_is_aborted(served, inputs, param):
    served.engine.compile_s = 30.0  # SGLang is still compiling when the bound passes
    sender = served.run(True, in_band=True, messages=MESSAGES, request_id="r1", **inputs)
    refused = in_band_error(sender)
    assert (refused.error_class, refused.param) == (error_classes.CLIENT, param)
    assert f"no output within {BOUND_S:g} s" in refused.reason
    assert sender.final_flags() == 1
    rid = served.engine.calls[-1]["rid"]
    wait_for(lambda: served.engine.aborts == [rid])  # stopped in the engine, after the answer
    # The engine goes on serving: the next request is answered.
    served.engine.compile_s = 0.0
    assert not served.run(messages=MESSAGES, **inputs).responses()[-1].has_error()


def test_sglang_a_compile_within_the_bound_is_answered(served):
    served.engine.compile_s = BOUND_S / 4
    sender = served.run(messages=MESSAGES, **structured(json=SCHEMA))
    assert json.loads(sender.responses()[-1].value("text_output")) == {"n": 0}


def test_sglang_json_object_is_never_bounded(served):
    served.engine.compile_s = BOUND_S * 2  # the double's compile: none for any object
    served.model.first_outputs.timeout_s = 0.01
    sender = served.run(messages=MESSAGES, **structured(json_object=True))
    assert not sender.responses()[-1].has_error()


def test_sglangs_own_compile_timeout_names_the_parameter_not_the_schema(served):
    """SGLang's own give-up (grammar_manager.py) aborts with 400 and quotes the whole
    schema: the client gets trident's words naming response_format."""
    served.model.first_outputs.timeout_s = 60.0
    served.engine.compile_s, served.engine.grammar_timeout_s = 30.0, 0.05
    sender = served.run(True, in_band=True, messages=MESSAGES, **structured(json=SCHEMA))
    refused = in_band_error(sender)
    assert (refused.error_class, refused.param) == (error_classes.CLIENT, "response_format")
    assert "gave up compiling" in refused.reason and "properties" not in refused.reason


# -- vLLM -------------------------------------------------------------------------------


class LateEngine:
    """AsyncLLM's generate and abort, for the vLLM model's stream: the first output comes
    after `first_s` (the engine core compiling the constraint), or ends with vLLM's
    finish_reason "error" (FINISHED_ERROR: what a failed compile gets)."""

    def __init__(self, first_s=0.0, finish="stop", tokens=1):
        self.first_s, self.finish, self.tokens = first_s, finish, tokens
        self.aborted: list[str] = []
        self.closed: list[str] = []

    async def generate(
        self, prompt, params, request_id, priority=0, lora_request=None, trace_headers=None
    ):
        self.trace_headers = trace_headers
        try:
            await asyncio.sleep(self.first_s)
            completion = SimpleNamespace(
                text="{}",
                token_ids=list(range(self.tokens)),
                finish_reason=self.finish,
                logprobs=None,
                cumulative_logprob=None,
            )
            yield SimpleNamespace(
                prompt_token_ids=[1, 2],
                outputs=[completion],
                num_cached_tokens=0,
                finished=True,
            )
        except asyncio.CancelledError:
            self.aborted.append(request_id)  # as AsyncLLM.generate aborts a left request
            raise


def vllm_model(module, engine):  # noqa: F811
    model = module.TritonPythonModel()
    model.engine = engine
    model.first_outputs = FirstOutputs(BOUND_S)
    model.metrics = SimpleNamespace(prefix_cached_tokens=SimpleNamespace(increment=lambda n: None))
    model._client_errors = (ValueError, TypeError, OverflowError)
    model._generate_error = RuntimeError
    return model


def call(module, constraint="[response_format] ", bounded=True):  # noqa: F811
    return module._Call(object(), 0, None, None, None, constraint, bounded)


def collect(model, sampling):
    async def run():
        return [delta async for delta in model._deltas("prompt", sampling, "e1")]

    return asyncio.run(run())


def test_vllm_a_compile_past_the_bound_is_a_client_error(vllm_module):  # noqa: F811
    engine = LateEngine(first_s=30.0)
    model = vllm_model(vllm_module, engine)
    with pytest.raises(CompileTimeout, match=r"^\[tools\] no output within"):
        collect(model, call(vllm_module, "[tools] "))
    assert engine.aborted == ["e1"]


def test_vllm_unbounded_or_in_time_the_answer_comes(vllm_module):  # noqa: F811
    late = vllm_model(vllm_module, LateEngine(first_s=BOUND_S * 2))
    (delta,) = collect(late, call(vllm_module, "[response_format] ", bounded=False))
    assert delta.finish_reason == "stop"
    quick = vllm_model(vllm_module, LateEngine(first_s=0.0))
    (delta,) = collect(quick, call(vllm_module))
    assert delta.finish_reason == "stop"


def test_vllm_a_failed_compile_is_the_clients_error_naming_the_parameter(
    vllm_module,  # noqa: F811
):
    """vLLM finishes a request whose grammar failed to compile in the engine core (its
    regex compile timeout included) with finish_reason "error" and no token: the client's
    error, named. Without a constraint, or after tokens, "error" is the engine's."""
    model = vllm_model(vllm_module, LateEngine(finish="error", tokens=0))
    with pytest.raises(vllm_module.BadRequest, match=r"^\[response_format\] .* cannot be compiled"):
        collect(model, call(vllm_module))
    with pytest.raises(RuntimeError, match="finish_reason error") as failed:
        collect(model, call(vllm_module, "", bounded=False))
    assert not isinstance(failed.value, vllm_module.BadRequest)
    started = vllm_model(vllm_module, LateEngine(finish="error", tokens=3))
    with pytest.raises(RuntimeError, match="finish_reason error"):
        collect(started, call(vllm_module))
