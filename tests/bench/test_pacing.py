"""support/pacing.py and the engine doubles built on it: tokens at the configured pace,
merged when the reader lags, the batch-wide limit, abort, and the AsyncLLM double's
surface as trident's vLLM model calls it (in a subprocess: the real vllm is installed
here, the double must be what `import vllm` finds)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from support.pacing import PacedBatch, Rate, RateSource, step_interval
from support.vllm_double import DOUBLES, ROOT, write_rate


def test_step_interval_is_the_slower_of_stream_and_batch():
    rate = Rate(ttft_s=0.05, tokens_per_s=100, batch_tokens_per_s=1000)
    assert step_interval(rate, 1) == pytest.approx(0.01)
    assert step_interval(rate, 10) == pytest.approx(0.01)
    assert step_interval(rate, 40) == pytest.approx(0.04)  # 40 streams share 1000/s
    assert step_interval(Rate(tokens_per_s=20), 500) == pytest.approx(0.05)


def test_rate_refuses_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="tokens_per_sec"):
        Rate.from_dict({"tokens_per_sec": 5})
    with pytest.raises(ValueError, match="tokens_per_s must be > 0"):
        Rate.from_dict({"tokens_per_s": 0})


def test_rate_source_reads_the_control_file_again_when_it_changes(tmp_path):
    control = tmp_path / "rate.json"
    source = RateSource(Rate(tokens_per_s=7), str(control))
    assert source.current().tokens_per_s == 7  # no file yet: the given rate
    write_rate(control, Rate(ttft_s=0.1, tokens_per_s=50))
    assert source.current() == Rate(ttft_s=0.1, tokens_per_s=50)
    write_rate(control, Rate(tokens_per_s=100, batch_tokens_per_s=900))
    assert source.current().batch_tokens_per_s == 900


def _run(coroutine):
    return asyncio.run(coroutine)


def test_tokens_come_at_the_pace_and_merge_when_the_reader_lags():
    async def main():
        batch = PacedBatch(RateSource(Rate(ttft_s=0.05, tokens_per_s=200)))
        stream = batch.add(40)
        start = time.monotonic()
        assert await stream.take() == 1
        ttft = time.monotonic() - start
        await asyncio.sleep(0.06)  # ~12 steps while we were away
        merged = await stream.take()
        total = 1 + merged
        while new := await stream.take():
            total += new
        batch.close()
        return ttft, merged, total, time.monotonic() - start

    ttft, merged, total, elapsed = _run(main())
    # Lower bounds only: the double is never faster than its rate; a busy machine may
    # make it later (upper bounds would be flaky there).
    assert ttft >= 0.045
    assert merged >= 8  # tokens made while away came in one read
    assert total == 40
    assert elapsed >= 0.05 + 39 / 200


def test_the_batch_limit_slows_every_stream():
    async def main(streams):
        batch = PacedBatch(RateSource(Rate(ttft_s=0.0, tokens_per_s=200, batch_tokens_per_s=800)))

        async def one():
            stream = batch.add(20)
            while await stream.take():
                pass

        start = time.monotonic()
        await asyncio.gather(*(one() for _ in range(streams)))
        batch.close()
        return time.monotonic() - start

    # Unlimited, 19 steps at 200/s take 0.095 s; 8 streams sharing 800/s need 0.19 s.
    assert _run(main(8)) >= 19 * 8 / 800 * 0.95


def test_abort_ends_a_stream():
    async def main():
        batch = PacedBatch(RateSource(Rate(ttft_s=0.0, tokens_per_s=100)))
        stream = batch.add(1000)
        await stream.take()
        batch.abort(stream)
        left = await stream.take()
        batch.close()
        return left, stream.made

    left, made = _run(main())
    assert made < 1000 and left in (0, 1)


DOUBLE_CHECK = """
import asyncio, json, sys
sys.path[:0] = [{doubles!r}, {root!r}]
from vllm import AsyncEngineArgs, SamplingParams
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
import vllm

records = []

class Logger:
    def log_engine_initialized(self): pass
    def record(self, scheduler_stats, iteration_stats, engine_idx=0):
        records.append((scheduler_stats.num_running_reqs, iteration_stats.num_generation_tokens,
                        len(iteration_stats.finished_requests)))

async def main():
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model="x", rate={{"ttft_s": 0.01, "tokens_per_s": 500}}),
        stat_loggers=[lambda config, index: Logger()])
    out = {{"double": vllm.__version__}}
    for kind in ("DELTA", "CUMULATIVE"):
        params = SamplingParams(max_tokens=6, output_kind=RequestOutputKind[kind])
        texts, finished = [], []
        async for o in engine.generate("a b c", params, "r-" + kind):
            texts.append(o.outputs[0].text)
            finished.append(o.finished)
        out[kind] = [texts[-1], sum(len(t.split()) for t in texts), finished[-1],
                     o.outputs[0].finish_reason, len(o.prompt_token_ids)]
    spaced = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model="x", rate={{"ttft_s": 0.01, "tokens_per_s": 500}}, stream_interval=4))
    params = SamplingParams(max_tokens=10, output_kind=RequestOutputKind.DELTA)
    out["interval"] = [len(o.outputs[0].token_ids) async for o in spaced.generate("a", params, "r")]
    spaced.shutdown()
    try:
        SamplingParams(temperatur=0)
    except TypeError as e:
        out["typo"] = str(e)
    prompt = engine.get_tokenizer().apply_chat_template(
        [{{"role": "user", "content": "hi"}}], tokenize=False, add_generation_prompt=True)
    out["chat"] = prompt
    out["generated"] = sum(r[1] for r in records)
    out["finished"] = sum(r[2] for r in records)
    engine.shutdown()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_the_asyncllm_double_answers_as_trident_reads_vllm():
    result = subprocess.run(
        [sys.executable, "-c", DOUBLE_CHECK.format(doubles=str(DOUBLES), root=str(ROOT))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["double"].endswith("rate-double")
    # DELTA: each output only the new tokens; CUMULATIVE: all so far
    assert out["DELTA"] == [out["DELTA"][0], 6, True, "length", 3]
    assert out["CUMULATIVE"][0] == " w0 w1 w2 w3 w4 w5" and out["CUMULATIVE"][2:] == [
        True,
        "length",
        3,
    ]
    assert "temperatur" in out["typo"]
    assert out["chat"].endswith("assistant")
    assert out["generated"] == 12 and out["finished"] == 2  # the stat loggers' view
    # stream_interval 4: the first output at once, then 4 or more tokens per output (more
    # where the reader fell behind), the rest in the last
    sizes = out["interval"]
    assert sum(sizes) == 10 and all(size >= 4 for size in sizes[1:-1]) and len(sizes) <= 4


def test_the_sglang_double_paces_itself_when_told(monkeypatch):
    from support import fake_sglang

    monkeypatch.setattr(fake_sglang, "REPLY", " ".join(f"w{i}" for i in range(40)))
    monkeypatch.setattr(fake_sglang, "PACE", RateSource(Rate(ttft_s=0.05, tokens_per_s=200)))

    async def main():
        engine = fake_sglang.Engine(model_path="m", incremental_streaming_output=True)
        start, first, sizes = time.monotonic(), None, []
        chunks = await engine.async_generate(
            prompt="hi", sampling_params={"max_new_tokens": 30}, stream=True, rid="r1"
        )
        async for chunk in chunks:
            first = first or time.monotonic() - start
            sizes.append(len(chunk["text"].split()))
            if len(sizes) == 2:
                await asyncio.sleep(0.04)  # a slow reader: tokens merge
        return first, sizes, time.monotonic() - start, chunk["meta_info"]

    first, sizes, elapsed, meta = _run(main())
    assert first >= 0.045 and elapsed >= 0.05 + 29 / 200
    assert sum(sizes) == 30 and max(sizes) > 1
    assert meta["finish_reason"]["type"] == "length"
