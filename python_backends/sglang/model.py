"""trident's SGLang model: sglang.Engine inside a decoupled Triton Python-backend stub.

Engine arguments come from model.json (rendered from the spec's engine_args, with
`model_path` filled in). The tensor interface, cancellation, errors and metrics are shared
with the vLLM model (trident_common.engine_model); this file only speaks SGLang:
sampling names, its stream chunks (dicts with `text` and `meta_info`), abort by `rid`,
the prefix (radix) cache's cached-token counts as a metric, and where SGLang writes its
own load gauges (trident_common/engine_gauges.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from trident_common import engine_gauges
from trident_common.deltas import Delta
from trident_common.engine_model import AsyncEngineModel
from trident_common.request import BadRequest, GenerateRequest, check_adapter, check_sampling_keys
from trident_common.sglang_logprobs import Positions, request_args
from trident_common.structured import (
    RESPONSE_FORMAT,
    check_json_schema,
    compiler_words,
    needs_compile,
    to_sglang,
    with_tools,
)
from trident_common.tool_calls import Extract, call, collect, forced_calls

# trident's sampling names (vLLM's, as clients of vllm_backend send them) → SGLang's
# SamplingParams names. Anything else is rejected, so a typo never silently samples
# with defaults. max_tokens arrives separately and becomes max_new_tokens.
SAMPLING_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",  # -1 means the whole vocabulary in both
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "seed": "sampling_seed",
    "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "include_stop_str_in_output": "no_stop_trim",
    "logit_bias": "logit_bias",
    # SGLang's structured output, under SGLang's own names.
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "structural_tag": "structural_tag",
}
# Not a SamplingParams field: map_sampling keeps it, and _deltas takes it out for
# async_generate's return_logprob / top_logprobs_num (trident_common/sglang_logprobs.py).
LOGPROBS = "logprobs"

# HTTP-like status codes SGLang puts on an abort it decided itself (input too long,
# out of memory, ...); an abort we asked for carries none.
_CLIENT_ERROR = range(400, 500)

# SGLang's words (sglang 0.5.23, constrained/grammar_manager.py) for a constraint its
# scheduler could not compile, or gave up compiling (SGLANG_GRAMMAR_MAX_POLL_ITERATIONS):
# aborts with status 400, whose message holds the whole schema (grammar_key).
_GRAMMAR_TIMED_OUT = "Grammar preprocessing timed out"
_GRAMMAR_FAILED = re.compile(r"Failed to compile (\w+) grammar: (.*)", re.S)


class Sampling(NamedTuple):
    """What make_sampling hands stream."""

    params: dict[str, Any]  # SGLang's sampling_params
    lora: str | None  # the LoRA adapter's name (None: the base model)
    tools: Extract | None  # how tool calls are read out of the answer (None: no tools)
    constraint: str = ""  # the parameter tag of its constraint ("" for none)
    bounded: bool = False  # its constraint needs compiling (compile_bound.py)


def map_sampling(params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """trident's sampling parameters → SGLang's sampling_params dict; raises BadRequest."""
    params = dict(params)
    structured = params.pop("structured_outputs", None)  # vLLM's name, trident's interface
    if structured is not None:
        params.update(to_sglang(structured))
    logprobs = params.pop(LOGPROBS, None)
    check_sampling_keys(params, SAMPLING_NAMES, "sglang")
    mapped = {SAMPLING_NAMES[key]: value for key, value in params.items()}
    if logprobs is not None:
        mapped[LOGPROBS] = logprobs
    if isinstance(mapped.get("json_schema"), dict):  # SGLang takes the schema as text
        mapped["json_schema"] = json.dumps(mapped["json_schema"])
    mapped["max_new_tokens"] = max_tokens
    return mapped


class TextDeltas:
    """New text per stream chunk. SGLang streams the whole text so far unless the engine
    runs with incremental_streaming_output, when each chunk holds only the new piece."""

    def __init__(self, incremental: bool) -> None:
        self.incremental = incremental
        self._sent = 0

    def next(self, text: str | None) -> str:
        text = text or ""
        if self.incremental:
            return text
        delta = text[self._sent :]
        self._sent = max(self._sent, len(text))
        return delta


def finish_reason(meta_info: dict[str, Any]) -> str | None:
    """'stop' / 'length' / 'abort', or None while generating. An abort SGLang made on its
    own with an error status becomes an exception: BadRequest for a client error (the
    request can never succeed), RuntimeError for an engine failure."""
    reason = meta_info.get("finish_reason")
    if reason is None:
        return None
    if not isinstance(reason, dict):
        return str(reason)
    status = reason.get("status_code")
    if reason.get("type") == "abort" and status is not None:
        message = reason.get("message") or "aborted by the engine"
        if status in _CLIENT_ERROR:
            raise BadRequest(message)
        raise RuntimeError(f"{message} (status {status})")
    return reason.get("type") or "stop"


def delta_from_chunk(chunk: dict[str, Any], texts: TextDeltas) -> Delta:
    meta = chunk.get("meta_info") or {}
    return Delta(
        text=texts.next(chunk.get("text")),
        finish_reason=finish_reason(meta),
        input_tokens=int(meta.get("prompt_tokens") or 0),
        output_tokens=int(meta.get("completion_tokens") or 0),
    )


class TritonPythonModel(AsyncEngineModel):
    engine_name = "sglang"

    async def start_engine(self, config: dict[str, Any]) -> None:
        import sglang

        # SGLang's own load gauges, written by its scheduler into this instance's folder
        # for the pod's load (trident_common/engine_gauges.py), unless the spec turned
        # SGLang's metrics off. Set before the engine spawns its scheduler, which reads it.
        folder = engine_gauges.prepare(os.environ, self.model_name, self.instance_name)
        if folder is not None and engine_gauges.sglang_reports_load(config):
            config[engine_gauges.SGLANG_METRICS_ARG] = True
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
        # Built on the model's event loop (this coroutine runs there), so the engine's
        # tokenizer manager serves its requests on the same loop.
        self.engine = sglang.Engine(**config)
        self.loras: set[str] = set(config.get("lora_paths") or ())  # adapter names (spec order)
        self._incremental = bool(
            getattr(self.engine.server_args, "incremental_streaming_output", False)
        )
        # SGLang's own tool parser name (a ServerArgs field, from the spec's engine_args).
        self._tool_parser = getattr(self.engine.server_args, "tool_call_parser", None)
        # xgrammar's import takes seconds: at load, not in a client's first request.
        check_json_schema('{"type": "object"}', "")

    def make_sampling(self, request: GenerateRequest) -> Sampling:
        # SGLang names the adapter per request in lora_path (its name in lora_paths).
        lora = check_adapter(request.lora_name, self.loras, self.model_name)
        values, tag = with_tools(request.sampling, request.tool_plan)
        params = map_sampling(values, request.max_tokens)
        tag = tag or RESPONSE_FORMAT  # SGLang's own json_schema etc. too
        if params.get("json_schema"):
            check_json_schema(params["json_schema"], tag)
        bounded = needs_compile(params)
        constrained = bounded or bool(params.get("json_schema"))
        return Sampling(params, lora, self._extractor(request), tag if constrained else "", bounded)

    def _extractor(self, request: GenerateRequest) -> Extract | None:
        """How the calls are read out of this request's answer (None: no tools): the
        JSON a forced choice constrained, or SGLang's FunctionCallParser for auto."""
        plan = request.tool_plan
        if plan is None:
            return None
        if plan.forced:

            def forced(text: str) -> tuple[str | None, list[dict[str, Any]]]:
                calls = forced_calls(plan, text)
                return (None, calls) if calls else (text, [])

            return forced
        if not self._tool_parser:
            raise BadRequest(
                f"[tool_choice] model {self.model_name} has no tool parser "
                "(engine_args.tool_call_parser in the spec): tool_choice auto "
                "cannot be read; required or a named function can"
            )
        from sglang.srt.entrypoints.openai.protocol import Tool
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        parser = FunctionCallParser([Tool(**tool) for tool in plan.tools], self._tool_parser)

        def auto(text: str) -> tuple[str | None, list[dict[str, Any]]]:
            if not parser.has_tool_call(text):
                return text, []
            content, items = parser.parse_non_stream(text)
            return content, [call(item.name, item.parameters) for item in items]

        return auto

    async def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        tokenizer = self.engine.tokenizer_manager.tokenizer
        if tokenizer is None:
            raise BadRequest(
                "this model has no tokenizer (skip_tokenizer_init): "
                "send text_input instead of messages"
            )
        try:
            prompt: str = tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
            return prompt
        except Exception as e:
            raise BadRequest(f"cannot apply the chat template: {e}") from None

    def stream(self, prompt: str, sampling: Sampling, engine_id: str) -> AsyncIterator[Delta]:
        deltas = self._deltas(prompt, sampling, engine_id)
        return deltas if sampling.tools is None else collect(deltas, sampling.tools)

    async def _deltas(
        self, prompt: str, sampling: Sampling, engine_id: str
    ) -> AsyncIterator[Delta]:
        params, lora = dict(sampling.params), sampling.lora
        logprobs = request_args(params.pop(LOGPROBS, None))
        positions = Positions(self._incremental, self._decode)
        chunks = await self.engine.async_generate(
            prompt=prompt,
            sampling_params=params,
            stream=True,
            rid=engine_id,
            lora_path=lora,
            **logprobs,
        )
        texts = TextDeltas(self._incremental)
        cached, counted = 0, False
        try:
            # SGLang compiles a constraint before it schedules the request: the first
            # chunk waits for the compile, bounded from here (compile_bound.py).
            chunk = await self.first_outputs.first(
                engine_id, _first_chunk(chunks), sampling.constraint if sampling.bounded else ""
            )
            while chunk is not None:
                cached = int((chunk.get("meta_info") or {}).get("cached_tokens") or cached)
                delta = _delta(chunk, texts, sampling.constraint)
                if logprobs:
                    delta.logprobs = positions.next(chunk.get("meta_info") or {})
                if delta.finish_reason:
                    self._count_cached(cached)
                    counted = True
                yield delta
                chunk = await anext(chunks, None)
        finally:
            if not counted:  # aborted or failed: the cache hit still happened
                self._count_cached(cached)
            await chunks.aclose()

    def _decode(self, token_id: int) -> str:
        """A token's text, for logprobs SGLang gives without it."""
        tokenizer = self.engine.tokenizer_manager.tokenizer
        return "" if tokenizer is None else tokenizer.decode([token_id])

    def _count_cached(self, tokens: int) -> None:
        if tokens > 0:
            self.metrics.prefix_cached_tokens.increment(tokens)

    async def abort(self, engine_id: str) -> None:
        # TokenizerManager.abort_request is synchronous; it ignores ids it no longer
        # knows, so aborting a request that just finished is harmless.
        self.engine.tokenizer_manager.abort_request(rid=engine_id)

    async def stop_engine(self) -> None:
        engine = getattr(self, "engine", None)  # None when the engine failed to start
        if engine is not None:
            engine.shutdown()


def _delta(chunk: dict[str, Any], texts: TextDeltas, constraint: str) -> Delta:
    """delta_from_chunk; SGLang's refusal of a constraint names the parameter it came
    from (`constraint`, its tag), in words without the schema SGLang quotes."""
    try:
        return delta_from_chunk(chunk, texts)
    except BadRequest as e:
        refusal = grammar_refusal(str(e), constraint) if constraint else None
        if refusal is None:
            raise
        raise BadRequest(refusal) from None


def grammar_refusal(message: str, tag: str) -> str | None:
    """trident's words for SGLang's abort of a constraint (None: not one of those)."""
    if message.startswith(_GRAMMAR_TIMED_OUT):
        return (
            f"{tag}SGLang gave up compiling the constraint into a grammar (it took too "
            "long): a simpler schema compiles in well under a second"
        )
    failed = _GRAMMAR_FAILED.match(message)
    if failed:
        return f"{tag}the {failed[1]} constraint cannot be compiled: {compiler_words(failed[2])}"
    return None


async def _first_chunk(chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
    """The stream's first chunk; SGLang validates the request (prompt length, sampling
    values) when it is first awaited and raises ValueError for a bad one."""
    try:
        return await chunks.__anext__()
    except ValueError as e:
        raise BadRequest(str(e)) from None
    except StopAsyncIteration:
        return None
