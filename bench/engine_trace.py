"""prefix_routing's engine-side trace (`--trace`): where each request's first token went.

`install` puts bench/trace_scheduler.py into each rendered vLLM replica (its model.json
names it as vLLM's `scheduler_cls`); the engines then append their requests and steps to
one JSON-lines file. `join` joins that file with the client's own record of each
request (phase, conversation, turn, when it was sent, its TTFT) and splits each TTFT in
wall-clock time (one machine, one clock):

  to_engine   sent by the client -> vLLM's front end has it (client, router, relay in,
              the vLLM model's own work before generate())
  frontend    the front end -> the engine core's scheduler has it (tokenizing, IPC)
  queue       the scheduler has it -> the first step that computes any of its prompt
  prefill     that step's start -> the end of the step that computes its last prompt
              token (the first token is sampled in that step)
  back        the first token leaves the engine core -> the client reads it (detokenize,
              IPC, the vLLM model, relay out, router, gRPC)

and per request the batch its last prefill chunk ran in: how many other requests were
prefilling in that step, of the same turn or not, and the step's prefill tokens and time.
Pure but for `install` and the tokenizer the caller hands in.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.prefix_workload import PHASE_PATTERN, QUESTION_PATTERN

SCHEDULER = Path(__file__).with_name("trace_scheduler.py")
SCHEDULER_CLS = "trace_scheduler.TracingScheduler"
PARTS = ("to_engine", "frontend", "queue", "prefill", "back")
BATCH = (
    "uncached_tokens",
    "prefill_steps",
    "batch_prefills",
    "batch_same_turn",
    "batch_prefill_tokens",
    "batch_step_s",
)


def install(repo: Path, replicas: list[str], trace: Path) -> None:
    """Have every replica's engine run the tracing scheduler, appending to `trace`."""
    for replica in replicas:
        folder = repo / replica / "1"
        shutil.copy(SCHEDULER, folder / SCHEDULER.name)
        settings = {"path": str(trace), "replica": replica}
        (folder / "trace_scheduler.json").write_text(json.dumps(settings))
        config = json.loads((folder / "model.json").read_text())
        config["scheduler_cls"] = SCHEDULER_CLS
        (folder / "model.json").write_text(json.dumps(config, indent=2))


def read(lines: Iterable[str]) -> tuple[dict[str, dict], list[dict]]:
    """The trace's requests {replica/id: record} and steps (in order of their end)."""
    requests, steps = {}, []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record["kind"] == "request":
            requests[f"{record['replica']}/{record['id']}"] = record
        else:
            steps.append(record)
    steps.sort(key=lambda s: s["end"])
    return requests, steps


def identify(record: dict, decode: Callable[[list[int]], str]) -> tuple[str, int, int] | None:
    """(phase, conversation, turn) of a traced request, from its prompt's first tokens
    (the system prompt opens with the phase) and last ones (the newest question)."""
    phase = PHASE_PATTERN.search(decode(record["head"]))
    questions = QUESTION_PATTERN.findall(decode(record["tail"]))
    if not phase or not questions:
        return None  # a warm-up or control request: not a conversation's turn
    conversation, turn = questions[-1]
    return phase.group(1), int(conversation), int(turn)


def timelines(requests: dict[str, dict], steps: list[dict]) -> dict[str, dict]:
    """Per traced request: its first scheduled step's start, the end of its last prefill
    step (its first token), the cached tokens it started from, and that last prefill
    step's batch (prefill requests in it, their tokens, decode requests, its time)."""
    out: dict[str, dict] = {}
    for step in steps:
        replica = step["replica"]
        prefilling = [e for e in step["batch"] if e[2] < e[3]]
        prefill_ids = {f"{replica}/{e[0]}" for e in prefilling}
        for req_id, scheduled, before, prompt in step["batch"]:
            key = f"{replica}/{req_id}"
            if key not in requests:
                continue
            line = out.setdefault(
                key, {"first_start": step["start"], "cached": before, "prefill_steps": 0}
            )
            if before >= prompt:
                continue
            line["prefill_steps"] += 1
            if before + scheduled >= prompt and "first_token" not in line:
                line["first_token"] = step["end"]
                line["batch"] = {
                    "prefills": len(prefilling),
                    "prefill_ids": sorted(prefill_ids - {key}),
                    "prefill_tokens": sum(e[1] for e in prefilling),
                    "decodes": len(step["batch"]) - len(prefilling),
                    "step_s": step["end"] - step["start"],
                }
    return out


def join(
    client: list[dict],
    requests: dict[str, dict],
    steps: list[dict],
    decode: Callable[[list[int]], str],
) -> list[dict]:
    """One row per client request the trace saw: its turn, TTFT split into PARTS, and its
    last prefill step's batch, with how many of the other prefills were the same turn of
    the same phase."""
    lines = timelines(requests, steps)
    who = {key: identify(record, decode) for key, record in requests.items()}
    by_turn = {w: key for key, w in who.items() if w is not None}
    rows = []
    for asked in client:
        key = by_turn.get((asked["phase"], asked["conversation"], asked["turn"]))
        if key is None or "first_token" not in lines.get(key, {}):
            continue  # not traced, or its prefill never finished (it failed)
        line = lines[key]
        record = requests[key]
        first_token_at = line["first_token"]
        batch = line["batch"]
        here = (asked["phase"], asked["turn"])
        same_turn = sum(1 for o in batch["prefill_ids"] if (who.get(o) or ("", 0, 0))[::2] == here)
        rows.append(
            {
                "phase": asked["phase"],
                "turn": asked["turn"],
                "replica": record["replica"],
                "ttft": asked["ttft"],
                "to_engine": record["arrival"] - asked["sent"],
                "frontend": record["added"] - record["arrival"],
                "queue": line["first_start"] - record["added"],
                "prefill": first_token_at - line["first_start"],
                "back": asked["sent"] + asked["ttft"] - first_token_at,
                "prompt_tokens": record["prompt_tokens"],
                "cached_tokens": line["cached"],
                "prefill_steps": line["prefill_steps"],
                "batch_prefills": batch["prefills"],
                "batch_same_turn": same_turn,
                "batch_prefill_tokens": batch["prefill_tokens"],
                "batch_decodes": batch["decodes"],
                "batch_step_s": batch["step_s"],
            }
        )
    return rows


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summary(rows: list[dict]) -> dict:
    """Turns 2 and later (the turns the issue's TTFT goal counts): the p50 and the mean of
    TTFT and of each part (the means add up to the mean TTFT; the p50s need not), the
    batch of the last prefill step, and the p50s per turn."""
    later = [r for r in rows if r["turn"] >= 2]
    out: dict = {"requests": len(later)}
    for r in later:
        r.setdefault("uncached_tokens", r["prompt_tokens"] - r["cached_tokens"])
    for name in ("ttft", *PARTS, *BATCH):
        values = [r[name] for r in later]
        out[name] = {"p50": _median(values), "mean": _mean(values)}
    out["alone_share"] = (
        sum(1 for r in later if r["batch_prefills"] == 1) / len(later) if later else None
    )
    per_turn: dict[int, dict] = defaultdict(dict)
    for turn in sorted({r["turn"] for r in rows}):
        these = [r for r in rows if r["turn"] == turn]
        for name in ("ttft", *PARTS, "batch_prefills", "batch_step_s"):
            per_turn[turn][name] = _median([r[name] for r in these])
    out["by_turn"] = dict(per_turn)
    return out


def tokenizer_decode(model_json: Path) -> Callable[[list[int]], str]:
    """The replica's own tokenizer (the model folder model.json names), as a decode."""
    from transformers import AutoTokenizer  # the bench's venv has it (vLLM needs it)

    tokenizer = AutoTokenizer.from_pretrained(json.loads(model_json.read_text())["model"])
    return lambda ids: tokenizer.decode(ids)
