"""bench/engine_trace.py: the engines' trace joined with the client's requests.

A hand-made trace of two replicas: its token ids stand for words (decode joins them), so
each request's phase and turn come from its prompt as they do from SmolLM2's tokenizer.
"""

import json

from bench import engine_trace

WORDS = ["Support desk rr-1. ", "Support desk control. ", "Customer 0, question 2:", "x"]
WORDS += ["Customer 1, question 2:", "Customer 2, question 2:", "Customer 0, question 1:"]


def decode(ids):
    return " ".join(WORDS[i] for i in ids)


def request(replica, rid, arrival, added, prompt, head, tail):
    return {
        "kind": "request",
        "replica": replica,
        "id": rid,
        "arrival": arrival,
        "added": added,
        "prompt_tokens": prompt,
        "head": head,
        "tail": tail,
    }


def step(replica, start, end, batch):
    return {"kind": "step", "replica": replica, "start": start, "end": end, "batch": batch}


def trace_lines():
    records = [
        # Replica a: conversations 0 and 1 at turn 2, and a control request, prefill
        # together in one step; conversation 0's turn 1 (earlier: a decode in that step).
        request("a", "q0", 10.0, 10.1, 100, [0], [6, 3, 2, 3]),
        request("a", "q1", 10.0, 10.2, 100, [0], [3, 4, 3]),
        request("a", "c", 10.0, 10.0, 50, [1], [3]),
        request("a", "old", 1.0, 1.0, 80, [0], [6]),
        # Replica b: conversation 2's turn 2, its prefill in two chunks.
        request("b", "q2", 11.0, 11.0, 300, [0], [5, 3]),
    ]
    steps = [
        step(
            "a",
            10.5,
            11.5,
            [["q0", 40, 60, 100], ["q1", 60, 40, 100], ["c", 50, 0, 50]] + [["old", 1, 90, 80]],
        ),  # fmt: skip
        step("b", 11.2, 11.6, [["q2", 200, 0, 300]]),
        step("b", 11.6, 12.0, [["q2", 100, 200, 300]]),
        step("b", 12.0, 12.1, [["q2", 1, 300, 300]]),  # a decode: not part of the prefill
    ]
    return [json.dumps(r) for r in records + steps]


CLIENT = [
    {"phase": "rr-1", "conversation": 0, "turn": 2, "sent": 9.9, "ttft": 1.7},
    {"phase": "rr-1", "conversation": 1, "turn": 2, "sent": 9.8, "ttft": 1.9},
    {"phase": "rr-1", "conversation": 2, "turn": 2, "sent": 10.9, "ttft": 1.2},
    {"phase": "rr-1", "conversation": 3, "turn": 2, "sent": 10.9, "ttft": 1.2},  # not traced
]


def rows():
    requests, steps = engine_trace.read(trace_lines())
    joined = engine_trace.join(CLIENT, requests, steps, decode)
    return {r["replica"] + str(r["ttft"]): r for r in joined}


def test_each_ttft_is_split_into_parts_that_add_up_to_it():
    found = rows()
    assert len(found) == 3  # conversation 3 was never traced: left out, not guessed
    for row in found.values():
        assert abs(sum(row[p] for p in engine_trace.PARTS) - row["ttft"]) < 1e-9
    q0 = found["a1.7"]
    parts = [q0[p] for p in engine_trace.PARTS]
    assert all(abs(a - b) < 1e-9 for a, b in zip(parts, [0.1, 0.1, 0.4, 1.0, 0.1], strict=True))


def test_the_batch_counts_the_other_prefills_and_which_are_the_same_turn():
    q0 = rows()["a1.7"]
    # q0, q1 and the control request prefill in that step; the old request decodes.
    assert q0["batch_prefills"] == 3 and q0["batch_same_turn"] == 1
    assert q0["batch_decodes"] == 1 and q0["batch_prefill_tokens"] == 150
    assert q0["cached_tokens"] == 60 and q0["prefill_steps"] == 1


def test_a_chunked_prefill_ends_at_its_last_chunk_and_runs_alone():
    q2 = rows()["b1.2"]
    assert q2["prefill_steps"] == 2 and q2["batch_prefills"] == 1
    assert abs(q2["prefill"] - 0.8) < 1e-9  # 11.2 -> 12.0, the decode step after is not
    summary = engine_trace.summary(list(rows().values()))
    assert summary["requests"] == 3 and abs(summary["alone_share"] - 1 / 3) < 1e-9


def test_install_points_each_replica_at_the_tracing_scheduler(tmp_path):
    for replica in ("m__r0", "m__r1"):
        (tmp_path / replica / "1").mkdir(parents=True)
        (tmp_path / replica / "1" / "model.json").write_text(json.dumps({"seed": 0}))
    engine_trace.install(tmp_path, ["m__r0", "m__r1"], tmp_path / "trace.jsonl")
    folder = tmp_path / "m__r1" / "1"
    assert json.loads((folder / "model.json").read_text()) == {
        "seed": 0,
        "scheduler_cls": "trace_scheduler.TracingScheduler",
    }
    assert json.loads((folder / "trace_scheduler.json").read_text())["replica"] == "m__r1"
    assert (folder / "trace_scheduler.py").read_text().startswith('"""A per-step trace')
