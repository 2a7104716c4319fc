"""Tenants' prefix caches with the real vLLM (SmolLM2 on the CPU, prefix caching on).

The router gives every tenant's vLLM requests a cache_salt of its own (bls/tenants.py)
unless the tenant is listed in share_prefix_cache. vLLM reports a request's prefix-cache
hit in RequestOutput.num_cached_tokens; the vLLM model counts it into
trident_prefix_cached_tokens_total{model}, read here before and after each request (the
model adds a request's hit before its final response leaves, so the count is settled when
the client has the final flag).

erin and bob are isolated: bob's request of the prompt erin just sent hits nothing,
while erin's own repeat hits. carol and dave share: dave hits what carol cached.
"""

from __future__ import annotations

import pytest

from tests.helpers import metric_value
from tests.helpers.streams import Stream

pytestmark = [pytest.mark.server, pytest.mark.vllm]

MODEL = "smollm2"


def long_prompt(topic: str) -> str:
    """About 300 tokens, different per topic."""
    return (
        " ".join(
            f"Note {i} on {topic}: item {i} is listed after item {i - 1}." for i in range(1, 25)
        )
        + f" Summarise the notes on {topic}."
    )


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def counted(server, name: str) -> float:
    return metric_value(server.metrics_url, name, model=MODEL)


def ask(server, tenant: str, prompt: str) -> tuple[float, float]:
    """(cached tokens, prompt tokens) of one request of tenant through the router."""
    cached = counted(server, "trident_prefix_cached_tokens_total")
    prompt_tokens = counted(server, "trident_prompt_tokens_total")
    stream = Stream(server, prompt=prompt, max_tokens=2, hints={"tenant": tenant})
    try:
        assert stream.pump(120), "no final response within 120 s"
    finally:
        stream.close()
    assert not stream.errors and stream.served_by == {MODEL}, (stream.errors, stream.served_by)
    return (
        counted(server, "trident_prefix_cached_tokens_total") - cached,
        counted(server, "trident_prompt_tokens_total") - prompt_tokens,
    )


def test_isolated_tenants_do_not_hit_each_others_prefix_cache(server):
    prompt = long_prompt("rivers")
    first, tokens = ask(server, "erin", prompt)
    assert tokens >= 250 and first == 0, (first, tokens)
    assert ask(server, "bob", prompt)[0] == 0  # erin's blocks are not bob's
    again, tokens = ask(server, "erin", prompt)  # but they are erin's
    assert again >= tokens / 2, (again, tokens)


def test_tenants_sharing_the_prefix_cache_hit_each_others_prefixes(server):
    prompt = long_prompt("mountains")
    assert ask(server, "carol", prompt)[0] < 64  # at most the chat template's head
    hit, tokens = ask(server, "dave", prompt)
    assert hit >= tokens / 2, (hit, tokens)
