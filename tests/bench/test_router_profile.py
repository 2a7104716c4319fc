"""bench/router_profile.py's reading of py-spy's collapsed stacks: waiting threads are
left out, and each router function counts a sample once however deep it recurs."""

from __future__ import annotations

from bench.router_profile import summarize

LOOP, RELAY, WRITER = (
    "thread (2): Thread-1 (run_forever)",
    "thread (3): relay_0",
    ("thread (4): router-metrics"),
)
STACKS = [  # (frames, samples), as py-spy's raw output writes them: "a;b;c N"
    (["thread (1): MainThread"], 70),
    ([LOOP, "_run_once (asyncio/base_events.py:1884)", "EpollSelector.select (sel.py:468)"], 50),
    (
        [
            LOOP,
            "Handle._run (asyncio/events.py:80)",
            "TritonPythonModel.handle (1/bls/model.py:245)",
            "TritonPythonModel.route (1/bls/model.py:300)",
        ],
        7,
    ),
    ([RELAY, "_worker (concurrent/futures/thread.py:81)"], 40),
    (
        [
            RELAY,
            "Relay.run (1/bls/relay.py:155)",
            "Relay.start (1/bls/relay.py:202)",
            "Relay._send (1/bls/relay.py:243)",
        ],
        5,
    ),
    ([WRITER, "Writer._run (1/trident_common/metrics.py:141)"], 30),
    ([WRITER, "Writer._run (1/metrics.py:154)", "Metric.increment (1/metrics.py:69)"], 3),
]
RAW = "".join(f"{';'.join(frames)} {samples}\n" for frames, samples in STACKS)


def test_busy_samples_per_thread_and_router_function(tmp_path):
    raw = tmp_path / "router.collapsed"
    raw.write_text(RAW)
    summary = summarize(raw)
    assert summary["busy_samples_by_thread"] == {
        "Thread-1 (run_forever)": 7,
        "relay_0": 5,
        "router-metrics": 3,
    }
    assert summary["router_functions"] == {
        "TritonPythonModel.handle": 7,
        "TritonPythonModel.route": 7,
        "Relay.run": 5,
        "Relay.start": 5,
        "Relay._send": 5,
    }
