"""prefix_routing's pure parts: the multi-turn workload, the control's prompts, the
engines' prefix-cache hit rate from their counters, and the rows (bench/prefix_routing.py
does the I/O: the server, the client, the scrapes).

The workload (issue 23): CONVERSATIONS conversations at once, TURNS turns each, every one
opening with the same ~1,000-token system prompt and resending its whole history (its
earlier questions and the answers it got) with each new question. Each policy's phase has
its own system prompt and questions (`phase` is the first thing in the system prompt), so
no phase finds another phase's blocks in an engine's cache. The control shares nothing:
each prompt starts with its own tag.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

CONVERSATIONS, TURNS = 16, 6
# Each turn's answer is 16 +- 8 tokens (answer_tokens), not 16 for all: answers of one
# length end a replica's conversations on the same decode step, their next turns arrive
# together and prefill in one long step (the lockstep the engines' trace showed:
# docs/results/2026-12-02-prefix-routing-engine-trace.md), a rhythm no real chat traffic has.
ANSWER_TOKENS, ANSWER_SPREAD = 16, 8
SYSTEM_WORDS = 940  # ~7,600 characters: ~1,000 SmolLM2 tokens (747 for 700 words)
QUESTION_WORDS = 40  # ~50 tokens a turn
SUPPORT_WORDS = (
    "inventory",
    "refund",
    "warranty",
    "shipping",
    "invoice",
    "battery",
    "firmware",
    "adapter",
    "voltage",
    "manual",
    "order",
    "parcel",
    "courier",
    "receipt",
    "cable",
    "charger",
    "screen",
    "keyboard",
    "replacement",
    "depot",
)


# What bench/engine_trace.py reads back from a decoded prompt: its phase (the system
# prompt's head) and its questions (conversation, turn). They match the texts below.
PHASE_PATTERN = re.compile(r"Support desk (\S+)\. ")
QUESTION_PATTERN = re.compile(r"Customer (\d+), question (\d+):")


def system_prompt(phase: str) -> str:
    rng = random.Random(f"system-{phase}")
    return (
        f"Support desk {phase}. You answer customers of a hardware shop. Policy: "
        + " ".join(rng.choice(SUPPORT_WORDS) for _ in range(SYSTEM_WORDS))
        + "."
    )


def question(phase: str, conversation: int, turn: int) -> str:
    rng = random.Random(f"question-{phase}-{conversation}-{turn}")
    return (
        f"Customer {conversation}, question {turn}: "
        + " ".join(rng.choice(SUPPORT_WORDS) for _ in range(QUESTION_WORDS))
        + "?"
    )


@dataclass
class Conversation:
    """One conversation's messages; each turn adds its question, then the answer it got."""

    phase: str
    number: int
    messages: list[dict] = field(default_factory=list)

    def __post_init__(self):
        if not self.messages:
            self.messages = [{"role": "system", "content": system_prompt(self.phase)}]

    @property
    def turn(self) -> int:
        """The turn the next request is (1 for the first)."""
        return sum(1 for m in self.messages if m["role"] == "user") + 1

    def ask(self) -> list[dict]:
        """The next request's messages: the history and the next question."""
        return [
            *self.messages,
            {"role": "user", "content": question(self.phase, self.number, self.turn)},
        ]

    def answered(self, asked: list[dict], answer: str) -> None:
        self.messages = [*asked, {"role": "assistant", "content": answer}]


def answer_tokens(conversation: int, turn: int, answer: int, spread: int) -> int:
    """How many tokens a turn's answer has: `answer`, or with a spread, a number drawn
    evenly from answer +- spread, the same for a (conversation, turn) in every phase, so
    each policy gets the same work. Fixed answers end every conversation's turn on the
    same decode step, and a replica's conversations then send their next turns at once."""
    if not spread:
        return answer
    rng = random.Random(f"answer-{conversation}-{turn}")
    return rng.randint(answer - spread, answer + spread)


# -- the engines' KV cache -------------------------------------------------------------

# A replica's cache in the `share` configuration: the tokens its half of the conversations
# holds at their last turn (the system prompt once, each conversation's own turns), and
# 10% more for the partial blocks and the answers being written. Together the replicas'
# caches then hold the workload once, not once per replica: the regime cache-aware routing
# is for, as on a GPU serving more conversations than its cache holds over and over.
SHARE_HEADROOM = 1.1


def share_tokens(
    count: Callable[[list[dict]], int],
    phase: str,
    replicas: int = 2,
    answer: int = ANSWER_TOKENS,
    spread: int = ANSWER_SPREAD,
) -> int:
    """The `share` cache of one replica, in tokens. `count(messages)`: the tokens of a chat
    as the engine's template renders it; an answer's tokens are the ones the workload asks
    for (answer_tokens), added to its empty message's frame."""
    system = count(Conversation(phase, 0).messages)
    held = system
    for number in range(0, CONVERSATIONS, replicas):  # one replica's part of them
        conversation, answers = Conversation(phase, number), 0
        for turn in range(1, TURNS + 1):
            conversation.answered(conversation.ask(), "")
            answers += answer_tokens(number, turn, answer, spread)
        held += count(conversation.messages) - system + answers
    return math.ceil(SHARE_HEADROOM * held)


def system_floor(requests: int, system_tokens: int, block: int, prompt_tokens: float) -> float:
    """The hit rate a phase has if its requests hit on the shared system prompt and nothing
    else: its full blocks, in every request. No routing falls far below it (the prompt is
    hot on every replica), so the most any routing can gain over another is the oracle's
    rate minus this."""
    return requests * (system_tokens // block * block) / prompt_tokens if prompt_tokens else 0.0


def control_prompt(phase: str, n: int) -> str:
    """A prompt sharing no prefix with any other: its own tag comes first."""
    rng = random.Random(f"control-{phase}-{n}")
    return f"[{phase}-{n}-{rng.getrandbits(64):016x}] Write a reply to this customer: " + " ".join(
        rng.choice(SUPPORT_WORDS) for _ in range(120)
    )


def placement(served: dict[int, list[str]]) -> dict:
    """Where the conversations went, from the replica that served each turn: requests per
    replica, conversations per replica by their first and by their last turn, and the
    turns served by another replica than the turn before (moves)."""
    turns = [replicas for replicas in served.values() if replicas]
    return {
        "requests": dict(sorted(Counter(r for t in turns for r in t).items())),
        "conversations_first_turn": dict(sorted(Counter(t[0] for t in turns).items())),
        "conversations_last_turn": dict(sorted(Counter(t[-1] for t in turns).items())),
        "moves": sum(a != b for t in turns for a, b in zip(t, t[1:], strict=False)),
    }


# -- the engines' counters -------------------------------------------------------------

PROMPT_TOKENS = "trident_prompt_tokens_total"
CACHED_TOKENS = "trident_prefix_cached_tokens_total"
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)\s*$")


def counters(text: str, models: list[str]) -> dict[str, dict[str, float]]:
    """{model: {metric: value}} of the prompt and cached-token counters, from Prometheus
    text. Only a model's own series count (labels exactly {model}): an adapter's series
    (model and adapter) are part of it already."""
    wanted = {PROMPT_TOKENS, CACHED_TOKENS}
    out = {m: dict.fromkeys(wanted, 0.0) for m in models}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) not in wanted:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if set(labels) == {"model"} and labels["model"] in out:
            out[labels["model"]][match.group(1)] = float(match.group(3))
    return out


def hit_rate(before: dict, after: dict) -> dict:
    """The engines' prefix-cache hit rate between two scrapes: cached / prompt tokens,
    each replica's and all together (None where no prompt token was processed)."""
    per, cached_all, prompt_all = {}, 0.0, 0.0
    for model in after:
        cached = after[model][CACHED_TOKENS] - before.get(model, {}).get(CACHED_TOKENS, 0.0)
        prompt = after[model][PROMPT_TOKENS] - before.get(model, {}).get(PROMPT_TOKENS, 0.0)
        per[model] = {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "hit_rate": cached / prompt if prompt else None,
        }
        cached_all += cached
        prompt_all += prompt
    return {
        "hit_rate": cached_all / prompt_all if prompt_all else None,
        "prompt_tokens": prompt_all,
        "cached_tokens": cached_all,
        "computed_tokens": prompt_all - cached_all,
        "replicas": per,
    }


DECISION = "trident_router_replica_decision_seconds"
DECISION_TARGET_S = 50e-6  # issue 23: the decision's p99, on the router's own histogram


def buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts {le: count}, summed over its label sets
    (every backend and router instance); +Inf as float('inf')."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != f"{name}_bucket":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        le = float(labels.get("le", "inf").replace("+Inf", "inf"))
        out[le] = out.get(le, 0.0) + float(match.group(3))
    return out


def decision_figures(before: dict[float, float], after: dict[float, float]) -> dict:
    """The router's decisions between two scrapes: how many, the share at or under the
    target, and the smallest bucket bound that holds 99% of them (the p99, to a bucket)."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if not total:
        return {"decisions": 0, "share_within_target": None, "p99_at_most_s": None}
    p99 = next(le for le, count in counts.items() if count >= 0.99 * total)
    within = max((c for le, c in counts.items() if le <= DECISION_TARGET_S), default=0.0)
    return {"decisions": total, "share_within_target": within / total, "p99_at_most_s": p99}


def percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def ttft_summary(ttfts: dict[int, list[float]]) -> dict:
    """TTFT (s) per turn, and p50 over turns 2 and later (the turns a cache can serve)."""
    later = [t for turn, values in ttfts.items() if turn >= 2 for t in values]
    return {
        "p50_turns_2_on": percentile(later, 50),
        "p90_turns_2_on": percentile(later, 90),
        "mean_turns_2_on": statistics.fmean(later) if later else None,
        "p50_by_turn": {turn: statistics.median(v) for turn, v in sorted(ttfts.items())},
    }


# -- rows ------------------------------------------------------------------------------


def rows(
    phases: dict[str, dict], control: dict[str, dict], floor: dict[str, float] | None = None
) -> list[dict]:
    """Issue 23's targets, prefix_aware against the oracle and round_robin; where
    prefix_aware did not run, the oracle against round_robin, reported only. `floor`:
    each phase's system_floor, for the most any routing could gain here."""
    rr, oracle, aware = (phases.get(p) for p in ("round_robin", "oracle", "prefix_aware"))
    out = []
    if oracle and rr and floor and "round_robin" in floor:
        out.append(
            _row(
                "hit rate: oracle vs round_robin's floor (system prompt alone)",
                oracle["hit_rate"],
                floor["round_robin"],
                "report: the most any routing gains",
                None,
            )
        )
    if aware and oracle:
        out.append(
            _row(
                "hit rate: prefix_aware vs oracle",
                aware["hit_rate"],
                oracle["hit_rate"],
                "within 5 points of oracle",
                aware["hit_rate"] >= oracle["hit_rate"] - 0.05,
            )
        )
    if aware and rr:
        out.append(
            _row(
                "hit rate: prefix_aware vs round_robin",
                aware["hit_rate"],
                rr["hit_rate"],
                ">= round_robin + 15 points",
                aware["hit_rate"] >= rr["hit_rate"] + 0.15,
            )
        )
        ours, base = aware["ttft"]["p50_turns_2_on"], rr["ttft"]["p50_turns_2_on"]
        out.append(
            _row(
                "TTFT p50 turns 2-6 (s): prefix_aware vs round_robin",
                ours,
                base,
                "<= 0.6x round_robin",
                ours <= 0.6 * base,
                ratio=True,
            )
        )
        # With two replicas round_robin leaves about half the turns where their history
        # is, and its p50 falls among those: the mean and p90 also see the moved half.
        for stat in ("mean", "p90"):
            ours, base = aware["ttft"][f"{stat}_turns_2_on"], rr["ttft"][f"{stat}_turns_2_on"]
            out.append(
                _row(
                    f"TTFT {stat} turns 2-6 (s): prefix_aware vs round_robin",
                    ours,
                    base,
                    "report",
                    None,
                    ratio=True,
                )
            )
        out.append(
            _row(
                "prompt tokens prefilled: prefix_aware vs round_robin",
                aware["computed_tokens"],
                rr["computed_tokens"],
                "report",
                None,
                ratio=True,
            )
        )
        out.append(
            _row(
                "phase wall (s): prefix_aware vs round_robin",
                aware["wall_s"],
                rr["wall_s"],
                "report",
                None,
                ratio=True,
            )
        )
    elif oracle and rr:
        out.append(
            _row(
                "hit rate: oracle vs round_robin (prefix_aware not run)",
                oracle["hit_rate"],
                rr["hit_rate"],
                "report",
                None,
            )
        )
        out.append(
            _row(
                "TTFT p50 turns 2-6 (s): oracle vs round_robin",
                oracle["ttft"]["p50_turns_2_on"],
                rr["ttft"]["p50_turns_2_on"],
                "report",
                None,
                ratio=True,
            )
        )
    decision = (aware or {}).get("decision")
    if decision and decision["decisions"]:
        out.append(
            {
                "metric": "router decision p99 (its histogram, bucket bound, us)",
                "ours": decision["p99_at_most_s"] * 1e6,
                "target": f"<= {DECISION_TARGET_S * 1e6:g} us",
                "met": decision["share_within_target"] >= 0.99,
            }
        )
    if "prefix_aware" in control and "round_robin" in control:
        ours, base = (control[p]["tokens_per_s"] for p in ("prefix_aware", "round_robin"))
        out.append(
            _row(
                "control tokens/s: prefix_aware vs round_robin",
                ours,
                base,
                ">= 0.95x round_robin",
                ours >= 0.95 * base,
                ratio=True,
            )
        )
    return out


def _row(metric, ours, direct, target, met, ratio=False) -> dict:
    """A row of bench/run.py's table; a hit-rate row (ratio False) also says how many
    points apart the two are, which is what its target is written in."""
    row = {"metric": metric, "ours": ours, "direct": direct, "target": target, "met": met}
    if ours is not None and direct:
        row["ratio"] = ours / direct
    if not ratio and ours is not None and direct is not None:
        row["points"] = round(100 * (ours - direct), 1)
    return row
