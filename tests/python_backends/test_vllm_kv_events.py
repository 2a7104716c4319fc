"""vLLM's KV-cache events run on this CPU build: a real engine (SmolLM2, 32-token blocks)
publishes BlockStored batches over ZMQ whose hashes chain across prompts that share a
prefix, AllBlocksCleared after a prefix-cache reset, and replays its buffer on request.
The same engine, its exporter set as trident's vLLM model sets it
(tracing.vllm_tracing_defaults), sends its own `llm_request` span of a request to an
OTLP/HTTP receiver as the child of the traceparent it was given (issue 38's "vLLM's own
spans"; the engine model hands its span's: tests/python_backends/test_vllm_tracing.py).

The engine runs in a child process (vLLM wants its own process and ~9 s of imports);
the child subscribes with pyzmq, decodes each frame with vLLM's own msgspec classes
(KVEventBatch), and prints the decoded events and the raw frames as JSON lines.
docs/router.md ("Exact mode") states what this settles.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

from builder.engines import assets
from support.otlp_collector import Collector
from tests.helpers.ledger import LEDGER
from trident_common import tracing

pytestmark = pytest.mark.vllm

BLOCK = 32  # vLLM's CPU attention takes multiples of 32 (its default here is 128)

ENGINE = r"""
import json, os, sys, time
model, run_dir = sys.argv[1], sys.argv[2]
# One process: the scheduler, and so the publisher thread, run beside the subscriber.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import msgspec, zmq
from vllm import LLM, SamplingParams
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import KVEventBatch

endpoint, replay = f"ipc://{run_dir}/kv.sock", f"ipc://{run_dir}/kv-replay.sock"
llm = LLM(model=model, max_model_len=512, block_size=__BLOCK__, enforce_eager=True,
          enable_prefix_caching=True, seed=0, otlp_traces_endpoint=sys.argv[3],
          disable_log_stats=False,  # LLM's default is True; vLLM's span needs the stats
          kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                          endpoint=endpoint, replay_endpoint=replay,
                                          topic="replica-0"))
sub = zmq.Context.instance().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"replica-0")
sub.connect(endpoint)
decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

def event(e):
    out = {"type": type(e).__name__}
    for field in ("block_hashes", "parent_block_hash", "token_ids", "block_size"):
        if hasattr(e, field):
            value = getattr(e, field)
            out[field] = [repr(h) for h in value] if field == "block_hashes" else (
                repr(value) if field == "parent_block_hash" else value)
    return out

def frame(parts):
    topic, seq, payload = parts
    batch = decoder.decode(payload)
    return {"topic": topic.decode(), "seq": int.from_bytes(seq, "big", signed=True),
            "events": [event(e) for e in batch.events], "payload": payload.hex()}

def drain(step):
    # A batch goes out after the engine step that made it; wait until one is quiet.
    quiet = time.monotonic() + 1.0
    while time.monotonic() < quiet:
        if sub.poll(100):
            print(json.dumps({"step": step, **frame(sub.recv_multipart())}), flush=True)
            quiet = time.monotonic() + 1.0

time.sleep(0.5)  # a SUB socket misses what was sent before it joined
greedy = SamplingParams(max_tokens=4, temperature=0)
shared = "You are a careful assistant. Answer in one short sentence. " * 8
# Each prompt's own tail fills at least one more block of its own.
sky, cat = "Question: what colour is the sky? " * 6, "Question: how many legs has a cat? " * 6
for step, prompt in (("first", shared + sky), ("second", shared + cat)):
    out = llm.generate([prompt], greedy, use_tqdm=False)[0]
    print(json.dumps({"step": step, "prompt_token_ids": list(out.prompt_token_ids)}))
    drain(step)
print(json.dumps({"step": "reset", "ok": llm.reset_prefix_cache()}), flush=True)
drain("reset")  # nothing yet: a reset's event rides on the next step's batch
llm.generate([shared + sky], greedy, use_tqdm=False)
drain("again")
asker = zmq.Context.instance().socket(zmq.DEALER)
asker.connect(replay)
asker.send_multipart((b"", (0).to_bytes(8, "big")))
while True:
    _, topic, seq, payload = asker.recv_multipart()
    if int.from_bytes(seq, "big", signed=True) == -1:
        break
    print(json.dumps({"step": "replay", **frame((topic, seq, payload))}), flush=True)
# vLLM's span of a request, child of the given traceparent (exported at exit).
engine = llm.llm_engine
engine.add_request("traced", sky, greedy, trace_headers={"traceparent": sys.argv[4]})
while engine.has_unfinished_requests():
    engine.step()
"""
# The caller's span vLLM's span must hang off (test_vllms_own_span_is_the_callers_child).
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """Every line the engine's child printed, in order, and the spans it exported."""
    run_dir = tmp_path_factory.mktemp("kv")
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("PYTHONHASHSEED", None)  # it would replace vLLM's fixed seed of the chain
    env.setdefault("VLLM_CACHE_ROOT", str(run_dir / "vllm-cache"))
    started = time.monotonic()
    with Collector() as collector:
        config: dict = {}
        tracing.vllm_tracing_defaults(config, env | {tracing.ENDPOINT_ENV: collector.endpoint})
        env[tracing.VLLM_PROTOCOL_ENV] = tracing.OTLP_HTTP
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                ENGINE.replace("__BLOCK__", str(BLOCK)),
                str(assets.ensure(assets.SMOLLM2)),
                str(run_dir),
                config["otlp_traces_endpoint"],
                f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        spans = list(collector.spans)
    LEDGER.engine_without_server("vllm", "kv-events: SmolLM2", time.monotonic() - started)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines, spans


@pytest.fixture(scope="module")
def published(engine_run):
    return engine_run[0]


def test_vllms_own_span_is_the_callers_child(engine_run):
    requests = [s for s in engine_run[1] if s.name == "llm_request"]
    # Every request gets one; those given no traceparent are roots of their own.
    (span,) = [s for s in requests if s.trace_id == CALLER_TRACE]
    assert span.parent_id == CALLER_SPAN
    assert span.attributes["gen_ai.request.id"] == "traced"
    assert span.attributes["gen_ai.usage.completion_tokens"] == 4


def at(lines, step):
    return [line for line in lines if line["step"] == step]


def stored(lines, step):
    return [e for line in at(lines, step) if "events" in line for e in line["events"]]


def test_full_blocks_are_published_as_chained_block_stored_events(published):
    prompt = at(published, "first")[0]["prompt_token_ids"]
    events = stored(published, "first")
    assert events and {e["type"] for e in events} == {"BlockStored"}
    assert all(e["block_size"] == BLOCK for e in events)
    # The first batch starts a chain (no parent); each later one hangs off the last hash.
    assert events[0]["parent_block_hash"] == "None"
    for before, after in zip(events, events[1:], strict=False):
        assert after["parent_block_hash"] == before["block_hashes"][-1]
    # Only full blocks are stored, and their tokens are the prompt's, in order.
    tokens = [t for e in events for t in e["token_ids"]]
    assert len(tokens) % BLOCK == 0 and len(tokens) >= len(prompt) // BLOCK * BLOCK
    assert tokens[: len(prompt) // BLOCK * BLOCK] == prompt[: len(prompt) // BLOCK * BLOCK]


def test_a_prompt_sharing_a_prefix_stores_only_its_new_blocks_under_the_shared_chain(
    published,
):
    first_prompt = at(published, "first")[0]["prompt_token_ids"]
    second_prompt = at(published, "second")[0]["prompt_token_ids"]
    common = next(
        i for i, (a, b) in enumerate(zip(first_prompt, second_prompt, strict=False)) if a != b
    )
    shared_blocks = common // BLOCK
    assert shared_blocks >= 2  # the test's prompts share several whole blocks
    first_hashes = [h for e in stored(published, "first") for h in e["block_hashes"]]
    second = stored(published, "second")
    # The shared blocks were hits, not stored again: the new chain hangs off the last one.
    assert second[0]["parent_block_hash"] == first_hashes[shared_blocks - 1]
    assert second[0]["token_ids"][:BLOCK] == second_prompt[shared_blocks * BLOCK :][:BLOCK]
    assert not set(first_hashes) & {h for e in second for h in e["block_hashes"]}


def test_a_prefix_cache_reset_is_published_as_all_blocks_cleared(published):
    assert at(published, "reset")[0]["ok"] is True
    assert stored(published, "reset") == []  # held until the next engine step
    again = stored(published, "again")
    assert again[0] == {"type": "AllBlocksCleared"}
    # After the reset the same prompt is stored afresh, under the same content hashes.
    first_hashes = [h for e in stored(published, "first") for h in e["block_hashes"]]
    again_hashes = [h for e in again[1:] for h in e["block_hashes"]]
    assert again[1]["parent_block_hash"] == "None"
    assert again_hashes[:2] == first_hashes[:2]


def test_the_replay_socket_resends_the_buffered_batches_in_order(published):
    live = [line for line in published if "seq" in line and line["step"] != "replay"]
    replayed = at(published, "replay")
    assert [line["seq"] for line in replayed] == [line["seq"] for line in live]
    assert [line["payload"] for line in replayed] == [line["payload"] for line in live]
    assert {line["topic"] for line in replayed} == {"replica-0"}


def vllm_chain(tokens: list[int]) -> list[str]:
    """vLLM 0.32's published hashes of the full blocks of `tokens`, computed here without
    vLLM: its default `sha256` of the pickled (parent, block tokens, extra keys), the
    first parent the hash of its fixed seed "vllm-none-hash"
    (v1/core/kv_cache_utils.py, hash_block_tokens and init_none_hash), published as the
    low 64 bits (maybe_convert_block_hash, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)."""

    def sha(value: object) -> bytes:
        return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    parent, published = sha("vllm-none-hash"), []
    for start in range(0, len(tokens) // BLOCK * BLOCK, BLOCK):
        parent = sha((parent, tuple(tokens[start : start + BLOCK]), None))
        published.append(repr(int.from_bytes(parent, "big") & ((1 << 64) - 1)))
    return published


def test_the_published_hashes_can_be_computed_from_token_ids_in_another_process(published):
    """What an exact mode needs: the router (another process) can name vLLM's blocks from
    the token ids alone, without an engine, given no cache salt."""
    first, second = (at(published, step)[0]["prompt_token_ids"] for step in ("first", "second"))
    first_hashes = [h for e in stored(published, "first") for h in e["block_hashes"]]
    second_hashes = [h for e in stored(published, "second") for h in e["block_hashes"]]
    assert vllm_chain(first) == first_hashes[: len(first) // BLOCK]
    # The second prompt's chain: the blocks it shared (stored by the first), then its own.
    chain = vllm_chain(second)
    shared = sum(1 for a, b in zip(chain, first_hashes, strict=False) if a == b)
    assert shared >= 2 and chain == (first_hashes[:shared] + second_hashes)[: len(chain)]
