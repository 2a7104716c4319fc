"""trident's vLLM model: vLLM's AsyncLLM inside a decoupled Triton Python-backend stub.

Engine arguments come from model.json (rendered from the spec's engine_args). The tensor
interface, cancellation, errors and metrics are shared with the SGLang model
(trident_common.engine_model); this file only speaks vLLM.
"""

from __future__ import annotations

import locale
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

# The stub's Python starts in the ASCII locale; vLLM reads UTF-8 files at import time.
locale.setlocale(locale.LC_CTYPE, "C.UTF-8")

import triton_python_backend_utils as pb_utils  # noqa: E402

from python_backends.vllm.cpu_binding import bind_share  # noqa: E402
from python_backends.vllm.stats import VllmStats  # noqa: E402
from trident_common import tracing  # noqa: E402
from trident_common.deltas import Delta  # noqa: E402
from trident_common.engine_model import AsyncEngineModel  # noqa: E402
from trident_common.error_classes import UNAVAILABLE  # noqa: E402
from trident_common.request import (  # noqa: E402
    SAMPLING_TYPES,
    BadRequest,
    GenerateRequest,
    check_adapter,
    check_sampling_keys,
    describe,
)
from trident_common.returns import logprobs_json, wants_logprobs  # noqa: E402
from trident_common.sampling import check_token_ids  # noqa: E402
from trident_common.structured import (  # noqa: E402
    FIELD,
    compiler_words,
    needs_compile,
    with_tools,
)
from trident_common.tool_calls import Extract, ToolPlan, collect, forced_calls  # noqa: E402
from trident_common.tool_calls import call as tool_call  # noqa: E402
from trident_common.triton_io import (  # noqa: E402
    FINAL,
    ResponseFactory,
    errors_in_band,
    model_parameters,
    request_parameters,
    send_error,
)

if TYPE_CHECKING:  # vLLM is imported when the engine starts, not with this file
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import PromptType
    from vllm.logprobs import FlatLogprobs
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput

# vllm_backend's model parameters (config.pbtxt `parameters`), with its meanings.
REPORT_CUSTOM_METRICS = "REPORT_CUSTOM_METRICS"  # "true": vllm:* families (rendered on)
ENABLE_VLLM_HEALTH_CHECK = "ENABLE_VLLM_HEALTH_CHECK"  # "true": a dead engine unloads the model
UNHEALTHY = "Model is unavailable due to unhealthy vLLM engine"  # vllm_backend's words


# Structured outputs write compact JSON unless the spec's engine arguments say otherwise:
# where the grammar allows whitespace, a small model may write newlines until max_tokens
# (SmolLM2 did, in 1 of 50 schemas and in forced tool calls at temperature 0.7). Compact
# JSON is the same JSON. vLLM allows it with xgrammar or guidance, not "auto": xgrammar,
# its first choice (a schema feature xgrammar lacks is then a 400, not a fallback).
STRUCTURED_BACKEND = "xgrammar"
COMPACT_JSON_BACKENDS = ("xgrammar", "guidance")  # where disable_any_whitespace is allowed


def structured_outputs_settings(given: object) -> dict[str, Any]:
    """vLLM's StructuredOutputsConfig fields to set: the spec's engine_args
    `structured_outputs_config` (None: it set none) as given, with trident's compact-JSON
    default only where it set nothing (disable_any_whitespace only on a backend that
    allows it, so a spec's other backend still starts)."""
    if given is not None and not isinstance(given, dict):
        raise ValueError("engine_args.structured_outputs_config must be an object")
    settings = dict(given or {})
    settings.setdefault("backend", STRUCTURED_BACKEND)
    if settings["backend"] in COMPACT_JSON_BACKENDS:
        settings.setdefault("disable_any_whitespace", True)
    return settings


# The host memory vLLM's xgrammar compiler keeps compiled grammars in, per engine, in MB
# (vLLM 0.32's VLLM_XGRAMMAR_CACHE_MB, read where the engine core builds its backend;
# vLLM's default is 512). A compiled grammar held SmolLM2 (49k tokens) to 0.03-0.3 MB
# for an everyday schema and 2.5-4 MB for a heavy one (1,000 optional or 2,000 required
# properties); a 150k-token vocabulary makes them about 3x.
# 64 MB keeps a couple of hundred everyday grammars of such a model and a dozen of the
# largest, while a stream of distinct heavy schemas (issue 34: the engines grew by 3 GB
# and never gave it back) costs each replica 64 MB, not 512; a miss only compiles again.
XGRAMMAR_CACHE_MB = "64"


def grammar_cache_default(environ: MutableMapping[str, str]) -> None:
    """Bound the engine's grammar cache (XGRAMMAR_CACHE_MB) unless the operator did."""
    environ.setdefault("VLLM_XGRAMMAR_CACHE_MB", XGRAMMAR_CACHE_MB)


# The KV cache of a CPU instance when neither the spec (engine_args.kv_cache_memory_bytes)
# nor the operator (VLLM_CPU_KVCACHE_SPACE) sizes it: vLLM's own default is a share of
# the machine's memory, which two replicas on a small box would both claim.
CPU_KV_CACHE_GIB = "1"


def cpu_engine_defaults(config: dict[str, Any], environ: MutableMapping[str, str]) -> None:
    """Settings vLLM needs on a CPU-only machine, unless the spec or the operator set them.

    vLLM reads VLLM_CPU_KVCACHE_SPACE (whole GiB) last and lets it override the engine
    argument kv_cache_memory_bytes (vllm/platforms/cpu.py), so the variable is set only
    where the spec sized no cache, and a spec that sizes it wins over an inherited one:
    the spec is the deployment's own word, per model."""
    if config.get("kv_cache_memory_bytes") is not None:
        environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    if "VLLM_CACHE_ROOT" not in environ:  # no empty folder left where the operator set one
        environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="trident-vllm-")
    config.setdefault("enforce_eager", True)  # no graphs to capture on a CPU


class TritonPythonModel(AsyncEngineModel):
    engine_name = "vllm"
    _on_cpu = False  # a CPU instance (initialize): cpu_engine_defaults apply

    def initialize(self, args: dict[str, Any]) -> None:
        # This blocks for vLLM's whole start (20-60 s here). Triton 2.51's Python backend
        # waits for the answer in 1 s slices, each needing the stub's health thread (C++,
        # no GIL, every 300 ms) to have run: on a starved machine one missed slice fails
        # the load as "Stub process ... is not healthy", and the backend then waits for
        # that stub to exit, which it never does: the model stays LOADING for good
        # (python_backend r24.10 stub_launcher.cc, ReceiveMessageFromStub and
        # WaitForStubProcess). Neither the window nor the wait can be set from here.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        params = model_parameters(args)
        self._on_cpu = args.get("model_instance_kind") == "CPU"
        if self._on_cpu:
            # A replica's own cores, before vLLM starts its worker (cpu_binding.py).
            bind_share(params, os.environ, sorted(os.sched_getaffinity(0)))
        self._labels = {"model": args["model_name"], "version": args["model_version"]}
        self._report_stats = params.get(REPORT_CUSTOM_METRICS, "").lower() == "true"
        self._health_check = params.get(ENABLE_VLLM_HEALTH_CHECK, "").lower() == "true"
        self._unloading = threading.Lock()  # taken once, by the first to see the engine dead
        self._stats: VllmStats | None = None
        try:
            super().initialize(args)
        except BaseException:
            self._close_stats()  # no finalize() follows a failed load
            raise

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        """vllm_backend's health check: once the engine is dead, refuse in its words
        (UNAVAILABLE) instead of trident's usual "engine is dead" error."""
        if self._health_check and self.engine_dead() is not None:
            for request in requests:
                self._count(None, self.metrics.errors)
                in_band = errors_in_band(request_parameters(request))
                _refuse_unhealthy(request.get_response_sender(), self.responses, in_band)
            return None
        super().execute(requests)
        return None

    def finalize(self) -> None:
        try:
            super().finalize()
        finally:
            self._close_stats()

    def _close_stats(self) -> None:
        if self._stats is not None:
            self._stats.close()

    async def start_engine(self, config: dict[str, Any]) -> None:
        if self._on_cpu:  # before vLLM is imported: it reads these as it starts
            cpu_engine_defaults(config, os.environ)
        grammar_cache_default(os.environ)  # the engine core (a child process) inherits it
        tracing.vllm_tracing_defaults(config, os.environ)
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineGenerateError

        self._sampling_class = SamplingParams
        self._structured_class = StructuredOutputsParams
        self._client_errors = (ValueError, TypeError, OverflowError, VLLMClientError)
        self._generate_error = EngineGenerateError
        self._delta = RequestOutputKind.DELTA
        # The sampling names clients may use: trident's typed table, as far as this
        # vLLM's SamplingParams has them.
        self._sampling_fields = set(SAMPLING_TYPES) & set(SamplingParams.__struct_fields__)
        # vLLM refuses a priority unless it schedules by priority (spec tenants' tiers).
        self._by_priority = config.get("scheduling_policy") == "priority"
        self.loras = lora_requests(config.pop("lora_adapters", {}))
        # The spec's tool parser (vLLM's ToolParserManager name): not an engine argument.
        self._tool_parser = tool_parser_class(config.pop("tool_call_parser", None))
        # vLLM's host cache of adapters (its LRU, max_cpu_loras, else max_loras): while
        # every adapter fits, one vLLM loaded stays loaded and is never read again.
        self._loras_stay = len(self.loras) <= (
            config.get("max_cpu_loras") or config.get("max_loras") or 1
        )
        self._loaded_loras: set[int] = set()
        given = config.pop("structured_outputs_config", None)  # the spec's, if any
        engine_args = AsyncEngineArgs(**config)
        for key, value in structured_outputs_settings(given).items():
            if not hasattr(engine_args.structured_outputs_config, key):
                raise ValueError(f"engine_args.structured_outputs_config: unknown field {key!r}")
            setattr(engine_args.structured_outputs_config, key, value)
        # StatLogger is vLLM's StatLoggerBase by its methods alone (stats.py imports no
        # vLLM), so the list is typed loosely.
        loggers: list[Any] = []
        # vLLM computes no stats with disable_log_stats: then there is nothing to export.
        if self._report_stats and not engine_args.disable_log_stats:
            self._stats = VllmStats(
                self._labels,
                self._max_model_len(engine_args),
                adapters=self.loras,
                # vLLM's own default when the spec's lora section leaves it out.
                max_loras=engine_args.max_loras if self.loras else 0,
            )
            loggers.append(self._stats.logger_factory)
        self.engine = AsyncLLM.from_engine_args(engine_args, stat_loggers=loggers or None)
        self.tokenizer = self.engine.get_tokenizer()
        # The ids vLLM's own check allows (the model's logits, which may be padded past
        # the tokenizer's length).
        self._vocabulary = self.engine.model_config.get_vocab_size()

    @staticmethod
    def _max_model_len(engine_args: AsyncEngineArgs) -> int:
        """The token-count histograms' top edge: the context length, when the spec set
        it (else vLLM takes the model's; 32k covers the models trident ships)."""
        return engine_args.max_model_len or 32768

    def engine_dead(self) -> str | None:
        engine = getattr(self, "engine", None)
        if engine is None or not engine.errored:
            return None
        if self._health_check:
            self._unload_once()
        return describe(engine.dead_error)

    def _unload_once(self) -> None:
        """As vllm_backend does: ask Triton to unload this model, so it stops being READY.
        From a thread of its own: unloading waits for finalize(), which needs the loop
        that the health watcher (a caller of engine_dead) runs on."""
        if not self._unloading.acquire(blocking=False):
            return
        self.log.error(f"Engine is not healthy and model {self.model_name} will be unloaded")
        threading.Thread(target=self._unload, name="vllm-unload", daemon=True).start()

    def _unload(self) -> None:
        try:
            pb_utils.unload_model(self.model_name)
        except Exception as e:  # e.g. not in explicit model-control mode
            self.log.error(
                f"Cannot unload model {self.model_name} ({describe(e)}): it "
                f"stays loaded and refuses every request"
            )

    def make_sampling(self, request: GenerateRequest) -> _Call:
        check_sampling_keys(request.sampling, self._sampling_fields, "vllm")
        check_token_ids(request.sampling, self._vocabulary, self.model_name)
        values, constraint = with_tools(dict(request.sampling), request.tool_plan)
        bounded = needs_compile(values)  # before structured_outputs becomes vLLM's class
        plan = request.tool_plan
        if plan is not None and not plan.forced:
            if self._tool_parser is None:
                raise BadRequest(
                    f"[tool_choice] model {self.model_name} has no tool parser "
                    "(engine_args.tool_call_parser in the spec): tool_choice "
                    "auto cannot be read; required or a named function can"
                )
            # Tool-call markers are special tokens in many models: keep them in the text
            # for the parser (vLLM's hermes parser asks the same).
            values.setdefault("skip_special_tokens", False)
        if wants_logprobs(request.returns) and values.get("logprobs") is None:
            values["logprobs"] = 0  # the sampled token's own logprob only
        if "structured_outputs" in values:
            try:
                values["structured_outputs"] = self._structured_class(
                    **values["structured_outputs"]
                )
            except self._client_errors as e:
                raise BadRequest(f"sampling_parameters.structured_outputs: {describe(e)}") from None
        try:
            params = self._sampling_class(
                **values, max_tokens=request.max_tokens, output_kind=self._delta
            )
        except self._client_errors as e:  # vLLM's checks of the values (ranges, ...)
            raise BadRequest(f"invalid sampling_parameters: {describe(e)}") from None
        if params.structured_outputs is not None:
            self._check_constraint(params, constraint)
        return _Call(
            params,
            request.priority if self._by_priority else 0,
            request.cache_salt,
            self.lora_for(request.lora_name),
            self._extractor(request),
            constraint,
            bounded,
        )

    def _check_constraint(self, params: SamplingParams, tag: str) -> None:
        """A schema, regex or grammar no structured-output backend of this vLLM can
        compile is the client's error, named before generation: vLLM's own check (the
        one its input processing runs, backend fallback included), called here so the
        refusal can name the parameter the constraint came from."""
        try:
            params._validate_structured_outputs(
                self.engine.model_config,
                self.engine.vllm_config.structured_outputs_config,
                self.tokenizer,
            )
        except self._client_errors as e:
            raise BadRequest(
                f"{tag}sampling_parameters.structured_outputs cannot be compiled: "
                f"{compiler_words(describe(e))}"
            ) from None

    def _extractor(self, request: GenerateRequest) -> Extract | None:
        """How the calls are read out of this request's answer (None: no tools)."""
        plan: ToolPlan | None = request.tool_plan
        if plan is None:
            return None
        if plan.forced:

            def forced(text: str) -> tuple[str | None, list[dict[str, Any]]]:
                calls = forced_calls(plan, text)
                return (None, calls) if calls else (text, [])

            return forced
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        # model_validate: the same validation as the constructor, which mypy (without
        # pydantic's plugin) reads as requiring every field.
        chat = ChatCompletionRequest.model_validate(
            {
                "model": self.model_name,
                "messages": request.messages,
                "tools": plan.tools,
                "tool_choice": "auto",
            }
        )
        parser = self._tool_parser(self.tokenizer, chat.tools)

        def auto(text: str) -> tuple[str | None, list[dict[str, Any]]]:
            found = parser.extract_tool_calls(text, chat)
            if not found.tools_called:
                return text, []
            return found.content, [
                tool_call(c.function.name, c.function.arguments) for c in found.tool_calls
            ]

        return auto

    def lora_for(self, name: str | None) -> LoRARequest | None:
        """The LoRARequest of an adapter named in the request (None: the base model)."""
        name = check_adapter(name, self.loras, self.model_name)
        return None if name is None else self.loras[name]

    async def render_chat(
        self, messages: list[Any], tools: list[dict[str, Any]] | None = None
    ) -> str:
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
            return cast(str, prompt)  # tokenize=False: the text, not token ids
        except Exception as e:
            raise BadRequest(f"cannot apply the chat template: {e}") from None

    def stream(self, prompt: str, sampling: _Call, engine_id: str) -> AsyncIterator[Delta]:
        deltas = self._deltas(prompt, sampling, engine_id)
        return deltas if sampling.tools is None else collect(deltas, sampling.tools)

    async def _deltas(self, prompt: str, sampling: _Call, engine_id: str) -> AsyncIterator[Delta]:
        input_tokens = output_tokens = 0
        if sampling.lora is not None:
            await self._load_adapter(sampling.lora)
        engine_prompt: PromptType = prompt
        if sampling.cache_salt:  # the tenant's own prefix cache (bls/tenants.py)
            engine_prompt = {"prompt": prompt, "cache_salt": sampling.cache_salt}
        outputs = self._count_cached(
            self.engine.generate(
                engine_prompt,
                sampling.params,
                engine_id,
                priority=sampling.priority,
                lora_request=sampling.lora,
                trace_headers=tracing.engine_trace_headers(),
            )
        )
        try:
            # The engine core compiles a constraint before it schedules the request: the
            # first output waits for the compile, bounded from here (compile_bound.py).
            first = await self.first_outputs.first(
                engine_id, outputs.__anext__(), sampling.constraint if sampling.bounded else ""
            )
        except BadRequest:  # a ValueError too: the compile bound's, as it is
            raise
        except self._client_errors as e:  # vLLM's request checks, e.g. prompt too long
            raise BadRequest(describe(e)) from None
        except self._generate_error as e:
            # vLLM wraps what its input processing raised (e.g. a TypeError on a value
            # it could not handle) in a message-less EngineGenerateError; the request
            # never reached the engine core, so the request is what failed.
            if isinstance(e.__cause__, self._client_errors):
                raise BadRequest(describe(e.__cause__)) from None
            raise
        except StopAsyncIteration:
            return
        async for output in _chain(first, outputs):
            if output.prompt_token_ids:
                input_tokens = len(output.prompt_token_ids)
            completion = output.outputs[0]
            output_tokens += len(completion.token_ids)
            if completion.finish_reason == "error":
                raise _engine_error(sampling.constraint, output_tokens)
            yield Delta(
                completion.text,
                completion.finish_reason,
                input_tokens,
                output_tokens,
                None
                if completion.logprobs is None
                else logprobs_json(_positions(completion.logprobs)),
                completion.cumulative_logprob,
            )

    async def _load_adapter(self, lora: LoRARequest) -> None:
        """Have vLLM load the adapter before a request uses it. Left to generate(), vLLM
        loads it inside its engine core when the request is scheduled, and an adapter
        it cannot load there (its file changed or vanished since `trident repo` checked
        it) kills the engine core: every request of every client fails after it.
        add_lora runs the same loader as a utility call, whose failure vLLM hands back to
        the caller alone, so this request fails as the client's and the engine goes on.
        Once loaded, an adapter stays in vLLM's host cache while all of them fit."""
        if self._loras_stay and lora.lora_int_id in self._loaded_loras:
            return
        try:
            await self.engine.add_lora(lora)
        except Exception as e:
            if self.engine.errored:
                raise
            raise BadRequest(
                f"adapter {lora.lora_name!r} cannot be loaded: {describe(e)}"
            ) from None
        self._loaded_loras.add(lora.lora_int_id)

    async def _count_cached(
        self, outputs: AsyncIterator[RequestOutput]
    ) -> AsyncIterator[RequestOutput]:
        """outputs, passed through; the request's cached tokens are counted when its last
        output comes (before the client sees it), or when it ends early (aborted, failed):
        the hit happened all the same."""
        cached, counted = 0, False
        try:
            async for output in outputs:
                cached = max(cached, output.num_cached_tokens or 0)
                if output.finished and not counted:
                    self.metrics.prefix_cached_tokens.increment(cached)
                    counted = True
                yield output
        finally:
            if not counted and cached:
                self.metrics.prefix_cached_tokens.increment(cached)

    async def abort(self, engine_id: str) -> None:
        await self.engine.abort(engine_id)
        # The line vllm_backend writes (its clients' tests look for it in the log).
        self.log.info(f"Successfully cancelled the request {engine_id}")

    async def stop_engine(self) -> None:
        self.engine.shutdown()


class _Call(NamedTuple):
    """What one generate() call takes besides the prompt: sampling and the tenant's."""

    params: SamplingParams
    priority: int
    cache_salt: str | None
    lora: LoRARequest | None = None  # None for the base model
    tools: Extract | None = None  # text -> (content, calls): the tool calls' reader, if any
    constraint: str = ""  # the parameter tag of its structured output ("" for none)
    bounded: bool = False  # its constraint needs compiling (compile_bound.py)


def _engine_error(constraint: str, output_tokens: int) -> Exception:
    """vLLM's finish_reason "error" (its FINISHED_ERROR, which its own server answers
    with a 500). Before any token of a constrained request, the engine core failed to
    compile the constraint: vLLM finishes such a request so when the compile raised,
    its regex compile timeout (VLLM_REGEX_COMPILATION_TIMEOUT_S) included. That is the
    client's error, named; anything else is the engine's."""
    if constraint and output_tokens == 0:
        return BadRequest(
            f"{constraint}{FIELD} cannot be compiled: the engine failed to compile it "
            "into a grammar, or gave up on it taking too long"
        )
    return RuntimeError("the engine ended the request with an error (finish_reason error)")


def _refuse_unhealthy(
    sender: pb_utils.ResponseSender, factory: ResponseFactory, in_band: bool
) -> None:
    try:
        if in_band:  # the router: UNAVAILABLE's marker carries the class (error_classes.py)
            send_error(sender, factory, UNAVAILABLE.mark(UNHEALTHY), False, in_band=True)
            return
        sender.send(
            pb_utils.InferenceResponse(
                error=pb_utils.TritonError(UNHEALTHY, pb_utils.TritonError.UNAVAILABLE)
            )
        )
        sender.send(flags=FINAL)  # Triton drops the final flag of an error response
    except Exception:
        pass  # the client is gone: nobody is left to tell


def tool_parser_class(name: str | None) -> Any:
    """vLLM's tool parser class of that name (None: the model parses no calls); an
    unknown name fails the load (the spec's check knows vLLM's names too)."""
    if not name:
        return None
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.get_tool_parser(name)


def lora_requests(adapters: dict[str, str]) -> dict[str, LoRARequest]:
    """name → vLLM LoRARequest. vLLM tells adapters apart by their integer id (> 0), so
    ids are fixed here, in name order, and never reused for another folder."""
    from vllm.lora.request import LoRARequest

    return {
        name: LoRARequest(name, index, adapters[name])
        for index, name in enumerate(sorted(adapters), start=1)
    }


def _positions(
    logprobs: FlatLogprobs | list[dict[int, Any]],
) -> Iterable[Mapping[int, Any]]:
    """vLLM's per-position logprobs: FlatLogprobs (VLLM_FLAT_LOGPROBS) is typed as
    holding None positions but yields a mapping for each, as the list does."""
    return cast(Iterable[Mapping[int, Any]], logprobs)


T = TypeVar("T")


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item
