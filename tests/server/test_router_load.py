"""The router under load against a real tritonserver: deploy/examples/cpu-fallback.yaml
(`primary` and `backup`, vLLM on the CPU with max_num_seqs 16, behind `router` with 32 in
flight per backend): the session's fallback_server (tests/server/conftest.py).

A cancel storm (streams cancelled as soon as their first chunk arrives) and an overload
(more streams than the engines run at once, so half of them queue inside vLLM) must end
every stream with text or a reason, leave no request in flight, never open a breaker
and never call a busy backend dead. Every wait polls with a bounded deadline.
"""

from __future__ import annotations

import threading
import time

import pytest

from bls import control
from tests.helpers import metric_value, wait_for
from tests.helpers.streams import ENDLESS, Stream, generate

# A stream quiet this long gets its backend health-probed.
SILENCE_PROBE_S = control.SILENCE_PROBE_S

pytestmark = [pytest.mark.server, pytest.mark.vllm]

BACKENDS = ("primary", "backup")
FIRST_CHUNK_S = 90  # generous: queued streams wait for a slot on 2 busy cores


@pytest.fixture(scope="module")
def server(fallback_server):
    return fallback_server


def metric(server, name, **labels):
    return metric_value(server.metrics_url, name, **labels)


def breaker_states(server):
    return {b: metric(server, "trident_router_breaker_state", backend=b) for b in BACKENDS}


def settled(server):
    """Nothing in flight on either backend, both breakers closed."""
    wait_for(
        lambda: all(metric(server, "trident_requests_in_flight", model=b) == 0 for b in BACKENDS),
        60,
        interval_s=0.5,
    )
    assert breaker_states(server) == {"primary": 0, "backup": 0}


def first_chunk_or_reason(stream: Stream, timeout_s: float) -> str:
    """'text' when the first text arrived, 'error: ...' when the router said why not."""
    deadline = time.monotonic() + timeout_s
    while not stream.texts and not stream.errors and stream.finals == 0:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "a stream got neither text nor an error (hang)"
        result, error, at = stream.events.get(timeout=remaining)
        stream._absorb(result, error, at)
    if stream.texts:
        return "text"
    return "error: " + (stream.errors[0] if stream.errors else "final without text")


def storm_round(server, streams: int) -> list[str]:
    """`streams` concurrent streams, each cancelled by its client after the first chunk."""
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(i):
        stream = Stream(
            server, prompt=f"Tell me story number {i}.", max_tokens=200, sampling=ENDLESS
        )
        try:
            outcome = first_chunk_or_reason(stream, FIRST_CHUNK_S)
        except AssertionError as e:
            outcome = f"hang: {e}"
        finally:
            stream.close(cancel=True)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FIRST_CHUNK_S + 30)
    assert len(outcomes) == streams, "a client thread never finished"
    return outcomes


def test_cancel_storm_leaves_the_router_healthy(server):
    for round_ in range(3):
        outcomes = storm_round(server, 32)
        hangs = [o for o in outcomes if o.startswith("hang")]
        errors = [o for o in outcomes if o.startswith("error")]
        assert not hangs, hangs
        # 32 streams fit the router's limit (32 per backend): every one gets text.
        assert not errors, f"round {round_ + 1}: {errors[:3]}"
        settled(server)
    after = generate(server, max_tokens=4)
    assert after.served_by == {"primary"} and not after.errors
    assert server.http_get("/v2/models/router/ready") == 200


def router_log_lines(server, *needles: str) -> list[str]:
    """The server log's lines that mention any of `needles` (why a breaker moved)."""
    text = server.log_path.read_text(errors="replace") if server.log_path else ""
    return [line for line in text.splitlines() if any(n in line for n in needles)][-10:]


def test_overload_queues_in_the_engine_and_never_opens_a_breaker(server):
    """64 clients stream back to back for 20 s: 32 on each backend, 16 running and 16
    queued in vLLM. The queued ones once held every server thread of BLS, so aborts and
    health probes went unanswered and busy backends were called dead. Busy is not dead.

    48-token answers keep a queued stream silent for ~14 s on `primary` here: far past
    the router's health-probe period (2 s), well inside first_token_timeout_s (30 s). A
    queued stream past that limit is cut off by design (a hung engine looks the same),
    and 96-token answers had brought the wait to 27.5 s, too close on a slower box."""
    duration_s, clients = 20.0, 64
    outcomes: list[str] = []
    silences: list[float] = []  # send to first text, per served stream
    breaker_seen: list[dict] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client(i):
        while time.monotonic() < stop_at:
            stream = Stream(server, prompt=f"Count to {i}.", max_tokens=48, sampling=ENDLESS)
            try:
                finished = stream.pump(FIRST_CHUNK_S + 30)
            finally:
                stream.close(cancel=True)
            with lock:
                if stream.chunk_times:
                    silences.append(stream.chunk_times[0] - stream.started)
                outcomes.append(
                    "hang"
                    if not finished
                    else f"error: {stream.errors[0]}"
                    if stream.errors
                    else "served"
                )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        breaker_seen.append(breaker_states(server))
        time.sleep(1.0)
    served = outcomes.count("served")
    errors = [o for o in outcomes if o != "served"]
    assert "hang" not in outcomes
    assert not [e for e in errors if "health probe" in e], errors[:3]
    # Only shedding may refuse a request; nothing here exceeds the limits.
    assert not [e for e in errors if not e.startswith("error: overloaded")], errors[:3]
    assert served >= clients, f"only {served} of {len(outcomes)} served"
    # The premise: queued streams stayed silent long enough to be health-probed.
    assert max(silences) > 2 * SILENCE_PROBE_S, (
        f"longest wait for a first token {max(silences):.1f} s"
    )
    opened = [state for state in breaker_seen if state != {"primary": 0, "backup": 0}]
    assert not opened, (
        f"breaker states {opened[:3]}; longest wait for a first token "
        f"{max(silences):.1f} s; router log: "
        f"{router_log_lines(server, 'circuit breaker', 'falling back')}"
    )
    settled(server)
