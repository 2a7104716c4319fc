"""OpenAI conformance of the sampling fields, logprobs and n, end to end: the real openai
SDK (sync and async, streamed and not: every mode on the double, one on vLLM, as
tests/server/client_matrix.py says) against the real OpenAI frontend, a real
tritonserver and trident's router, in front of real vLLM (SmolLM2, the session's default
server) and of the SGLang model on the engine double (support/fake_sglang.py). Every
answer is parsed with the SDK's own types (the SDK's create() does it; the raw SSE cases
validate each chunk). Tool calls and structured outputs have their own modules.

The double's "model" speaks a fixed reply (fake_sglang.REPLY, one word a token), so its
cases check what the engine model and the frontend do with it (stop strings, limits,
choices, usage, logprobs: the double's sampled word is always its best); what needs a
model's numbers (seeds, logit_bias) is asked of vLLM. Greedy (temperature 0) unless a
case is about sampling.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from builder.serve.openai.pod_metrics import KV_USAGE, RUNNING, WAITING
from builder.serve.openai.runner import Frontend
from builder.serve.server import free_port
from tests.helpers import wait_for
from tests.server.client_matrix import engine_modes, engine_streams, real_modes
from tests.server.test_openai import pod_gauges
from tests.server.test_triton_sampling import sampled_ids

pytestmark = [pytest.mark.server, pytest.mark.vllm]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
# The engine a case runs on, and the pooled server behind it (tests/server/conftest.py):
# real vLLM (the embedded default) and the SGLang double.
ENGINES = (
    pytest.param("vllm", marks=pytest.mark.uses_server("default_server")),
    pytest.param("sglang", marks=pytest.mark.uses_server("sglang_server")),
)
VLLM_ONLY = (pytest.param("vllm", marks=pytest.mark.uses_server("default_server")),)


@pytest.fixture(scope="module")
def servers(request):
    """Started on first use: a run of the SGLang cases alone starts no vLLM."""
    return {
        "vllm": lambda: request.getfixturevalue("default_server"),
        "sglang": lambda: request.getfixturevalue("sglang_server"),
    }


@pytest.fixture(scope="module")
def frontends(servers):
    started, stack = {}, []

    def get(engine):
        if engine not in started:
            server = servers[engine]()
            frontend = Frontend(
                server.grpc_url,
                port=free_port(),
                repo=server.repository,
                admin_key=getattr(server, "admin_key", None),
                metrics_url=server.metrics_url,
                engine_gauges=server.gauges_folder,
            )
            started[engine] = frontend.__enter__()
            stack.append(frontend)
        return started[engine]

    yield get
    for frontend in stack:
        frontend.__exit__(None, None, None)


@pytest.fixture
def url(frontends, engine):
    return frontends(engine).url + "/v1"


def sync_client(url):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def ask(url: str, kind: str, mode: str, stream: bool, **body):
    """The SDK's answer: a ChatCompletion/Completion, or the list of streamed chunks."""
    body.setdefault("temperature", 0)
    if kind == "chat":
        body.setdefault("messages", QUESTION)
    else:
        body.setdefault("prompt", PROMPT)

    def create(client):
        api = client.chat.completions if kind == "chat" else client.completions
        return api.create(model="router", stream=stream, **body)

    if mode == "sync":
        answer = create(sync_client(url))
        return list(answer) if stream else answer

    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        try:
            answer = await create(client)
            return [chunk async for chunk in answer] if stream else answer
        finally:
            await client.close()

    return asyncio.run(main())


def texts(answer, kind: str) -> dict:
    """index -> the choice's whole text, from an answer or from its chunks."""
    out: dict = {}
    if not isinstance(answer, list):
        for choice in answer.choices:
            out[choice.index] = choice.message.content if kind == "chat" else choice.text
        return out
    for chunk in answer:
        for choice in chunk.choices:
            piece = choice.delta.content if kind == "chat" else choice.text
            out[choice.index] = out.get(choice.index, "") + (piece or "")
    return out


def reasons(answer) -> dict:
    """index -> every finish reason the choice reported (one, in a conforming answer)."""
    out: dict = {}
    chunks = answer if isinstance(answer, list) else [answer]
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.finish_reason:
                out.setdefault(choice.index, []).append(choice.finish_reason)
    return out


def usage_of(answer):
    if not isinstance(answer, list):
        return answer.usage
    with_usage = [chunk for chunk in answer if chunk.usage is not None]
    assert len(with_usage) == 1 and with_usage[0].choices == [] and with_usage[0] is answer[-1]
    return with_usage[0].usage


KINDS = ("chat", "completion")


# -- the basics, every engine and kind (client modes: client_matrix.py) ---------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_an_answer_parses_and_ends_once(url, engine, kind, mode, stream):
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    answer = ask(url, kind, mode, stream, max_tokens=8, **extra)
    assert texts(answer, kind)[0].strip()
    assert list(reasons(answer)) == [0] and reasons(answer)[0][0] in ("stop", "length")
    usage = usage_of(answer)
    assert 0 < usage.completion_tokens <= 8 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if stream:
        first = answer[0].choices[0]
        assert kind != "chat" or first.delta.role == "assistant"
        assert all(c.id == answer[0].id for c in answer)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine, stream", engine_streams("sglang_server"))
def test_the_token_limit_ends_with_length(url, engine, kind, stream):
    limit = {"max_completion_tokens": 3} if kind == "chat" else {"max_tokens": 3}
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    answer = ask(url, kind, "sync", stream, **limit, **extra)
    assert reasons(answer) == {0: ["length"]}
    assert usage_of(answer).completion_tokens == 3


@pytest.mark.parametrize("stop", ["Paris", ["Zanzibar", "Paris"]], ids=["string", "list"])
@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_a_stop_string_ends_the_answer_before_it(url, engine, stop, mode, stream):
    whole = texts(ask(url, "completion", "sync", False, max_tokens=12), "completion")[0]
    assert "Paris" in whole  # both engines say it (SmolLM2 greedy; the double's REPLY)
    answer = ask(url, "completion", mode, stream, max_tokens=12, stop=stop)
    text = texts(answer, "completion")[0]
    assert "Paris" not in text and whole.startswith(text) and text
    assert reasons(answer) == {0: ["stop"]}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_n_choices_each_with_its_index_reason_and_usage(url, engine, kind, mode, stream):
    extra = {"stream_options": {"include_usage": True}} if stream else {}
    answer = ask(url, kind, mode, stream, n=3, max_tokens=4, temperature=1.0, seed=11, **extra)
    assert sorted(texts(answer, kind)) == [0, 1, 2]
    assert all(text for text in texts(answer, kind).values())
    assert {i: len(r) for i, r in reasons(answer).items()} == {0: 1, 1: 1, 2: 1}
    single = ask(url, kind, "sync", False, max_tokens=4, temperature=1.0, seed=11)
    usage = usage_of(answer)
    # the prompt counted once, as OpenAI bills it; every choice's tokens counted
    assert usage.prompt_tokens == single.usage.prompt_tokens
    assert 3 <= usage.completion_tokens <= 12
    if engine == "vllm":  # choice 0 samples with the request's own seed
        assert texts(answer, kind)[0] == texts(single, kind)[0]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", KINDS)
def test_usage_is_the_last_chunk_only_when_asked(url, engine, kind):
    plain = ask(url, kind, "sync", True, max_tokens=5)
    assert all(chunk.usage is None for chunk in plain)
    counted = ask(url, kind, "sync", True, max_tokens=5, stream_options={"include_usage": True})
    whole = ask(url, kind, "sync", False, max_tokens=5)
    assert usage_of(counted) == whole.usage
    assert texts(counted, kind) == texts(whole, kind) == texts(plain, kind)


@pytest.mark.parametrize("engine, stream", engine_streams("sglang_server"))
def test_user_is_accepted_and_changes_nothing(url, engine, stream):
    plain = ask(url, "chat", "sync", stream, max_tokens=6)
    tagged = ask(url, "chat", "sync", stream, max_tokens=6, user="user-1234")
    assert texts(tagged, "chat") == texts(plain, "chat")


@pytest.mark.parametrize("engine, stream", engine_streams("sglang_server"))
def test_echo_puts_the_prompt_before_the_answer_once(url, engine, stream):
    answer = ask(url, "completion", "sync", stream, max_tokens=4, echo=True)
    plain = ask(url, "completion", "sync", False, max_tokens=4)
    assert texts(answer, "completion")[0] == PROMPT + plain.choices[0].text


# -- sampling that needs a model's numbers (vLLM) ---------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("engine, mode, stream", real_modes())
def test_a_seed_makes_sampling_repeatable(url, engine, kind, mode, stream):
    options = {"max_tokens": 8, "temperature": 1.5, "top_p": 1.0}
    first = texts(ask(url, kind, mode, stream, seed=1234, **options), kind)
    again = texts(ask(url, kind, mode, stream, seed=1234, **options), kind)
    assert first == again
    others = {texts(ask(url, kind, "sync", False, seed=s, **options), kind)[0] for s in (1, 2)}
    assert len(others | {first[0]}) > 1  # the seed is what held it, not greed


@pytest.mark.parametrize("engine", VLLM_ONLY)
@pytest.mark.parametrize("bias", [-100, 100])
@pytest.mark.parametrize("stream", [True], ids=["stream"])
def test_logit_bias_bans_or_forces_a_token(url, engine, default_server, bias, stream):
    ids = sampled_ids(default_server, PROMPT, 4)
    plain = ask(url, "completion", "sync", False, max_tokens=4, logprobs=0)
    banned = ids[0] if bias < 0 else ids[1]  # force the second token to come first
    answer = ask(
        url, "completion", "sync", stream, max_tokens=4, logprobs=0, logit_bias={str(banned): bias}
    )
    tokens = [
        t
        for chunk in (answer if stream else [answer])
        for c in chunk.choices
        if c.logprobs
        for t in c.logprobs.tokens
    ]
    if bias < 0:
        assert tokens[0] != plain.choices[0].logprobs.tokens[0]
    else:
        assert tokens[0] == plain.choices[0].logprobs.tokens[1]


# -- logprobs ----------------------------------------------------------------------------


@pytest.mark.parametrize("top", [None, 1, 3])
@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_chat_logprobs_cover_every_token_in_openais_shape(url, engine, top, mode, stream):
    extra = {} if top is None else {"top_logprobs": top}
    answer = ask(url, "chat", mode, stream, max_tokens=6, logprobs=True, **extra)
    chunks = answer if stream else [answer]
    content = [
        t for chunk in chunks for c in chunk.choices if c.logprobs for t in c.logprobs.content
    ]
    assert "".join(t.token for t in content) == texts(answer, "chat")[0]
    if not stream:
        assert len(content) == answer.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0 and bytes(token.bytes) == token.token.encode()
        assert len(token.top_logprobs) == (top or 0)
        best = [t.logprob for t in token.top_logprobs]
        assert best == sorted(best, reverse=True)
        if top:  # greedy: the sampled token is the best one
            assert token.top_logprobs[0].token == token.token
            assert math.isclose(token.top_logprobs[0].logprob, token.logprob, abs_tol=1e-4)


@pytest.mark.parametrize("top", [0, 2, 5])
@pytest.mark.parametrize("engine, mode, stream", engine_modes("sglang_server"))
def test_completion_logprobs_are_parallel_lists(url, engine, top, mode, stream):
    answer = ask(url, "completion", mode, stream, max_tokens=6, logprobs=top)
    chunks = answer if stream else [answer]
    parts = [c.logprobs for chunk in chunks for c in chunk.choices if c.logprobs]
    tokens = [t for p in parts for t in p.tokens]
    offsets = [o for p in parts for o in p.text_offset]
    top_lists = [d for p in parts for d in p.top_logprobs]
    values = [v for p in parts for v in p.token_logprobs]
    text = texts(answer, "completion")[0]
    assert "".join(tokens) == text and len(tokens) == len(values) == len(top_lists)
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
    for token, value, best in zip(tokens, values, top_lists, strict=True):
        assert token in best and math.isclose(best[token], value, abs_tol=1e-4)
        assert max(top, 1) <= len(best) <= top + 1


@pytest.mark.parametrize("engine, stream", engine_streams("sglang_server"))
def test_n_with_logprobs_gives_each_choice_its_own(url, engine, stream):
    answer = ask(
        url,
        "chat",
        "sync",
        stream,
        n=2,
        max_tokens=4,
        logprobs=True,
        top_logprobs=1,
        temperature=1.0,
        seed=5,
    )
    chunks = answer if stream else [answer]
    by_index: dict = {}
    for chunk in chunks:
        for c in chunk.choices:
            if c.logprobs:
                by_index.setdefault(c.index, []).extend(t.token for t in c.logprobs.content)
    assert {i: "".join(t) for i, t in by_index.items()} == texts(answer, "chat")


# -- the raw wire: every chunk validates with the SDK's types ----------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "path, kind", [("chat/completions", "chat"), ("completions", "completion")]
)
@pytest.mark.parametrize(
    "extra", [{}, {"n": 2}, {"logprobs": True}], ids=["plain", "n2", "logprobs"]
)
def test_every_streamed_chunk_is_the_sdks_type(url, engine, path, kind, extra):
    body = {
        "model": "router",
        "max_tokens": 4,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        **extra,
    }
    if kind == "chat":
        body["messages"] = QUESTION
    else:
        body["prompt"] = PROMPT
        if extra.get("logprobs"):
            body["logprobs"] = 1
    with httpx.stream("POST", f"{url}/{path}", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    model = ChatCompletionChunk if kind == "chat" else Completion
    for line in lines[:-1]:
        raw = json.loads(line[len("data: ") :])
        assert "error" not in raw, raw
        if kind == "completion":
            # OpenAI's streamed completions say finish_reason null until the end, which
            # the SDK's Completion type (made for whole answers) does not allow; the
            # SDK reads chunks without validating. The rest of the chunk must fit.
            for choice in raw["choices"]:
                assert choice["finish_reason"] in (None, "stop", "length")
                choice["finish_reason"] = choice["finish_reason"] or "stop"
        model.model_validate(raw)
        assert raw["object"] == ("chat.completion.chunk" if kind == "chat" else "text_completion")
    whole = {**body, "stream": False}
    whole.pop("stream_options")
    answer = httpx.post(f"{url}/{path}", json=whole, timeout=120).json()
    (ChatCompletion if kind == "chat" else Completion).model_validate(answer)


# -- refusals: 400 naming the parameter ------------------------------------------------

REFUSED = [
    ("chat", {"n": 0}, "n"),
    ("chat", {"n": 17}, "n"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"user": 7}, "user"),
    ("chat", {"stop": 5}, "stop"),
    ("chat", {"logit_bias": {"x": 5}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"seed": "7"}, "seed"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("completion", {"logprobs": 6}, "logprobs"),
    ("completion", {"logprobs": 1, "echo": True}, "echo"),
    ("completion", {"suffix": " and so on"}, "suffix"),
    ("completion", {"best_of": 2}, "best_of"),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "kind, extra, param", REFUSED, ids=[f"{k}-{p}-{i}" for i, (k, _, p) in enumerate(REFUSED)]
)
def test_a_field_no_engine_can_do_is_400_naming_it(url, engine, kind, extra, param):
    body = {"messages": QUESTION} if kind == "chat" else {"prompt": PROMPT}
    client = sync_client(url)
    api = client.chat.completions if kind == "chat" else client.completions
    with pytest.raises(openai.BadRequestError) as caught:
        api.create(model="router", max_tokens=2, extra_body=extra, **body)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param
    assert param.split(".")[0] in caught.value.message


@pytest.mark.parametrize("engine", VLLM_ONLY)
def test_a_token_id_outside_the_vocabulary_is_the_clients_400(url, engine):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(url, "chat", "sync", False, max_tokens=2, logit_bias={"99999999": 5})
    assert "99999999" in caught.value.message or "logit_bias" in caught.value.message


# The double answers at no cost: a value of this schema (one token per word of its JSON,
# support/fake_sglang.py) makes a stream some 2,000 tokens long, still being generated
# when the model reads SGLang's load.
LONG_ANSWER = {
    "type": "json_schema",
    "json_schema": {
        "name": "zeros",
        "schema": {
            "type": "object",
            "properties": {
                "zeros": {"type": "array", "items": {"type": "integer"}, "minItems": 2000}
            },
            "required": ["zeros"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.uses_server("sglang_server")
def test_the_pods_load_follows_sglangs_own_gauges(frontends):
    """What an endpoint picker reads on the inference port (pod_metrics.py), scraped every
    50 ms, from SGLang's own gauges (the double's scheduler writes them where SGLang's
    does: trident_common/engine_gauges.py): six long streams against
    max_running_requests 4 (the router admits 8) make the pod's running requests rise
    to 1 or more with KV usage above 0 and never over 1, and its waiting requests rise
    too; after them running, waiting and KV usage are back at 0. The streams are sent
    again until the scrapes saw both."""
    frontend = frontends("sglang")
    client = sync_client(frontend.url + "/v1")
    stop = threading.Event()

    def streams() -> int:
        sent = 0
        while not stop.is_set():
            chunks = client.chat.completions.create(
                model="router",
                messages=QUESTION,
                max_tokens=2100,
                stream=True,
                response_format=LONG_ANSWER,  # type: ignore[arg-type]
            )
            assert [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
            sent += 1
        return sent

    seen: list[dict[str, float]] = []

    def loaded(workers) -> bool:
        for worker in workers:
            if worker.done():  # a stream failed: say why now, not at the timeout
                worker.result()
        seen.append(pod_gauges(frontend))
        running = any(g[RUNNING] >= 1 and g[KV_USAGE] > 0 for g in seen)
        return running and any(g[WAITING] >= 1 for g in seen)

    with ThreadPoolExecutor(6) as pool:
        workers = [pool.submit(streams) for _ in range(6)]
        try:
            wait_for(lambda: loaded(workers), timeout_s=90, interval_s=0.05)
        finally:
            stop.set()
        assert all(worker.result() >= 1 for worker in workers)
    assert all(0 <= g[KV_USAGE] <= 1 and g[RUNNING] <= 4 for g in seen), seen[-3:]
    idle = {WAITING: 0, RUNNING: 0, KV_USAGE: 0}
    wait_for(lambda: pod_gauges(frontend) == idle, timeout_s=10, interval_s=0.05)
