"""The routing policy, without Triton: features, rules, hints, fallback, health, affinity."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bls.policy import (
    CHARS_PER_TOKEN,
    Policy,
    RequestFeatures,
    UnknownRoute,
    estimate_tokens,
    features_from,
)
from bls.router_config import (
    BackendConfig,
    BreakerConfig,
    MatchConfig,
    RouterConfig,
    RuleConfig,
)
from builder.render.router_json import router_config
from builder.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]


def backend(family="llama", speculative=False, engine="vllm"):
    return {"engine": engine, "family": family, "tasks": [], "speculative": speculative}


def make_policy(rules=(), default=("a",), fallback=None, backends=None, short=256):
    return Policy(
        RouterConfig.from_dict(
            {
                "name": "router",
                "backends": backends or {name: backend() for name in "abcd"},
                "default": list(default),
                "rules": [
                    {"name": name, "match": match, "backends": list(bs)}
                    for name, match, bs in rules
                ],
                "fallback": fallback or {},
                "breaker": dataclasses.asdict(BreakerConfig()),  # unused by the policy
                "short_prompt_tokens": short,
                "deadline_s": 300,
                "first_token_timeout_s": 60,
                "max_inflight_per_backend": 256,
            }
        )
    )


# -- features_from ------------------------------------------------------------------------


def test_plain_text_features():
    f = features_from("x" * 9, None, {})
    assert (f.turns, f.prompt_tokens, f.shared_prefix, f.hint) == (0, 3, False, None)


def test_chat_features_count_user_turns_and_all_content():
    messages = [
        {"role": "system", "content": "s" * 4},
        {"role": "user", "content": "u" * 8},
        {"role": "assistant", "content": "a" * 4},
        {"role": "user", "content": "v" * 4},
    ]
    f = features_from(None, messages, {})
    assert f.turns == 2
    assert f.prompt_tokens == estimate_tokens(20)
    assert f.shared_prefix  # a system prompt is a prefix shared across requests


@pytest.mark.parametrize(
    "messages, hints, expected",
    [
        ([{"role": "user", "content": "hi"}], {}, False),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], {}, True),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], {}, True),
        ([{"role": "user", "content": "hi"}], {"conversation_id": "c1"}, True),
        ([{"role": "system", "content": "s"}], {"shared_prefix": "false"}, False),
        ([{"role": "user", "content": "hi"}], {"shared_prefix": "yes"}, True),
        ([{"role": "user", "content": "hi"}], {"shared_prefix": True}, True),
        ([{"role": "user", "content": "hi"}], {"shared_prefix": "0"}, False),
    ],
)
def test_shared_prefix_inferred_unless_given(messages, hints, expected):
    assert features_from(None, messages, hints).shared_prefix is expected


def test_hints_are_copied_and_empty_strings_mean_absent():
    hints = {
        "route": "r",
        "family": "f",
        "task": "t",
        "tenant": "acme",
        "tier": "gold",
        "conversation_id": "c",
    }
    f = features_from("p", None, hints)
    assert (f.hint, f.family, f.task, f.tenant, f.tier, f.conversation_id) == (
        "r",
        "f",
        "t",
        "acme",
        "gold",
        "c",
    )
    empty = features_from("p", None, {k: "" for k in hints})
    assert (
        empty.hint,
        empty.family,
        empty.task,
        empty.tenant,
        empty.tier,
        empty.conversation_id,
    ) == (None,) * 6


@given(st.integers(min_value=0, max_value=10**6))
def test_token_estimate_rounds_up(length):
    tokens = estimate_tokens(length)
    assert (tokens - 1) * CHARS_PER_TOKEN < length <= tokens * CHARS_PER_TOKEN or length == 0


# -- rules and hints ----------------------------------------------------------------------

# Each match field with a value that matches FEATURES and one that does not.
FEATURES = RequestFeatures(
    hint=None,
    family="llama",
    task="chat",
    turns=3,
    prompt_tokens=100,
    tenant="acme",
    tier="gold",
    shared_prefix=True,
)
MATCH_CASES = [
    ("family", "llama", "qwen"),
    ("task", "chat", "rag"),
    ("min_turns", 3, 4),
    ("max_turns", 3, 2),
    ("min_prompt_tokens", 100, 101),
    ("max_prompt_tokens", 100, 99),
    ("tenant", "acme", "other"),
    ("tier", "gold", "free"),
    ("shared_prefix", True, False),
]


@pytest.mark.parametrize("field, hit, miss", MATCH_CASES)
def test_each_match_field(field, hit, miss):
    policy = make_policy(rules=[("r", {field: hit}, ["b"])])
    assert policy.primary(FEATURES) == ("r", ["b"])
    policy = make_policy(rules=[("r", {field: miss}, ["b"])])
    assert policy.primary(FEATURES) == ("default", ["a"])


def test_all_fields_of_a_rule_must_match():
    policy = make_policy(rules=[("r", {"tier": "gold", "min_turns": 5}, ["b"])])
    assert policy.primary(FEATURES) == ("default", ["a"])


def test_empty_match_matches_everything():
    assert make_policy(rules=[("all", {}, ["c"])]).primary(RequestFeatures()) == ("all", ["c"])


def test_first_matching_rule_wins():
    policy = make_policy(
        rules=[("first", {"tier": "gold"}, ["b"]), ("second", {"tenant": "acme"}, ["c"])]
    )
    assert policy.primary(FEATURES) == ("first", ["b"])
    policy = make_policy(
        rules=[("second", {"tenant": "acme"}, ["c"]), ("first", {"tier": "gold"}, ["b"])]
    )
    assert policy.primary(FEATURES) == ("second", ["c"])


def test_hint_names_a_rule_regardless_of_its_match():
    policy = make_policy(rules=[("gold", {"tier": "gold"}, ["b"]), ("fast", {}, ["c"])])
    assert policy.primary(RequestFeatures(hint="gold", tier="free")) == ("gold", ["b"])


def test_hint_names_a_backend():
    policy = make_policy(rules=[("r", {}, ["b"])])
    assert policy.primary(RequestFeatures(hint="d")) == ("d", ["d"])


def test_hint_matched_by_a_rules_hint_field():
    policy = make_policy(rules=[("speedy", {"hint": "fast"}, ["c"])])
    assert policy.primary(RequestFeatures(hint="fast")) == ("speedy", ["c"])


def test_unknown_hint_names_every_valid_route():
    policy = make_policy(rules=[("gold", {}, ["b"]), ("fast", {}, ["c"])])
    with pytest.raises(UnknownRoute) as e:
        policy.primary(RequestFeatures(hint="nope"))
    message = str(e.value)
    assert "'nope'" in message
    for route in ("a", "b", "c", "d", "fast", "gold"):
        assert route in message
    assert policy.routes() == ["a", "b", "c", "d", "fast", "gold"]


def test_unknown_hint_raises_from_candidates_too():
    with pytest.raises(UnknownRoute):
        make_policy().candidates(RequestFeatures(hint="nope"))


def test_default_route_when_nothing_matches():
    policy = make_policy(rules=[("r", {"tier": "free"}, ["b"])], default=["c", "d"])
    assert policy.candidates(FEATURES) == ("default", ["c", "d"])


# -- fallback chains and health -----------------------------------------------------------


def test_fallback_chain_follows_each_primary():
    policy = make_policy(default=["a", "c"], fallback={"a": ["b"], "c": ["d"]})
    assert policy.candidates(RequestFeatures()) == ("default", ["a", "b", "c", "d"])


def test_fallback_chains_are_transitive_and_deduplicated():
    policy = make_policy(default=["a"], fallback={"a": ["b", "c"], "b": ["d", "c"]})
    assert policy.candidates(RequestFeatures())[1] == ["a", "b", "d", "c"]


def test_fallback_cycles_terminate():
    policy = make_policy(default=["a"], fallback={"a": ["b"], "b": ["a", "c"], "c": ["c"]})
    assert policy.candidates(RequestFeatures())[1] == ["a", "b", "c"]


def test_unavailable_backends_are_left_out_but_their_fallbacks_stay():
    policy = make_policy(default=["a"], fallback={"a": ["b"], "b": ["c"]})
    assert policy.candidates(RequestFeatures(), lambda n: n != "b")[1] == ["a", "c"]
    assert policy.candidates(RequestFeatures(), lambda n: n == "c")[1] == ["c"]
    assert policy.candidates(RequestFeatures(), lambda n: False)[1] == []


def test_a_pinned_backend_gets_no_fallback():
    """route: <backend> names a model: its fallback chain (another model) never answers;
    full or down, the request gets no candidate (the router answers overloaded or
    unavailable). A rule of the same routes keeps its chains."""
    policy = make_policy(rules=[("r", {}, ["a"])], default=["a"], fallback={"a": ["b"]})
    assert policy.candidates(RequestFeatures(hint="a")) == ("a", ["a"])
    assert policy.candidates(RequestFeatures(hint="a"), lambda n: n != "a") == ("a", [])
    assert policy.candidates(RequestFeatures(hint="r"))[1] == ["a", "b"]
    assert policy.candidates(RequestFeatures())[1] == ["a", "b"]
    assert policy.pinned(RequestFeatures(hint="a"))
    assert not policy.pinned(RequestFeatures(hint="r")) and not policy.pinned(RequestFeatures())


def test_a_rule_named_like_a_backend_is_a_rule():
    policy = make_policy(rules=[("a", {}, ["c"])], fallback={"c": ["d"]})
    assert policy.candidates(RequestFeatures(hint="a")) == ("a", ["c", "d"])


@settings(max_examples=200)
@given(
    fallback=st.dictionaries(
        st.sampled_from("abcd"), st.lists(st.sampled_from("abcd"), min_size=1, max_size=4)
    ),
    default=st.lists(st.sampled_from("abcd"), min_size=1, max_size=3),
    down=st.sets(st.sampled_from("abcd")),
)
def test_candidates_properties(fallback, default, down):
    """Any fallback graph: no duplicates, only healthy backends, exactly the healthy
    backends reachable from the primaries, in the unfiltered order."""
    policy = make_policy(default=default, fallback=fallback)
    _, got = policy.candidates(RequestFeatures(), lambda n: n not in down)
    assert len(got) == len(set(got))
    assert not set(got) & down
    reachable, todo = set(), list(default)
    while todo:
        name = todo.pop()
        if name not in reachable:
            reachable.add(name)
            todo.extend(fallback.get(name, ()))
    assert set(got) == reachable - down
    # health only removes entries: the order of the full list is kept
    _, everything = policy.candidates(RequestFeatures())
    assert everything[0] == default[0]
    assert got == [n for n in everything if n not in down]


# -- speculative decoding and short prompts ------------------------------------------------

SPEC_BACKENDS = {
    "spec": backend("llama", speculative=True),
    "plain": backend("llama"),
    "other": backend("qwen"),
    "spec_qwen": backend("qwen", speculative=True),
    "nofamily_spec": backend("", speculative=True),
    "nofamily": backend(""),
}


def spec_policy(default, fallback=None, short=256):
    return make_policy(default=default, fallback=fallback, backends=SPEC_BACKENDS, short=short)


def test_short_prompt_skips_speculative_when_plain_twin_is_listed():
    policy = spec_policy(["spec"], fallback={"spec": ["plain"]})
    assert policy.candidates(RequestFeatures(prompt_tokens=10))[1] == ["plain"]


def test_long_prompt_keeps_speculative():
    policy = spec_policy(["spec"], fallback={"spec": ["plain"]})
    assert policy.candidates(RequestFeatures(prompt_tokens=256))[1] == ["spec", "plain"]


def test_short_prompt_keeps_speculative_without_a_plain_equivalent():
    assert spec_policy(["spec", "other"]).candidates(RequestFeatures(prompt_tokens=1))[1] == [
        "spec",
        "other",
    ]
    # no family: nothing counts as equivalent
    assert spec_policy(["nofamily_spec", "nofamily"]).candidates(RequestFeatures(prompt_tokens=1))[
        1
    ] == ["nofamily_spec", "nofamily"]


def test_short_prompt_keeps_speculative_when_its_plain_twin_is_down():
    policy = spec_policy(["spec"], fallback={"spec": ["plain"]})
    assert policy.candidates(RequestFeatures(prompt_tokens=1), lambda n: n != "plain")[1] == [
        "spec"
    ]


def test_short_prompt_threshold_is_configurable():
    policy = spec_policy(["spec", "plain"], short=0)
    assert policy.candidates(RequestFeatures(prompt_tokens=0))[1] == ["spec", "plain"]


# -- conversation affinity ----------------------------------------------------------------


def test_affinity_is_stable_per_conversation():
    policy = make_policy(default=["a", "b", "c", "d"])
    for i in range(50):
        f = RequestFeatures(conversation_id=f"conv-{i}")
        first = policy.candidates(f)[1]
        assert sorted(first) == ["a", "b", "c", "d"]
        assert all(policy.candidates(f)[1] == first for _ in range(3))
        assert make_policy(default=["a", "b", "c", "d"]).candidates(f)[1] == first


def test_affinity_spreads_conversations():
    policy = make_policy(default=["a", "b", "c", "d"])
    starts = {policy.candidates(RequestFeatures(conversation_id=f"c{i}"))[1][0] for i in range(200)}
    assert starts == {"a", "b", "c", "d"}


def test_affinity_is_a_rotation_of_the_group():
    policy = make_policy(default=["a", "b", "c"])
    got = policy.candidates(RequestFeatures(conversation_id="x"))[1]
    i = got.index("a")
    assert got[i:] + got[:i] == ["a", "b", "c"]


def test_no_affinity_keeps_configured_order():
    assert make_policy(default=["c", "a", "b"]).candidates(RequestFeatures())[1] == ["c", "a", "b"]


# -- router_config from a parsed spec -----------------------------------------------------


def test_router_config_of_the_cpu_fallback_example():
    spec = load_spec(ROOT / "deploy" / "examples" / "cpu-fallback.yaml")
    config = router_config(spec)
    assert config.name == "router"
    assert set(config.backends) == {"primary", "backup"}
    assert config.backends["primary"] == BackendConfig(
        engine="vllm",
        family="llama",
        tasks=("chat",),
        speculative=False,
        adapters=(),
        policy="prefix_aware",
        capacity=config.backends["primary"].capacity,  # the engine's (test_repository)
    )
    assert config.default == ("primary",)
    assert config.fallback == {"primary": ("backup",)}
    assert [r.name for r in config.rules] == ["fast", "free-tier", "long-prompt", "chat"]
    assert config.rules[0] == RuleConfig(
        name="fast", match=MatchConfig(hint="fast"), backends=("backup",)
    )
    assert config.breaker.consecutive_failures == 2
    policy = Policy(config)
    assert policy.candidates(features_from("hi", None, {"route": "fast"})) == ("fast", ["backup"])
    assert policy.candidates(features_from("hi", None, {"tier": "free"})) == (
        "free-tier",
        ["backup"],
    )
    assert policy.candidates(features_from("w " * 400, None, {})) == ("long-prompt", ["backup"])
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert policy.candidates(features_from(None, chat, {})) == ("chat", ["primary", "backup"])
    assert policy.candidates(features_from("hi", None, {})) == ("default", ["primary", "backup"])


def test_router_config_carries_every_spec_field():
    spec = parse_spec(
        {
            "models": [
                {
                    "name": "m1",
                    "engine": "vllm",
                    "model": "x",
                    "family": "llama",
                    "engine_args": {"speculative_config": {"method": "ngram"}},
                },
                {"name": "m2", "engine": "vllm", "model": "y", "tasks": ["rag"]},
            ],
            "router": {
                "name": "front",
                "default": ["m2"],
                "rules": [{"match": {"min_turns": 2, "shared_prefix": True}, "backends": ["m1"]}],
                "breaker": {
                    "error_rate": 0.2,
                    "window_s": 5,
                    "min_requests": 3,
                    "consecutive_failures": 7,
                    "cooldown_s": 1.5,
                },
                "short_prompt_tokens": 64,
                "deadline_s": 9,
                "first_token_timeout_s": 2,
                "max_inflight_per_backend": 4,
            },
        },
        "<test>",
    )
    config = router_config(spec)
    assert config.name == "front"
    assert config.backends["m1"].speculative is True
    assert config.backends["m2"] == BackendConfig(
        engine="vllm", family="", tasks=("rag",), speculative=False, policy="prefix_aware"
    )
    # unnamed rules get positional names; unset match fields are left out
    assert config.rules == (
        RuleConfig(
            name="rule0",
            match=MatchConfig(min_turns=2, shared_prefix=True),
            backends=("m1",),
        ),
    )
    assert config.breaker == BreakerConfig(
        error_rate=0.2, window_s=5.0, min_requests=3, consecutive_failures=7, cooldown_s=1.5
    )
    assert (
        config.short_prompt_tokens,
        config.deadline_s,
        config.first_token_timeout_s,
        config.max_inflight_per_backend,
    ) == (64, 9.0, 2.0, 4)
    assert config.fallback == {}


def test_router_config_is_json_serialisable():
    import json

    config = router_config(load_spec(ROOT / "deploy" / "default.yaml"))
    assert RouterConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_malformed_messages_do_not_crash_routing():
    f = features_from(
        None, ["hi", {"role": "user", "content": ["x"]}, {"role": "user", "content": "abcd"}], {}
    )
    assert (f.turns, f.prompt_tokens) == (2, 1)
