"""prefix_routing's pure parts (bench/prefix_workload.py) and its client-side choices
(bench/prefix_routing.py): the workload the issue asks for, the hit-rate arithmetic on the
engines' counters as Triton prints them, and the rows against issue 23's targets."""

from __future__ import annotations

import math
from pathlib import Path

from bench.prefix_routing import TwoModels, balanced_ids, deployment
from bench.prefix_workload import (
    CACHED_TOKENS,
    CONVERSATIONS,
    DECISION,
    PROMPT_TOKENS,
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
from bls.prefix_index import PrefixIndex, prompt_key
from bls.replica_policy import affinity_replica


def test_each_turn_resends_the_history_with_the_answers_it_got():
    conversation = Conversation("p", 3)
    first = conversation.ask()
    assert [m["role"] for m in first] == ["system", "user"]
    conversation.answered(first, "answer one")
    second = conversation.ask()
    assert second[:2] == first and second[2] == {"role": "assistant", "content": "answer one"}
    assert second[3]["role"] == "user" and second[3]["content"] != first[1]["content"]
    assert conversation.turn == 2


def test_conversations_share_the_system_prompt_of_their_phase_only():
    a, b, other = Conversation("p", 0), Conversation("p", 1), Conversation("q", 0)
    assert a.messages == b.messages  # ~1,000 tokens shared
    assert 6_000 <= len(a.messages[0]["content"]) <= 9_000  # ~1,000 SmolLM2 tokens
    assert a.ask()[1] != b.ask()[1]  # their questions are their own
    # another phase shares no block with this one: no phase warms another's cache
    index = PrefixIndex()
    blocks = index.block_hashes(prompt_key(None, a.ask()))
    assert not set(blocks) & set(index.block_hashes(prompt_key(None, other.ask())))
    assert len(set(blocks) & set(index.block_hashes(prompt_key(None, b.ask())))) >= 25


def test_answer_lengths_spread_evenly_the_same_under_every_policy():
    """Each (conversation, turn) draws its answer's length once: the same in every phase
    (each policy gets the same work), within 16 +- 8, of mean about 16, and not all one
    length (fixed lengths put a replica's conversations in lockstep)."""
    lengths = [answer_tokens(c, t, 16, 8) for c in range(CONVERSATIONS) for t in range(1, 7)]
    assert lengths == [answer_tokens(c, t, 16, 8) for c in range(16) for t in range(1, 7)]
    assert min(lengths) >= 8 and max(lengths) <= 24 and len(set(lengths)) > 8
    assert 14 <= sum(lengths) / len(lengths) <= 18
    assert {answer_tokens(c, t, 16, 0) for c in range(16) for t in range(1, 7)} == {16}


def test_control_prompts_share_no_block():
    index = PrefixIndex()
    firsts = {index.block_hashes(control_prompt("c", n))[0] for n in range(64)}
    assert len(firsts) == 64


METRICS = f"""# HELP {PROMPT_TOKENS} Prompt tokens processed
# TYPE {PROMPT_TOKENS} counter
{PROMPT_TOKENS}{{model="m__r0"}} 1000
{PROMPT_TOKENS}{{model="m__r1"}} 3000
{PROMPT_TOKENS}{{adapter="sql",model="m__r1"}} 500
{PROMPT_TOKENS}{{model="other"}} 99
{CACHED_TOKENS}{{model="m__r0"}} 900
{CACHED_TOKENS}{{model="m__r1"}} 1500
nv_inference_count{{model="m__r0",version="1"}} 7
"""


def test_counters_read_each_replicas_own_series_and_nothing_else():
    values = counters(METRICS, ["m__r0", "m__r1", "m__r2"])
    assert values["m__r0"] == {PROMPT_TOKENS: 1000.0, CACHED_TOKENS: 900.0}
    assert values["m__r1"] == {PROMPT_TOKENS: 3000.0, CACHED_TOKENS: 1500.0}  # no adapter
    assert values["m__r2"] == {PROMPT_TOKENS: 0.0, CACHED_TOKENS: 0.0}


def test_the_hit_rate_is_cached_over_prompt_tokens_between_two_scrapes():
    before = counters(METRICS, ["m__r0", "m__r1"])
    after = {
        "m__r0": {PROMPT_TOKENS: 2000.0, CACHED_TOKENS: 1800.0},  # +1000, +900
        "m__r1": {PROMPT_TOKENS: 6000.0, CACHED_TOKENS: 1500.0},
    }  # +3000, +0
    rates = hit_rate(before, after)
    assert rates["hit_rate"] == 900 / 4000
    assert rates["replicas"]["m__r0"]["hit_rate"] == 0.9
    assert rates["replicas"]["m__r1"]["hit_rate"] == 0.0
    assert hit_rate(after, after)["hit_rate"] is None  # nothing processed: no rate


def test_ttft_p50_counts_turns_two_and_later_only():
    summary = ttft_summary({1: [9.0, 9.0, 9.0], 2: [0.1, 0.3], 3: [0.2]})
    assert summary["p50_turns_2_on"] == 0.2
    assert abs(summary["mean_turns_2_on"] - 0.2) < 1e-9
    assert summary["p50_by_turn"][1] == 9.0


def _phase(rate, ttft, computed=1000.0, wall=60.0):
    return {
        "hit_rate": rate,
        "ttft": {"p50_turns_2_on": ttft, "mean_turns_2_on": 2 * ttft, "p90_turns_2_on": 3 * ttft},
        "computed_tokens": computed,
        "wall_s": wall,
    }


def test_rows_hold_prefix_aware_to_the_issues_targets():
    phases = {
        "round_robin": _phase(0.60, 1.0),
        "oracle": _phase(0.90, 0.5),
        "prefix_aware": _phase(0.86, 0.55),
    }
    control = {"round_robin": {"tokens_per_s": 100.0}, "prefix_aware": {"tokens_per_s": 96.0}}
    table = {
        r["metric"].split(":")[0] + ":" + r["metric"].split(":")[1]: r
        for r in rows(phases, control)
    }
    assert [r["met"] for r in table.values()] == [True, True, True, None, None, None, None, True]
    assert table["hit rate: prefix_aware vs oracle"]["points"] == -4.0
    assert table["TTFT mean turns 2-6 (s): prefix_aware vs round_robin"]["ratio"] == 0.55
    assert table["TTFT p90 turns 2-6 (s): prefix_aware vs round_robin"]["direct"] == 3.0
    phases["prefix_aware"] = _phase(0.74, 0.61, 500.0)  # 6 below oracle, 14 above, 0.61x
    control["prefix_aware"]["tokens_per_s"] = 94.0
    table = rows(phases, control)
    assert [r["met"] for r in table] == [False, False, False, None, None, None, None, False]
    assert table[5]["ratio"] == 0.5  # half the prompt tokens prefilled


def test_without_prefix_aware_the_oracle_is_reported_against_round_robin():
    table = rows({"round_robin": _phase(0.6, 1.0), "oracle": _phase(0.9, 0.5)}, {})
    assert [r["met"] for r in table] == [None, None]
    assert table[0]["points"] == 30.0 and table[1]["ratio"] == 0.5


def test_the_client_side_policies_of_the_two_model_mode():
    mode = TwoModels(None, Path("."))
    mode.use("round_robin", "p")
    assert [mode.hints(0, sent)["route"] for sent in range(3)] == [
        "smollm2_r0",
        "smollm2_r1",
        "smollm2_r0",
    ]
    mode.use("oracle", "p")
    assert {mode.hints(5, sent)["route"] for sent in range(4)} == {"smollm2_r1"}


def test_the_oracles_conversation_ids_pin_eight_conversations_to_each_replica():
    replicas = ["m__r0", "m__r1"]
    ids = balanced_ids("phase", replicas)
    assert len(ids) == CONVERSATIONS and TURNS == 6
    assert [affinity_replica(ids[n], replicas) for n in range(4)] == replicas * 2
    assert sum(affinity_replica(i, replicas) == "m__r0" for i in ids.values()) == 8


def test_the_two_model_deployment_routes_to_both_copies():
    spec = deployment(False)
    assert [m["name"] for m in spec["models"]] == ["smollm2_r0", "smollm2_r1"]
    assert spec["models"][0]["engine_args"]["enable_prefix_caching"] is True
    assert deployment(True)["models"][0]["instances"] == 2


def _histogram(counts, backend="m"):
    bounds = ["1e-05", "2.5e-05", "5e-05", "0.0001", "+Inf"]
    return (
        "".join(
            f'{DECISION}_bucket{{backend="{backend}",le="{le}"}} {c}\n'
            for le, c in zip(bounds, counts, strict=True)
        )
        + f'{DECISION}_count{{backend="{backend}"}} {counts[-1]}\n'
    )


def test_the_decisions_p99_is_read_from_the_routers_histogram_between_two_scrapes():
    before = buckets(_histogram([5, 5, 5, 5, 5]), DECISION)
    # 200 decisions since: 150 within 25 us, 198 within 50 us, 200 within 100 us
    after = buckets(
        _histogram([105, 155, 203, 205, 205]) + _histogram([0, 0, 0, 0, 0], "x"), DECISION
    )
    figures = decision_figures(before, after)
    assert figures == {"decisions": 200, "share_within_target": 0.99, "p99_at_most_s": 5e-05}
    after = buckets(_histogram([105, 155, 202, 205, 205]), DECISION)  # 197 of 200
    assert decision_figures(before, after)["p99_at_most_s"] == 0.0001
    assert decision_figures(before, before)["decisions"] == 0


def test_placement_counts_conversations_per_replica_and_their_moves():
    served = {
        0: ["r0", "r0", "r0"],
        1: ["r1", "r0", "r0"],  # moved once, then stayed
        2: ["r0", "r1", "r0"],  # moved twice
        3: [],  # failed before its first answer: no turn to count
    }
    assert placement(served) == {
        "requests": {"r0": 7, "r1": 2},
        "conversations_first_turn": {"r0": 2, "r1": 1},
        "conversations_last_turn": {"r0": 3},
        "moves": 3,
    }


def test_a_replicas_share_holds_its_half_of_the_conversations_once():
    """share_tokens counts the system prompt once and each of one replica's conversations'
    own turns (questions by the template, answers by the tokens asked for), plus 10%."""
    calls = []

    def count(messages):  # one token per message and per 100 characters
        calls.append(len(messages))
        return sum(1 + len(m["content"]) // 100 for m in messages)

    system = count(Conversation("p", 0).messages)
    own = 0
    for n in range(0, CONVERSATIONS, 2):
        c = Conversation("p", n)
        for t in range(1, TURNS + 1):
            c.answered(c.ask(), "")
            own += answer_tokens(n, t, 16, 8)
        own += count(c.messages) - system
    calls.clear()
    assert share_tokens(count, "p") == math.ceil(1.1 * (system + own))
    assert calls == [1] + [1 + 2 * TURNS] * (CONVERSATIONS // 2)  # 8 conversations, full
    assert share_tokens(count, "p", replicas=4) < share_tokens(count, "p")


def test_the_system_floor_is_its_full_blocks_in_every_request():
    assert system_floor(96, 1003, 32, 121_000.0) == 96 * 992 / 121_000.0
    assert system_floor(96, 31, 32, 1000.0) == 0.0  # under a block: nothing is cached
    assert system_floor(96, 1003, 32, 0.0) == 0.0


def test_rows_say_the_most_any_routing_could_gain():
    phases = {"round_robin": _phase(0.87, 1.0), "oracle": _phase(0.92, 0.5)}
    phases["prefix_aware"] = _phase(0.92, 0.6)
    table = rows(phases, {}, {"round_robin": 0.78, "oracle": 0.78})
    gain = table[0]
    assert gain["metric"].startswith("hit rate: oracle vs round_robin's floor")
    assert gain["points"] == 14.0 and gain["met"] is None
    assert [r["metric"] for r in table[1:]] == [r["metric"] for r in rows(phases, {})]


def test_a_sized_cache_reaches_the_spec_in_bytes_of_the_models_kv():
    """kv_cache_memory_bytes: the tokens times SmolLM2's K and V per token at float32
    (30 layers x 3 KV heads x 64 x 2 x 4 bytes, builder/plan/memory.py)."""
    args = deployment(True, kv_tokens=5_300)["models"][0]["engine_args"]
    assert args["kv_cache_memory_bytes"] == 5_300 * 30 * 3 * 64 * 2 * 4
    assert "kv_cache_memory_bytes" not in deployment(True)["models"][0]["engine_args"]
