"""A test double of `sglang.Engine` (sglang 0.5.23), for the machines SGLang cannot run on.

Same surface as the parts trident uses, with the real signatures and behaviour:
- `Engine(**server_args)`: keyword names are checked against ServerArgs field names
  (a subset of sglang 0.5.23's, copied from its arg_groups/fields), `model_path` required;
- `await engine.async_generate(prompt=..., sampling_params=..., stream=True, rid=...)`
  returns an async iterator of dicts `{"text", "output_ids", "meta_info"}`; the text is
  cumulative unless the engine runs with `incremental_streaming_output`, as in
  TokenizerManager; meta_info carries prompt_tokens, completion_tokens, cached_tokens
  and finish_reason (None, or {"type": "stop"|"length"|"abort", ...});
- request validation happens when the stream is first awaited: unknown sampling keys
  raise TypeError (msgspec), bad values and prompts over context_length raise ValueError;
- `engine.tokenizer_manager.abort_request(rid=...)` (synchronous), `.tokenizer`
  (apply_chat_template, decode), `engine.server_args`, `engine.shutdown()`;
- `max_running_requests` queues the requests beyond it, and with `enable_metrics` the
  scheduler's load gauges are written where SGLang's scheduler writes them (Scheduler);
- with `return_logprob=True`, meta_info carries `output_token_logprobs` and, with
  `top_logprobs_num=k`, `output_top_logprobs` ((logprob, token id, None) triples, from
  the first token in every chunk unless incremental_streaming_output); the sampled word
  is always the best one, as greedy decoding makes it.

The "model" is deterministic: a token is a whitespace-separated word; the reply is
REPLY's words, cut at max_new_tokens (finish "length") or at a stop string (finish
"stop"); with `json_schema`, a value of the schema instead (support/schema_instance.py),
as constrained decoding would hold a model to. A radix cache remembers finished
sequences (prompt + reply tokens) and reports the longest shared token prefix of a new
prompt as cached_tokens (PrefixTree).

Scripting for tests: `fail_before_first`, `fail_after_chunks`, `abort_with_status`,
`hold_after` (+ `release()`), `tokens_per_chunk`; `compile_s`, the seconds a request with
a constraint (json_schema other than any object, regex, ebnf, structural_tag) waits for
its grammar before its first chunk, as SGLang's scheduler holds it in its grammar queue,
and `grammar_timeout_s`, after which SGLang gives up on that compile and aborts the
request with status 400 in its own words (grammar_manager.py, SGLANG_GRAMMAR_MAX_POLL_
ITERATIONS: the schema quoted whole). Records: `calls`, `aborts`,
`shut_down`. Pacing for benchmarks: with PACE (a support.pacing.RateSource) set before the
engine is made, tokens come at that rate, as from a GPU (TTFT, tokens/s per stream, a
batch-wide limit), and a chunk holds every token made since the last one.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass, field

from support import schema_instance
from support.pacing import PacedBatch

REPLY = (
    "The capital of France is Paris . It is known for the Eiffel Tower , the Louvre and its cafes ."
)
PACE = None  # a support.pacing.RateSource: paced tokens (benchmarks); None: at no cost
# The KV pool's size in tokens without the engine argument max_total_tokens (SGLang sizes
# it from the GPU's free memory; the double has none).
DEFAULT_MAX_TOTAL_TOKENS = 16384
# SGLang's scheduler publishes its gauges every decode_log_interval decode steps (40 by
# default); the double, every this many chunks of any request.
DECODE_LOG_INTERVAL = 40
# The scheduler's gauges trident reads, as sglang 0.5.23's SchedulerMetricsCollector
# names and documents them (observability/metrics_collector.py).
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
GAUGE_HELP = {
    RUNNING: "The number of running requests.",
    QUEUED: "The number of requests in the waiting queue.",
    TOKEN_USAGE: "The token usage.",
}

# sglang 0.5.23 ServerArgs fields (python/sglang/srt/arg_groups/fields/*.py) that
# trident may pass; a name outside this set is a TypeError, as in ServerArgs(**kwargs).
SERVER_ARGS = {
    "model_path",
    "tokenizer_path",
    "tp_size",
    "pp_size",
    "dp_size",
    "mem_fraction_static",
    "context_length",
    "chunked_prefill_size",
    "schedule_policy",
    "quantization",
    "dtype",
    "kv_cache_dtype",
    "max_running_requests",
    "max_total_tokens",
    "max_prefill_tokens",
    "disable_radix_cache",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "random_seed",
    "trust_remote_code",
    "attention_backend",
    "enable_metrics",
    "log_level",
    "incremental_streaming_output",
    "enable_cache_report",
    "skip_tokenizer_init",
    "chat_template",
    "served_model_name",
    "stream_interval",
    "device",
    "base_gpu_id",
    "enable_lora",
    "lora_paths",
    "max_loras_per_batch",
    "max_lora_rank",
    "tool_call_parser",
}

# sglang 0.5.23 SamplingParams API fields (python/sglang/srt/sampling/sampling_params.py).
SAMPLING_FIELDS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "beam_width",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "watermark",
}


@dataclass
class ServerArgs:
    model_path: str
    context_length: int | None = None
    disable_radix_cache: bool = False
    incremental_streaming_output: bool = False
    skip_tokenizer_init: bool = False
    tool_call_parser: str | None = None
    extra: dict = field(default_factory=dict)


# A word's token id (the double's vocabulary grows as words are first seen).
VOCAB: dict[str, int] = {}


def token_id(word: str) -> int:
    return VOCAB.setdefault(word, len(VOCAB) + 1)


class FakeTokenizer:
    """apply_chat_template as a ChatML-style template (what Qwen2.5 renders); decode
    as the double writes its text (a space before each word)."""

    def decode(self, ids, **kwargs) -> str:
        words = {i: w for w, i in VOCAB.items()}
        return "".join(" " + words[i] for i in ids)

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False, **kwargs):
        assert tokenize is False, "trident renders the prompt as text"
        parts = [f"<|im_start|> {m['role']} {m['content']} <|im_end|>" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|> assistant")
        return " ".join(parts)


class FakeTokenizerManager:
    def __init__(self, engine: Engine, skip_tokenizer_init: bool):
        self._engine = engine
        self.tokenizer = None if skip_tokenizer_init else FakeTokenizer()
        self.rid_to_state: dict[str, dict] = {}

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._engine.aborts.append(rid)
        state = self.rid_to_state.get(rid)
        if state is not None:
            state["aborted"] = True
            if state.get("paced") is not None:
                self._engine._batch.abort(state["paced"])


class Scheduler:
    """The double's scheduler: its live requests and, with `enable_metrics` and
    PROMETHEUS_MULTIPROC_DIR set (SGLang's Engine hands that folder to its scheduler
    processes), its gauges as SGLang's scheduler writes them: a prometheus_client
    multiprocess file of "mostrecent" gauges (gauge_mostrecent_<pid>.db) under SGLang's
    names and labels. Published when a request is queued, starts and ends, and every
    DECODE_LOG_INTERVAL chunks (SGLang: at each prefill batch, every decode_log_interval
    decode steps, and when it goes idle). With max_running_requests, the requests beyond
    it wait in the queue and generate nothing meanwhile. Token usage: the prompt and
    generated tokens of the running requests over max_total_tokens."""

    def __init__(self, args: ServerArgs):
        limit = args.extra.get("max_running_requests")
        self._slots = asyncio.Semaphore(limit) if limit else None
        self._total = args.extra.get("max_total_tokens") or DEFAULT_MAX_TOTAL_TOKENS
        self._live: dict[int, dict] = {}  # id(state) -> state
        self._chunks = 0
        self._file, self._keys = None, {}
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if args.extra.get("enable_metrics") and folder:
            from prometheus_client.mmap_dict import MmapedDict, mmap_key

            labels = {"model_name": args.model_path, "engine_type": "unified"}
            labels |= {"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
            path = os.path.join(folder, f"gauge_mostrecent_{os.getpid()}.db")
            self._file = MmapedDict(path)
            self._keys = {
                name: mmap_key(name, name, list(labels), list(labels.values()), doc)
                for name, doc in GAUGE_HELP.items()
            }
            self._publish()

    async def admit(self, state: dict) -> None:
        """Queue the request; return when it runs."""
        state["running"] = False
        self._live[id(state)] = state
        self._publish()
        if self._slots is not None:
            await self._slots.acquire()
        state["running"] = True
        self._publish()

    def chunk(self) -> None:
        self._chunks += 1
        if self._chunks % DECODE_LOG_INTERVAL == 0:
            self._publish()

    def leave(self, state: dict) -> None:
        if self._live.pop(id(state), None) is not None and state["running"]:
            if self._slots is not None:
                self._slots.release()
        self._publish()

    def _publish(self) -> None:
        if self._file is None:
            return
        running = [state for state in self._live.values() if state["running"]]
        used = sum(state["tokens"] for state in running)
        values = {
            RUNNING: len(running),
            QUEUED: len(self._live) - len(running),
            TOKEN_USAGE: round(used / self._total, 2),  # rounded as SGLang's pool stats
        }
        now = time.time()
        for name, value in values.items():
            self._file.write_value(self._keys[name], value, now)


class PrefixTree:
    """The finished sequences as a token trie: a prompt's longest shared prefix is found
    in the prompt's length, as SGLang's radix tree finds it, however many requests came
    before. (A list scanned whole made the zero-cost engine slower with every request: a
    benchmark's thousandth request paid milliseconds for it.) At most `capacity` tokens
    are kept; a sequence that would pass it drops the tree first, where SGLang would
    evict its least recently used leaves: the double needs only to stay bounded."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.root: dict[str, dict] = {}
        self.size = 0  # tokens (nodes) held

    def shared(self, tokens: list[str]) -> int:
        """How many of `tokens`, from the first, some held sequence begins with."""
        node, count = self.root, 0
        for token in tokens:
            child = node.get(token)
            if child is None:
                break
            node, count = child, count + 1
        return count

    def insert(self, tokens: list[str]) -> None:
        if self.size + len(tokens) - self.shared(tokens) > self.capacity:
            self.root, self.size = {}, 0
        node = self.root
        for token in tokens:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                self.size += 1
            node = child


class Engine:
    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - SERVER_ARGS)
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword argument(s) {unknown}")
        if "model_path" not in kwargs:
            raise TypeError("ServerArgs.__init__() missing required argument: 'model_path'")
        known = {k: kwargs.pop(k) for k in list(kwargs) if k in ServerArgs.__dataclass_fields__}
        self.server_args = ServerArgs(**known, extra=kwargs)
        self.tokenizer_manager = FakeTokenizerManager(self, self.server_args.skip_tokenizer_init)
        # scripting
        self.fail_before_first: BaseException | None = None
        self.fail_after_chunks: int | None = None
        self.abort_with_status: tuple[int, str] | None = None
        self.hold_after: int | None = None
        self.tokens_per_chunk = 1
        self.compile_s = 0.0
        self.grammar_timeout_s: float | None = None
        self._released = threading.Event()
        # records
        self.calls: list[dict] = []
        self.aborts: list[str] = []
        self.shut_down = False
        self._radix = PrefixTree(
            self.server_args.extra.get("max_total_tokens") or DEFAULT_MAX_TOTAL_TOKENS
        )
        self._pace, self._batch = PACE, None
        self.scheduler = Scheduler(self.server_args)

    # -- sglang.Engine ------------------------------------------------------------------
    async def async_generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        image_data=None,
        audio_data=None,
        video_data=None,
        mm_hashes=None,
        mm_content_hashes=None,
        return_logprob=False,
        logprob_start_len=None,
        top_logprobs_num=None,
        token_ids_logprob=None,
        lora_path=None,
        custom_logit_processor=None,
        require_reasoning=False,
        return_hidden_states=False,
        return_routed_experts=False,
        routed_experts_start_len=0,
        stream=False,
        bootstrap_host=None,
        bootstrap_port=None,
        bootstrap_room=None,
        routed_dp_rank=None,
        disagg_prefill_dp_rank=None,
        kv_hints=None,
        data_parallel_rank=None,
        external_trace_header=None,
        rid=None,
        session_params=None,
        priority=None,
        session_id=None,
        *,
        cache_salt=None,
    ):
        self.calls.append(
            {
                "prompt": prompt,
                "sampling_params": dict(sampling_params or {}),
                "stream": stream,
                "rid": rid,
                "lora_path": lora_path,
            }
        )
        loaded = self.server_args.extra.get("lora_paths") or {}
        if lora_path is not None and lora_path not in loaded:
            # SGLang refuses a name its lora_paths did not load.
            raise ValueError(f"LoRA adapter {lora_path!r} is not loaded")
        top = (top_logprobs_num or 0) if return_logprob else None
        chunks = self._generate(prompt, dict(sampling_params or {}), rid, stream, top)
        if stream is True:
            return chunks
        return await chunks.__anext__()

    def shutdown(self) -> None:
        self.shut_down = True

    # -- for tests ----------------------------------------------------------------------
    def release(self) -> None:
        """Let streams held at `hold_after` chunks continue."""
        self._released.set()

    # -- the "model" --------------------------------------------------------------------
    async def _generate(
        self, prompt: str, params: dict, rid: str, stream: bool, top: int | None = None
    ):
        prompt_tokens = self._validate(prompt, params)
        cached = self._cached_prefix(prompt_tokens)
        state = self.tokenizer_manager.rid_to_state[rid] = {"aborted": False}
        state["tokens"] = len(prompt_tokens)  # its KV: prompt and generated tokens
        reply, finish = self._reply(params)
        paced = self._paced(len(reply))
        state["paced"] = paced
        try:
            await self.scheduler.admit(state)
            if self.fail_before_first is not None:
                raise self.fail_before_first
            key = _grammar_key(params)
            if key is not None and self.compile_s:
                timed_out = await self._compile(state)
                if timed_out:
                    reason = {
                        "type": "abort",
                        "message": f"Grammar preprocessing timed out: req.grammar_key={key!r}",
                        "status_code": 400,
                    }
                    meta = {"id": rid, "finish_reason": reason, "prompt_tokens": 0}
                    yield {"text": "", "output_ids": [], "meta_info": meta}
                    return
            emitted: list[str] = []
            text = sent_text = ""  # the reply so far, grown by each step (not rejoined)
            chunks = 0
            while True:
                if self.hold_after is not None and chunks == self.hold_after:
                    while not self._released.is_set():
                        await asyncio.sleep(0.002)
                if self.fail_after_chunks is not None and chunks == self.fail_after_chunks:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                size = self.tokens_per_chunk if paced is None else await paced.take()
                step = reply[len(emitted) : len(emitted) + size]
                emitted += step
                text += "".join(" " + t for t in step)
                state["tokens"] = len(prompt_tokens) + len(emitted)
                self.scheduler.chunk()
                done = len(emitted) == len(reply)
                reason = finish if done else None
                if state["aborted"]:
                    reason = {"type": "abort", "message": "Aborted", "status_code": None}
                elif done and self.abort_with_status is not None:
                    status, message = self.abort_with_status
                    reason = {"type": "abort", "message": message, "status_code": status}
                meta = {
                    "id": rid,
                    "finish_reason": reason,
                    "prompt_tokens": len(prompt_tokens),
                    "completion_tokens": len(emitted),
                    "cached_tokens": cached,
                }
                if top is not None:
                    incremental = stream and self.server_args.incremental_streaming_output
                    meta.update(_logprobs(emitted, top, sent_text.count(" ") if incremental else 0))
                chunks += 1
                if reason is not None:
                    self._radix.insert(prompt_tokens + emitted)
                if stream or reason is not None:
                    incremental = stream and self.server_args.incremental_streaming_output
                    yield {
                        "text": text[len(sent_text) :] if incremental else text,
                        "output_ids": list(range(len(emitted))),
                        "meta_info": meta,
                    }
                    sent_text = text
                if reason is not None:
                    return
                await asyncio.sleep(0)
        finally:
            self.scheduler.leave(state)
            self.tokenizer_manager.rid_to_state.pop(rid, None)
            if paced is not None and not paced.done:
                self._batch.abort(paced)

    async def _compile(self, state: dict) -> bool:
        """Wait out the scripted compile; True when SGLang's own timeout ends it first.
        An abort meanwhile lets the request go on to its abort chunk."""
        loop = asyncio.get_running_loop()
        done = loop.time() + self.compile_s
        limit = None if self.grammar_timeout_s is None else loop.time() + self.grammar_timeout_s
        while loop.time() < done and not state["aborted"]:
            if limit is not None and loop.time() >= limit:
                return True
            await asyncio.sleep(0.005)
        return False

    def _paced(self, tokens: int):
        """This request's paced tokens (None: unpaced). The step clock is made on first
        use, on the loop that serves the requests."""
        if self._pace is None:
            return None
        if self._batch is None:
            self._batch = PacedBatch(self._pace)
        return self._batch.add(tokens)

    def _validate(self, prompt, params: dict) -> list[str]:
        unknown = sorted(set(params) - SAMPLING_FIELDS)
        if unknown:
            raise TypeError(
                f"SamplingParams.__init__() got unexpected keyword argument {unknown[0]!r}"
            )
        if params.get("temperature", 1.0) < 0:
            raise ValueError(f"temperature must be non-negative, got {params['temperature']}.")
        if not 0 < params.get("top_p", 1.0) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {params['top_p']}.")
        if not isinstance(prompt, str):
            raise ValueError("Either text or input_ids should be provided.")
        tokens = prompt.split()
        limit = self.server_args.context_length
        if limit is not None and len(tokens) >= limit:
            raise ValueError(
                f"The input ({len(tokens)} tokens) is longer than the model's "
                f"context length ({limit} tokens)."
            )
        return tokens

    def _reply(self, params: dict) -> tuple[list[str], dict]:
        words = REPLY.split()
        if params.get("json_schema"):
            # Constrained decoding: a value of the schema (support/schema_instance.py),
            # one JSON token per word.
            value = schema_instance.instance(json.loads(params["json_schema"]))
            words = json.dumps(value).split(" ")
        for stop in _as_list(params.get("stop")):
            if stop in words:
                return words[: words.index(stop)], {"type": "stop", "matched": stop}
        limit = params.get("max_new_tokens", 128)
        if limit < len(words):
            return words[:limit], {"type": "length", "length": limit}
        return words, {"type": "stop", "matched": 151645}

    def _cached_prefix(self, tokens: list[str]) -> int:
        if self.server_args.disable_radix_cache:
            return 0
        best = self._radix.shared(tokens)
        # Like SGLang, the last prompt token is always computed (its logits are needed).
        return min(best, max(len(tokens) - 1, 0))


def _logprobs(emitted: list[str], top: int, start: int) -> dict:
    """meta_info's logprob lists for emitted[start:]: the sampled word best, then other
    words of the reply, each a nat less likely than the one before."""
    words = list(dict.fromkeys(REPLY.split()))
    sampled, tops = [], []
    for i in range(start, len(emitted)):
        word, logprob = emitted[i], -0.25 * (1 + i % 3)
        sampled.append((logprob, token_id(word), None))
        others = [w for w in words if w != word][: max(top - 1, 0)]
        tops.append(
            [(logprob, token_id(word), None)][:top]
            + [(logprob - 1 - j, token_id(w), None) for j, w in enumerate(others)]
        )
    return {"output_token_logprobs": sampled, "output_top_logprobs": tops}


def _grammar_key(params: dict) -> tuple[str, str] | None:
    """The constraint SGLang compiles for these sampling params (its grammar_key), or
    None; any JSON object is SGLang's built-in grammar, nothing to compile."""
    schema = params.get("json_schema")
    if schema is not None and json.loads(schema) != {"type": "object"}:
        return ("json", schema)
    for kind in ("regex", "ebnf", "structural_tag"):
        if params.get(kind) is not None:
            return (kind, params[kind])
    return None


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)
