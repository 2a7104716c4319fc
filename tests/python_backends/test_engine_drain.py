"""An engine model in a draining server (trident_common/drain.py, engine_model.py), on
trident's SGLang model with the SGLang double: a direct client's new request is refused
with the drain's class (UNAVAILABLE, so Triton's HTTP port answers 503), the router's
requests (admitted before the drain) are served, the busy count the server waits on is
published, and at the cutoff a running stream ends with SHUTDOWN's marker, once."""

from __future__ import annotations

import pytest

from tests.fakes import fake_pb_utils as pb
from tests.helpers import wait_for
from tests.python_backends.test_sglang_model import _serve, repo, texts  # noqa: F401
from trident_common import drain
from trident_common.error_classes import DRAINING, SHUTDOWN, classify
from trident_common.interface import DRAIN_DIR_ENV


@pytest.fixture
def served(repo, drain_folder, monkeypatch):  # noqa: F811
    yield from _serve(repo, monkeypatch)


def enter(served, folder, *files):
    for name in files:
        (folder / name).touch()
    served.model.drain.check()  # the watch's step now, not within POLL_S


def busy(folder) -> list[str]:
    return [p.read_text() for p in folder.glob(drain.BUSY_PREFIX + "*") if p.suffix != ".tmp"]


def test_a_direct_clients_new_request_is_refused_with_the_drains_class(served, drain_folder):
    enter(served, drain_folder, drain.DRAINING)
    sender = served.run(text_input="hi", stream=True)
    (response,) = sender.responses()
    error = response.error()
    assert classify(error.message()) is DRAINING and "retry on another" in error.message()
    assert error.code() == pb.TritonError.UNAVAILABLE
    assert sender.final_flags() == 1 and served.engine.calls == []


def test_the_routers_requests_are_still_served_and_counted_busy(served, drain_folder):
    enter(served, drain_folder, drain.DRAINING)
    assert busy(drain_folder) == ["0"]
    served.engine.hold_after = 1
    stream = served.send(True, text_input="long answer", stream=True, request_id="router-1")
    wait_for(lambda: stream.responses())
    served.model.drain.check()
    assert busy(drain_folder) == ["1"]
    served.engine.release()
    stream.wait_closed()
    assert not any(r.has_error() for r in stream.responses()) and stream.final_flags() == 1
    wait_for(lambda: (served.model.drain.check(), busy(drain_folder))[1] == ["0"])


def test_at_the_cutoff_a_running_stream_ends_with_the_shutdown_error(served, drain_folder):
    served.engine.hold_after = 1
    stream = served.send(True, text_input="long answer", stream=True, request_id="router-2")
    wait_for(lambda: stream.responses())
    enter(served, drain_folder, drain.DRAINING, drain.CUTOFF)
    stream.wait_closed()
    ended = stream.responses()[-1]
    message = ended.value("error") if not ended.has_error() else ended.error().message()
    assert classify(message) is SHUTDOWN, texts(stream)
    assert stream.final_flags() == 1
    wait_for(lambda: served.engine.aborts)  # the engine stops generating it
    # After the cutoff even the router's requests are refused.
    late = served.run(True, text_input="hi", stream=True, request_id="router-3")
    assert classify(late.responses()[0].error().message()) is SHUTDOWN


def test_without_the_drain_folder_nothing_is_watched(repo, monkeypatch):  # noqa: F811
    monkeypatch.delenv(DRAIN_DIR_ENV, raising=False)
    for served in _serve(repo, monkeypatch):
        assert served.model.drain.thread is None and not served.model.drain.draining
        assert served.run(text_input="hi", stream=True).final_flags() == 1


def test_a_closed_watch_lets_go_of_its_model(tmp_path):
    """The watch's callbacks hold the model: close() (the model's finalize) drops them,
    so the model is freed by its last reference, not by the garbage collector at the
    stub's exit, when freeing a model's Triton objects segfaults (seen: the router's stub
    at every unload, and one unload that never ended)."""
    import gc
    import weakref

    class Model:
        def __init__(self):
            self.handling = 0
            self.watch = drain.DrainWatch(str(tmp_path), "m_0_0", lambda: self.handling)

    model = Model()
    gone = weakref.ref(model)
    model.watch.close()
    gc.disable()
    try:
        del model
        assert gone() is None
    finally:
        gc.enable()


def test_the_watch_beats_while_it_runs_and_leaves_no_heartbeat_once_closed(tmp_path):
    """The heartbeat `trident serve` judges hung stubs by (builder/serve/watch.py): the
    watch's thread touches alive.<pid> about once a second from the start, and close()
    (a finalising stub beats no more, yet is not hung) removes it."""
    import os
    import time

    beat = tmp_path / f"{drain.ALIVE_PREFIX}{os.getpid()}"
    watch = drain.DrainWatch(str(tmp_path), "m_0_0", lambda: 0)
    try:
        wait_for(beat.exists, timeout_s=5)
        first = beat.stat().st_mtime_ns
        wait_for(lambda: beat.stat().st_mtime_ns > first, timeout_s=5)
        beat.unlink()  # the server forgets a heartbeat: the next beat makes it again
        started = time.monotonic()
        wait_for(beat.exists, timeout_s=5)
        assert time.monotonic() - started <= drain.BEAT_S + 1
    finally:
        watch.close()
    assert not beat.exists()
