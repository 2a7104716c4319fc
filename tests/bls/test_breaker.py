"""The circuit breaker as a pure state machine, driven by a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bls.breaker import CLOSED, HALF_OPEN, OPEN, STATE_VALUES, CircuitBreaker
from bls.router_config import BreakerConfig


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(**overrides):
    clock = Clock()
    config = BreakerConfig(
        **{
            "error_rate": 0.5,
            "window_s": 10.0,
            "min_requests": 4,
            "consecutive_failures": 3,
            "cooldown_s": 5.0,
            **overrides,
        }
    )
    return CircuitBreaker(config, clock), clock


def test_defaults_match_the_spec():
    config = BreakerConfig()
    assert (
        config.error_rate,
        config.window_s,
        config.min_requests,
        config.consecutive_failures,
        config.cooldown_s,
    ) == (0.05, 30.0, 20, 5, 10.0)


def test_the_spec_takes_its_breaker_defaults_from_the_router():
    from dataclasses import asdict

    from builder.spec import BreakerSpec, parse_spec

    spec = parse_spec(
        {
            "models": [{"name": "a", "engine": "vllm", "model": "/m"}],
            "router": {"default": ["a"], "breaker": {}},
        },
        "t.yaml",
    )
    assert asdict(spec.router.breaker) == asdict(BreakerSpec()) == asdict(BreakerConfig())


def test_state_gauge_values():
    assert STATE_VALUES == {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


def test_starts_closed_and_allows():
    breaker, _ = make()
    assert breaker.state == CLOSED
    assert breaker.allow() and breaker.available()


def test_consecutive_failures_open():
    breaker, _ = make(consecutive_failures=3, min_requests=100)
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == CLOSED
    breaker.record_failure()
    assert breaker.state == OPEN
    assert not breaker.allow() and not breaker.available()


def test_a_success_resets_the_consecutive_count():
    breaker, _ = make(consecutive_failures=3, min_requests=100)
    for _ in range(5):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state == CLOSED


def test_error_rate_needs_min_requests():
    breaker, _ = make(error_rate=0.5, min_requests=4, consecutive_failures=100)
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state == CLOSED  # 2/3 failed, but only 3 requests
    breaker.record_success()
    assert breaker.state == CLOSED  # 2/4 = 0.5: the last record was a success
    breaker.record_failure()
    assert breaker.state == OPEN  # 3/5 >= 0.5


def test_error_rate_below_threshold_stays_closed():
    breaker, _ = make(error_rate=0.5, min_requests=4, consecutive_failures=100)
    for _ in range(20):
        breaker.record_success()
        breaker.record_success()
        breaker.record_failure()  # 1/3 < 0.5
    assert breaker.state == CLOSED


def test_old_outcomes_leave_the_window():
    breaker, clock = make(error_rate=0.5, min_requests=4, consecutive_failures=100, window_s=10.0)
    for _ in range(2):
        breaker.record_success()
        breaker.record_success()
        breaker.record_failure()  # 1/3 then 2/6: below the rate
    assert breaker.state == CLOSED
    clock.now += 10.5  # all six are now older than the window
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state == CLOSED  # only 3 in the window: below min_requests
    breaker.record_failure()
    assert breaker.state == OPEN


def test_an_outcome_exactly_window_s_old_still_counts():
    breaker, clock = make(error_rate=0.5, min_requests=2, consecutive_failures=100, window_s=10.0)
    breaker.record_failure()
    clock.now += 10.0
    breaker.record_failure()
    assert breaker.state == OPEN


def test_cooldown_then_half_open_single_probe():
    breaker, clock = make(consecutive_failures=1, cooldown_s=5.0)
    breaker.record_failure()
    assert breaker.state == OPEN
    clock.now += 4.9
    assert not breaker.available() and not breaker.allow()
    clock.now += 0.1
    assert breaker.available()
    assert breaker.allow()  # the probe
    assert breaker.state == HALF_OPEN
    assert not breaker.available() and not breaker.allow()  # one probe at a time


def test_probe_success_closes_and_forgets_the_window():
    breaker, clock = make(consecutive_failures=1, cooldown_s=5.0, min_requests=2)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == CLOSED
    assert breaker.allow() and breaker.allow()
    breaker.record_success()  # the old failure is forgotten: 0/1 failed
    assert breaker.state == CLOSED


def test_probe_failure_reopens_for_a_full_cooldown():
    breaker, clock = make(consecutive_failures=1, cooldown_s=5.0)
    breaker.record_failure()
    clock.now += 5
    assert breaker.allow()
    clock.now += 2
    breaker.record_failure()
    assert breaker.state == OPEN
    clock.now += 4.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow() and breaker.state == HALF_OPEN


def test_released_probe_lets_the_next_one_through():
    breaker, clock = make(consecutive_failures=1, cooldown_s=1.0)
    breaker.record_failure()
    clock.now += 1
    assert breaker.allow()
    assert not breaker.allow()
    breaker.release_probe()  # e.g. the client cancelled the probe
    assert breaker.state == HALF_OPEN
    assert breaker.available() and breaker.allow()


def test_available_claims_nothing():
    breaker, clock = make(consecutive_failures=1, cooldown_s=1.0)
    breaker.record_failure()
    clock.now += 1
    for _ in range(3):
        assert breaker.available()
    assert breaker.state == OPEN
    assert breaker.allow()


# -- property test against a reference model ----------------------------------------------


class Reference:
    """The breaker's contract written out naively: keep every outcome, recount each time."""

    def __init__(self, config: BreakerConfig):
        self.c = config
        self.state, self.outcomes, self.streak = CLOSED, [], 0
        self.opened_at, self.probe = 0.0, False

    def allow(self, now):
        if self.state == OPEN and now - self.opened_at >= self.c.cooldown_s:
            self.state, self.probe = HALF_OPEN, False
        if self.state == OPEN:
            return False
        if self.state == HALF_OPEN:
            if self.probe:
                return False
            self.probe = True
        return True

    def available(self, now):
        if self.state == OPEN:
            return now - self.opened_at >= self.c.cooldown_s
        return not (self.state == HALF_OPEN and self.probe)

    def record(self, now, failed):
        self.outcomes.append((now, failed))
        recent = [f for t, f in self.outcomes if t >= now - self.c.window_s]
        self.streak = self.streak + 1 if failed else 0
        if failed:
            too_many = (
                len(recent) >= self.c.min_requests
                and sum(recent) / len(recent) >= self.c.error_rate
            )
            if self.state == HALF_OPEN or self.streak >= self.c.consecutive_failures or too_many:
                self.state, self.opened_at, self.probe = OPEN, now, False
        elif self.state == HALF_OPEN:
            self.state, self.probe, self.streak, self.outcomes = CLOSED, False, 0, []

    def release(self):
        self.probe = False


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["allow", "available", "ok", "fail", "release"]),
        st.floats(min_value=0, max_value=4, allow_nan=False),
    ),
    max_size=80,
)
CONFIGS = st.builds(
    BreakerConfig,
    error_rate=st.sampled_from([0.05, 0.25, 0.5, 1.0]),
    window_s=st.sampled_from([1.0, 5.0, 30.0]),
    min_requests=st.integers(min_value=1, max_value=6),
    consecutive_failures=st.integers(min_value=1, max_value=6),
    cooldown_s=st.sampled_from([0.5, 2.0, 10.0]),
)


@settings(max_examples=400, deadline=None)
@given(config=CONFIGS, actions=ACTIONS)
def test_matches_the_reference_model(config, actions):
    clock = Clock()
    breaker, reference = CircuitBreaker(config, clock), Reference(config)
    for action, dt in actions:
        clock.now += dt
        if action == "allow":
            assert breaker.allow() == reference.allow(clock.now)
        elif action == "available":
            assert breaker.available() == reference.available(clock.now)
        elif action == "release":
            breaker.release_probe()
            reference.release()
        else:
            failed = action == "fail"
            breaker.record_failure() if failed else breaker.record_success()
            reference.record(clock.now, failed)
        assert breaker.state == reference.state


@settings(max_examples=200, deadline=None)
@given(config=CONFIGS, actions=ACTIONS)
def test_half_open_never_grants_two_probes(config, actions):
    clock = Clock()
    breaker = CircuitBreaker(config, clock)
    granted_in_half_open = 0
    for action, dt in actions:
        clock.now += dt
        if action in ("ok", "fail", "release"):
            {
                "ok": breaker.record_success,
                "fail": breaker.record_failure,
                "release": breaker.release_probe,
            }[action]()
            granted_in_half_open = 0
        elif breaker.allow() and breaker.state == HALF_OPEN:
            granted_in_half_open += 1
            assert granted_in_half_open == 1


@pytest.mark.parametrize("failures", [1, 2, 5])
def test_n_consecutive_failures_always_open(failures):
    breaker, _ = make(consecutive_failures=failures, min_requests=1000)
    for _ in range(failures - 1):
        breaker.record_failure()
    assert breaker.state == CLOSED
    breaker.record_failure()
    assert breaker.state == OPEN
