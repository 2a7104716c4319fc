"""AsyncLLM, answering at a configured pace (support/pacing.py): every request gets
max_tokens tokens (as with ignore_eos), a token is the word " w<i>", the prompt's tokens
are its words. Outputs are DELTA or CUMULATIVE as the SamplingParams ask; tokens that came
while the reader was busy arrive merged in one output, as vLLM's output collector does.
The stat loggers get vLLM's scheduler and iteration stats once per step."""

import sys
import time

from support.pacing import PacedBatch, Rate, RateSource, StepStats
from vllm.config import VllmConfig
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats


class WordTokenizer:
    """The chat template of a ChatML model, words as tokens."""

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False, **kwargs):
        text = " ".join(f"<|im_start|> {m['role']} {m['content']} <|im_end|>" for m in messages)
        if add_generation_prompt:
            text += " <|im_start|> assistant"
        return self.encode(text) if tokenize else text

    def encode(self, text: str, **kwargs) -> list:
        return list(range(len(text.split())))


class ModelConfig:
    """What trident's vLLM model reads of vLLM's: the vocabulary (SmolLM2's size)."""

    def get_vocab_size(self) -> int:
        return 49152


class AsyncLLM:
    def __init__(self, config, stat_loggers=None):
        """config: AsyncEngineArgs (trident's model) or the VllmConfig made from them
        (vllm_backend's); both carry the double's rate settings."""
        if not isinstance(config, VllmConfig):
            config = config.create_engine_config()
        # Into the server's log: the test suite's ledger counts this load as the double's,
        # not as a real vLLM engine's (tests/helpers/ledger.py, DOUBLE_MARK).
        print("[vllm double] the paced AsyncLLM double stands in for vLLM", file=sys.stderr)
        self.errored, self.dead_error = False, None
        self._source = RateSource(Rate.from_dict(config.rate), config.rate_control)
        self._loggers = [factory(config, 0) for factory in stat_loggers or ()]
        for logger in self._loggers:
            logger.log_engine_initialized()
        self._batch: PacedBatch | None = None
        self._streams: dict = {}
        self._tokenizer = WordTokenizer()
        self._stream_interval = config.stream_interval
        self.model_config = ModelConfig()

    @classmethod
    def from_engine_args(cls, engine_args, stat_loggers=None, **kwargs):
        return cls(engine_args, stat_loggers)

    @classmethod
    def from_vllm_config(cls, vllm_config, usage_context=None, stat_loggers=None, **kwargs):
        return cls(vllm_config, stat_loggers)

    def get_tokenizer(self):
        return self._tokenizer

    async def get_supported_tasks(self):
        return ("generate",)

    async def check_health(self):
        return None

    async def reset_mm_cache(self):
        return None

    def _paced(self) -> PacedBatch:
        """Made on first use, on the loop that serves the requests (the model's)."""
        if self._batch is None:
            self._batch = PacedBatch(self._source, on_step=self._record)
        return self._batch

    async def generate(
        self, prompt, sampling_params, request_id, priority=0, lora_request=None, **kwargs
    ):
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            prompt = " ".join(f"t{i}" for i in prompt["prompt_token_ids"])
        text = prompt.get("prompt", "") if isinstance(prompt, dict) else prompt
        prompt_ids = self._tokenizer.encode(text or "")
        if request_id in self._streams:
            raise ValueError(f"Request id {request_id} already running.")
        batch = self._paced()
        stream = batch.add(sampling_params.max_tokens or 16)
        self._streams[request_id] = stream
        delta = sampling_params.output_kind == RequestOutputKind.DELTA
        made = sent = 0  # tokens generated; tokens in the outputs yielded
        try:
            while made < stream.limit:
                new = await stream.take()
                if new == 0:
                    return  # aborted
                made += new
                finished = made >= stream.limit
                # As vLLM's output processor with a stream interval: the first token at
                # once, then an output per `stream_interval` tokens, and the last.
                if not (finished or sent == 0 or made - sent >= self._stream_interval):
                    continue
                ids = list(range(sent if delta else 0, made))
                sent = made
                yield RequestOutput(
                    request_id,
                    text,
                    prompt_ids,
                    None,
                    [
                        CompletionOutput(
                            0,
                            "".join(f" w{i}" for i in ids),
                            ids,
                            finish_reason="length" if finished else None,
                        )
                    ],
                    finished,
                )
        finally:
            self._streams.pop(request_id, None)
            if not stream.done:
                batch.abort(stream)  # the reader left: vLLM aborts the request

    async def abort(self, request_id, internal: bool = False):
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for one in ids:
            stream = self._streams.get(one)
            if stream is not None:
                self._paced().abort(stream)

    def shutdown(self):
        if self._batch is not None:
            self._batch.close()

    def _record(self, step: StepStats) -> None:
        if not self._loggers:
            return
        running, waiting = step.state
        iteration = IterationStats(
            num_generation_tokens=step.generated + step.first_tokens,
            time_to_first_tokens_iter=list(step.ttfts),
            inter_token_latencies_iter=list(step.token_gaps),
            n_params_iter=[1] * step.first_tokens,
            finished_requests=[
                FinishedRequestStats(
                    "length",
                    e2e_latency=time.monotonic() - s.arrived,
                    num_generation_tokens=s.limit,
                )
                for s in step.finished
            ],
        )
        scheduler = SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting)
        for logger in self._loggers:
            logger.record(scheduler_stats=scheduler, iteration_stats=iteration, engine_idx=0)
