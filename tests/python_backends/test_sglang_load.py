"""SGLang's own load gauges (python_backends/sglang/load.py): the snapshots' numbers
(pure), the writes made only of what changed and off the loop, a failing read that the
model outlives, the double's get_loads, and the model exporting them on the CPU against
the double (support/fake_sglang.py), as tests/python_backends/test_sglang_model.py drives
it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from python_backends.sglang import load
from python_backends.sglang.load import Load, LoadGauges, changed, summarize
from support import fake_sglang
from support.fake_sglang import LoadSnapshot
from tests.fakes import fake_pb_utils as pb
from tests.helpers import wait_for
from tests.python_backends.test_sglang_model import _serve, texts, with_engine_args
from trident_common.log import Log

RUNNING, WAITING, USAGE = (name for name, _ in load.FAMILIES.values())

# -- the numbers (pure) ------------------------------------------------------------------


def test_ranks_are_summed_and_the_fullest_ranks_usage_is_the_engines():
    snapshots = [
        LoadSnapshot(dp_rank=0, num_running_reqs=3, num_waiting_reqs=1, token_usage=0.25),
        LoadSnapshot(dp_rank=1, num_running_reqs=2, num_waiting_reqs=4, token_usage=0.5),
    ]
    assert summarize(snapshots) == Load(running=5, waiting=5, token_usage=0.5)
    assert summarize(snapshots[:1]) == Load(3, 1, 0.25)


def test_no_snapshot_yet_is_no_load():
    # SGLang's reader returns [] before the scheduler's first publish: nothing is written.
    assert summarize([]) is None


def test_only_the_gauges_that_changed_are_written():
    assert changed(Load(1, 0, 0.5), None) == [("running", 1), ("waiting", 0), ("token_usage", 0.5)]
    assert changed(Load(1, 0, 0.5), Load(1, 0, 0.5)) == []
    assert changed(Load(2, 0, 0.25), Load(1, 0, 0.5)) == [("running", 2), ("token_usage", 0.25)]


def test_every_sglang_name_is_sglangs_own():
    assert load.FAMILIES["running"][0] == "sglang:num_running_reqs"
    assert load.FAMILIES["waiting"][0] == "sglang:num_queue_reqs"
    assert load.FAMILIES["token_usage"][0] == "sglang:token_usage"


# -- the writes --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_writes_are_queued_only_for_changes_and_all_rewritten_now_and_then():
    queued: list[tuple] = []
    clock = Clock()
    gauges = LoadGauges("load-writes", lambda f, *args: queued.append((f, args)), clock)
    gauges.publish(Load(2, 1, 0.5))
    gauges.publish(Load(2, 1, 0.5))  # unchanged: nothing queued
    clock.now += 1
    gauges.publish(Load(3, 1, 0.5))
    assert [args[0] for _, args in queued] == [
        [("running", 2), ("waiting", 1), ("token_usage", 0.5)],
        [("running", 3)],
    ]
    # Nothing was written on the publishing thread: the writes are the sender's.
    assert pb.metric(RUNNING, model="load-writes") is None
    for function, args in queued:
        function(*args)
    written = [pb.metric(name, model="load-writes") for name in (RUNNING, WAITING, USAGE)]
    assert [series.value() for series in written] == [3, 1, 0.5]
    # Past REFRESH_S every gauge is written again (an overlapping reload's old instance
    # wrote the same series), changed or not.
    queued.clear()
    clock.now += load.REFRESH_S
    gauges.publish(Load(3, 1, 0.5))
    assert [args[0] for _, args in queued] == [
        [("running", 3), ("waiting", 1), ("token_usage", 0.5)]
    ]


def test_after_close_no_write_is_made_and_no_series_created():
    queued: list[tuple] = []
    gauges = LoadGauges("load-closed", lambda f, *args: queued.append((f, args)))
    gauges.publish(Load(1, 0, 0.1))
    gauges.close()
    for function, args in queued:
        function(*args)
    assert pb.metric(RUNNING, model="load-closed") is None


# -- the poll ----------------------------------------------------------------------------


def test_a_failing_read_is_logged_once_and_polling_goes_on(caplog):
    published: list[Load] = []
    reads = 0

    class Gauges:
        def publish(self, value: Load) -> None:
            published.append(value)

    async def get_loads():
        nonlocal reads
        reads += 1
        if reads <= 3:
            raise RuntimeError("shared memory not attached")
        return [LoadSnapshot(num_running_reqs=reads)]

    async def main():
        task = asyncio.create_task(load.poll(get_loads, Gauges(), Log("sglang"), 0.001))  # type: ignore[arg-type]
        while len(published) < 2:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "get_loads" in r.getMessage()]
    assert len(warnings) == 1 and "shared memory not attached" in warnings[0], warnings
    assert [p.running for p in published[:2]] == [4, 5]


# -- the double --------------------------------------------------------------------------


def test_the_doubles_snapshot_counts_its_live_requests():
    engine = fake_sglang.Engine(model_path="/m", max_running_requests=2, max_total_tokens=1000)
    manager = engine.tokenizer_manager
    (idle,) = asyncio.run(manager.get_loads())
    assert (idle.num_running_reqs, idle.num_waiting_reqs, idle.token_usage) == (0, 0, 0)
    assert idle.max_total_num_tokens == 1000 and idle.dp_rank == 0
    for rid, tokens in (("a", 10), ("b", 7), ("c", 3)):
        manager.rid_to_state[rid] = {"aborted": False, "tokens": tokens}
    (snapshot,) = asyncio.run(manager.get_loads())
    assert (snapshot.num_running_reqs, snapshot.num_waiting_reqs) == (2, 1)  # capped at 2
    assert snapshot.num_used_tokens == 17  # the running ones' KV only
    assert snapshot.token_usage == 0.017
    assert asyncio.run(manager.get_loads(dp_rank=1)) == []  # one rank
    unbounded = fake_sglang.Engine(model_path="/m").tokenizer_manager
    unbounded.rid_to_state.update(manager.rid_to_state)
    (snapshot,) = asyncio.run(unbounded.get_loads())
    assert (snapshot.num_running_reqs, snapshot.num_waiting_reqs) == (3, 0)
    assert snapshot.max_total_num_tokens == fake_sglang.DEFAULT_MAX_TOTAL_TOKENS
    assert snapshot.token_usage == round(20 / fake_sglang.DEFAULT_MAX_TOTAL_TOKENS, 4)


# -- the model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from builder.pipeline import build_repository
    from builder.spec import parse_spec
    from tests.python_backends.test_sglang_model import sglang_spec

    out = tmp_path_factory.mktemp("sglang-load") / "repo"
    build_repository(parse_spec(sglang_spec(), "<test>"), out)
    return out


@pytest.fixture
def bounded(repo: Path, tmp_path: Path, monkeypatch):
    """The model with room for 2 running requests and a KV pool of 1000 tokens."""
    copy = with_engine_args(repo, tmp_path, {"max_running_requests": 2, "max_total_tokens": 1000})
    yield from _serve(copy, monkeypatch)


def gauge(name: str) -> float | None:
    metric = pb.metric(name, model="qwen")
    return None if metric is None else metric.value()


def test_the_model_exports_sglangs_load_while_requests_run(bounded):
    bounded.engine.hold_after = 1  # each stream holds after its first token
    senders = [bounded.send(text_input="a b c", stream=True) for _ in range(3)]
    # Two run (3 prompt tokens + 1 generated each), one waits.
    wait_for(lambda: (gauge(RUNNING), gauge(WAITING), gauge(USAGE)) == (2, 1, 0.008))
    bounded.engine.release()
    for sender in senders:
        sender.wait_closed()
        assert "".join(texts(sender))
    wait_for(lambda: (gauge(RUNNING), gauge(WAITING), gauge(USAGE)) == (0, 0, 0))


def test_a_failing_get_loads_does_not_stop_the_model(bounded, caplog):
    caplog.set_level(logging.WARNING, logger="trident")
    manager = bounded.engine.tokenizer_manager

    async def broken(include=None, dp_rank=None):
        raise RuntimeError("load snapshot reader gone")

    manager.get_loads = broken
    wait_for(lambda: "load snapshot reader gone" in caplog.text)
    sender = bounded.run(text_input="hello", stream=True)
    assert "".join(texts(sender)).split() == fake_sglang.REPLY.split()
    del manager.get_loads  # the class's again: the polling went on
    bounded.engine.hold_after = 0
    held = bounded.send(text_input="x y", stream=True)
    wait_for(lambda: gauge(RUNNING) == 1 and gauge(USAGE) == 0.002)
    bounded.engine.release()
    held.wait_closed()
    assert caplog.text.count("load snapshot reader gone") == 1  # logged once


def test_unload_stops_the_poll(repo, monkeypatch):
    for served in _serve(repo, monkeypatch):
        model = served.model
        poll = model._load_poll
    assert poll.done()
    assert not model._load_gauges._set.open
