"""Bad and odd requests for an engine model (vLLM or SGLang), and a checker for the answers.

Each Case is one kind of request a careless or hostile client sends: missing or doubled
inputs, wrong dtypes and shapes, invalid UTF-8, sampling values of the wrong type or out
of range, strings for numbers (the vllm_backend dialect), nested JSON, a 100 KB prompt.
`run_grpc` sends one over a gRPC stream (with empty final responses on) and records what
came back; `problems` says what is wrong with that: no final flag, an empty error, Python
exception text, a client fault reported as an engine error, or an error where a normal
answer was due. The server tests send every case to a model directly, then check it
still answers.
"""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from builder.serve.client import first_output
from tests.helpers import http_json

CLIENT = "client"  # must be refused as the client's fault ("invalid request: ...")
ERROR = "error"  # must be refused; Triton itself may (then no final flag follows)
ANSWER = "answer"  # must be answered normally
EITHER = "either"  # an answer or an error in words

# Text that means a Python exception leaked to the client instead of a reason.
PYTHON_LEAKS = re.compile(
    r"not supported between|object has no attribute|Traceback|unexpected keyword|"
    r"NoneType|object is not (subscriptable|iterable|callable)|invalid literal for|"
    r"list index out of range|KeyError|can't multiply|must be real number|"
    r"Expected `?\w+`?, got|got an unexpected"
)
ANSWER_TIMEOUT_S = 120.0
FINAL_AFTER_ERROR_S = 10.0  # how long the final flag may trail an error response


def text(name: str, value) -> grpcclient.InferInput:
    """A BYTES input; `value` may be str, bytes or a list of them (shape follows)."""
    values = value if isinstance(value, list) else [value]
    encoded = [v.encode() if isinstance(v, str) else v for v in values]
    tensor = grpcclient.InferInput(name, [len(encoded)], "BYTES")
    tensor.set_data_from_numpy(np.array(encoded, dtype=np.object_))
    return tensor


def number(name: str, value, dtype: str = "INT32") -> grpcclient.InferInput:
    np_dtype = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "BOOL": bool}[dtype]
    tensor = grpcclient.InferInput(name, [1], dtype)
    tensor.set_data_from_numpy(np.array([value], dtype=np_dtype))
    return tensor


@dataclass
class Case:
    name: str
    inputs: list  # InferInput builders' results
    expect: str = CLIENT
    parameters: dict | None = None
    # The parameter a client error must name (its `[param] ` tag, error_classes.py): what
    # the OpenAI frontend then answers as `param`.
    param: str | None = None


def _prompt(
    sampling: dict | None = None,
    max_tokens: int = 4,
    raw: str | None = None,
    prompt: str = "Say hi.",
) -> list:
    inputs = [
        text("text_input", prompt),
        number("stream", True, "BOOL"),
        number("max_tokens", max_tokens),
    ]
    if raw is not None:
        inputs.append(text("sampling_parameters", raw))
    elif sampling is not None:
        inputs.append(text("sampling_parameters", json.dumps(sampling)))
    return inputs


def _messages(raw: str) -> list:
    return [text("messages", raw), number("stream", True, "BOOL"), number("max_tokens", 4)]


def _sampling(name: str, values: dict, expect: str = CLIENT, param: str | None = None) -> Case:
    return Case(name, _prompt({"temperature": 0, **values}), expect, param=param)


def cases() -> list[Case]:
    """About fifty kinds; built fresh per call (InferInputs are not reusable across
    clients)."""
    stream = number("stream", True, "BOOL")
    return [
        # -- inputs ---------------------------------------------------------------------
        Case("no inputs at all", [stream]),
        Case("only max_tokens", [stream, number("max_tokens", 4)]),
        Case(
            "text_input and messages",
            _prompt() + [text("messages", json.dumps([{"role": "user", "content": "hi"}]))],
        ),
        Case("empty text_input", _prompt(prompt="")),
        Case("invalid UTF-8 text_input", [text("text_input", b"\xff\xfe\xfa"), stream]),
        Case("text_input as INT32", [number("text_input", 5), stream], ERROR),
        Case(
            "text_input with two elements", [text("text_input", ["a", "b"]), stream], ERROR
        ),  # Triton refuses the shape
        Case("text_input of zero elements", [text("text_input", []), stream], ERROR),
        Case("100 KB prompt", _prompt(prompt="hello " * 17000)),
        Case("prompt of NUL bytes", _prompt(prompt="\x00" * 64), EITHER),
        Case("stream as INT32", [text("text_input", "hi"), number("stream", 1)], ERROR),
        Case(
            "max_tokens as FP32",
            [text("text_input", "hi"), stream, number("max_tokens", 4.0, "FP32")],
            ERROR,
        ),
        Case("max_tokens zero", _prompt(max_tokens=0)),
        Case("max_tokens negative", _prompt(max_tokens=-5)),
        # -- messages -------------------------------------------------------------------
        Case("messages not JSON", _messages("[{role: user")),
        Case(
            "messages an object", _messages(json.dumps({"role": "user", "content": "hi"})), ANSWER
        ),  # one message on its own is an accepted shape (parse_messages)
        Case("messages an empty list", _messages("[]")),
        Case("messages null", _messages("null")),
        Case("messages a list of strings", _messages(json.dumps(["hi"]))),
        Case("message without content", _messages(json.dumps([{"role": "user"}]))),
        Case("message content a number", _messages(json.dumps([{"role": "user", "content": 5}]))),
        Case("message without role", _messages(json.dumps([{"content": "hi"}]))),
        Case("messages nested deep", _messages("[" * 5000 + "]" * 5000)),
        Case("empty messages string", _messages("")),
        # -- sampling_parameters as a whole ---------------------------------------------
        Case("sampling not JSON", _prompt(raw="{temperature: 0")),
        Case("sampling a JSON list", _prompt(raw="[1, 2]")),
        Case("sampling null", _prompt(raw="null")),
        Case("sampling empty string", _prompt(raw=""), ANSWER),
        Case("sampling nested deep", _prompt(raw='{"a":' * 3000 + "1" + "}" * 3000)),
        _sampling("unknown sampling key", {"temprature": 0}),
        _sampling("nested value", {"temperature": {"x": 1}}),
        # -- sampling values: the strings dialect (answered) ----------------------------
        _sampling("string numbers", {"temperature": "0", "top_p": "1", "max_tokens": "4"}, ANSWER),
        _sampling("string seed", {"seed": "5"}, ANSWER),
        _sampling("string n of one", {"n": "1"}, ANSWER),
        _sampling("string bool", {"ignore_eos": "false"}, ANSWER),
        # -- sampling values: wrong type or range ---------------------------------------
        _sampling("temperature a word", {"temperature": "hot"}),
        _sampling("temperature negative", {"temperature": -1}),
        _sampling("temperature NaN", {"temperature": float("nan")}),
        _sampling("penalty infinite", {"presence_penalty": "Infinity"}),
        _sampling("top_p above one", {"top_p": 2}),
        _sampling("top_p zero", {"top_p": 0}),
        _sampling("top_k fractional", {"top_k": 1.5}),
        _sampling("top_k a word", {"top_k": "abc"}),
        _sampling("seed a word", {"seed": "five"}),
        _sampling("n of five", {"n": 5}),
        _sampling("stop a number", {"stop": 5}),
        _sampling("stop numbers", {"stop": [1, 2]}),
        _sampling("stop empty string", {"stop": ""}),
        _sampling("min_tokens over max_tokens", {"min_tokens": 50}),
        _sampling("max_tokens a word", {"max_tokens": "many"}),
        _sampling("repetition_penalty zero", {"repetition_penalty": 0}),
        _sampling("ignore_eos maybe", {"ignore_eos": "maybe"}),
        _sampling("logit_bias out of vocab", {"logit_bias": {"99999999": 5}}, param="logit_bias"),
        _sampling("logit_bias a word", {"logit_bias": "nope"}),
        _sampling("logit_bias bad key", {"logit_bias": {"abc": 1}}),
        _sampling(
            "stop_token_ids out of vocab", {"stop_token_ids": [99999999]}, param="stop_token_ids"
        ),
        _sampling("allowed_token_ids negative", {"allowed_token_ids": [-1]}),
        _sampling("structured_outputs not JSON", {"structured_outputs": "{{"}),
        _sampling("structured_outputs empty", {"structured_outputs": {}}),
        # -- request parameters (the vllm_backend dialect) ------------------------------
        Case(
            "parameters as sampling",
            [text("text_input", "Say hi."), stream],
            ANSWER,
            {"temperature": 0, "max_tokens": 4},
        ),
        Case(
            "parameters with a bad value",
            [text("text_input", "Say hi."), stream],
            CLIENT,
            {"temperature": "hot"},
        ),
        # -- control --------------------------------------------------------------------
        Case("abort of an unknown id", [text("abort_request_id", "nobody-42")], EITHER),
    ]


@dataclass
class Outcome:
    case: Case
    texts: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    finals: int = 0
    timed_out: bool = False


def run_grpc(url: str, model: str, case: Case) -> Outcome:
    """Send one case over a gRPC stream; wait for its final flag (bounded)."""
    outcome = Outcome(case)
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        client.async_stream_infer(
            model, case.inputs, enable_empty_final_response=True, parameters=case.parameters
        )
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not outcome.finals:
            try:
                result, error = events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                outcome.timed_out = True
                break
            _record(outcome, result, error)
            if error is not None:
                deadline = min(deadline, time.monotonic() + FINAL_AFTER_ERROR_S)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return outcome


def _record(outcome: Outcome, result, error) -> None:
    if error is not None:
        outcome.errors.append(error.message())
        return
    final = result.get_response().parameters.get("triton_final_response")
    if final is not None and final.bool_param:
        outcome.finals += 1
    message = first_output(result, "error")
    if message:
        outcome.errors.append(message)
    piece = first_output(result, "text_output")
    if piece is not None:
        outcome.texts.append(piece)


def problems(outcome: Outcome) -> list[str]:
    """What is wrong with how a case was answered (empty when it was answered cleanly)."""
    found = []
    expect = outcome.case.expect
    rejected_by_triton = expect == ERROR and outcome.errors and not outcome.finals
    if (outcome.timed_out or outcome.finals != 1) and not rejected_by_triton:
        found.append(f"{outcome.finals} final flags (timed out: {outcome.timed_out})")
    for message in outcome.errors:
        found += message_problems(message, expect)
    if expect in (CLIENT, ERROR) and not outcome.errors:
        found.append(f"answered, but an error was due: {''.join(outcome.texts)[:60]!r}")
    if expect == ANSWER and outcome.errors:
        found.append("refused, but an answer was due")
    tag = f"invalid request: [{outcome.case.param}] "
    if outcome.case.param and not any(m.startswith(tag) for m in outcome.errors):
        found.append(f"does not name {outcome.case.param}: {outcome.errors[:1]}")
    return found


def message_problems(message: str, expect: str) -> list[str]:
    found = []
    body = message.split(": ", 1)[-1].strip()
    if not body or body.endswith(":"):
        found.append(f"empty error message: {message!r}")
    if PYTHON_LEAKS.search(message):
        found.append(f"Python exception text: {message[:160]!r}")
    if expect == CLIENT and "invalid request: " not in message:
        found.append(f"not marked as the client's fault: {message[:160]!r}")
    return found


# -- HTTP generate ------------------------------------------------------------------------

HTTP_CASES = [
    ("http bad sampling JSON", {"text_input": "hi", "sampling_parameters": "{x"}, CLIENT),
    (
        "http string seed",
        {
            "text_input": "Say hi.",
            "max_tokens": 4,
            "sampling_parameters": json.dumps({"seed": "5", "temperature": "0"}),
        },
        ANSWER,
    ),
    ("http missing text_input", {"max_tokens": 4}, CLIENT),
    ("http text_input a number", {"text_input": 5, "max_tokens": 4}, EITHER),
    ("http max_tokens a string", {"text_input": "hi", "max_tokens": "x"}, ERROR),
    (
        "http temperature negative",
        {
            "text_input": "hi",
            "max_tokens": 4,
            "sampling_parameters": json.dumps({"temperature": -1}),
        },
        CLIENT,
    ),
]


def run_http(http_url: str, model: str, body: dict, expect: str) -> list[str]:
    """POST one body to /generate; the problems with the answer (empty when clean)."""
    try:
        status, answer = http_json(
            f"{http_url}/v2/models/{model}/generate", body, timeout=ANSWER_TIMEOUT_S
        )
    except urllib.error.HTTPError as e:
        message = json.loads(e.read() or b"{}").get("error", "")
        found = message_problems(message, expect)
        return found + (["refused, but an answer was due"] if expect == ANSWER else [])
    if expect in (CLIENT, ERROR):
        return [f"answered ({status}), but an error was due: {answer[:80]!r}"]
    return []
