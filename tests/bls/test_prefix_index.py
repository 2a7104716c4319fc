"""The router's prefix index (bls/prefix_index.py): chained block hashes per replica,
salted per tenant, bounded with LRU eviction that keeps what remains a prefix."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bls.prefix_index import (
    MEMO_BYTES_BOUND,
    MEMO_CHARS,
    MEMO_ENTRIES,
    PrefixIndex,
    prompt_key,
)

SYSTEM = "You are a careful assistant. Answer briefly and cite the manual. " * 16


def text(*blocks: str, size: int = 8) -> str:
    """Whole blocks of `size` characters, one per argument (padded with dots)."""
    return "".join(b.ljust(size, ".")[:size] for b in blocks)


def conversation(n: int, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"conversation {n} question {t}"},
            {"role": "assistant", "content": f"answer {t} for {n} " * 3},
        ]
    return messages


def test_a_next_turn_key_extends_the_previous_turn_key():
    first, second = conversation(1, 1), conversation(1, 2)
    assert prompt_key(None, second).startswith(prompt_key(None, first))
    assert prompt_key("plain text", None) == "plain text"
    # non-text content (image parts) still keys deterministically
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert prompt_key(None, parts) == prompt_key(None, [dict(parts[0])])


def test_only_full_blocks_are_hashed_and_the_prompt_cap_holds():
    index = PrefixIndex(block_chars=8, max_prompt_blocks=3)
    assert index.block_hashes("x" * 7) == []
    assert len(index.block_hashes("x" * 17)) == 2
    assert len(index.block_hashes("x" * 800)) == 3


def test_a_match_is_a_prefix_match():
    index = PrefixIndex(block_chars=8)
    index.insert("r0", index.block_hashes(text("sys", "turn1", "reply1")))
    assert index.match(index.block_hashes(text("sys", "turn1", "other"))) == {"r0": 2}
    # the same block after a different first block is another prefix: no match at all
    assert index.match(index.block_hashes(text("other", "turn1", "reply1"))) == {"r0": 0}
    assert index.match(index.block_hashes(text("sys")), ["r0", "r1"]) == {"r0": 1, "r1": 0}


def test_tenants_with_different_salts_never_match_each_other():
    index = PrefixIndex(block_chars=8)
    prompt = text("shared", "system", "prompt", "question")
    index.insert("r0", index.block_hashes(prompt, "salt-of-acme"))
    assert index.match(index.block_hashes(prompt, "salt-of-acme")) == {"r0": 4}
    assert index.match(index.block_hashes(prompt, "salt-of-globex")) == {"r0": 0}
    assert index.match(index.block_hashes(prompt, None)) == {"r0": 0}  # unsalted: shared


def test_eviction_is_least_recently_routed_first():
    """Two generations of 4 blocks: a full young generation becomes the old one, and the
    old one is forgotten, except what was routed again since (a)."""
    index = PrefixIndex(block_chars=8, max_blocks_per_replica=8)
    a, b, c = (index.block_hashes(text(f"{n}1", f"{n}2")) for n in "abc")
    for prompt in (a, b, c):
        index.insert("r0", prompt)
    index.insert("r0", a)  # a routed again: b is now the oldest
    index.insert("r0", index.block_hashes(text("d1", "d2")))
    assert index.match(a)["r0"] == 2 and index.match(c)["r0"] == 2
    assert index.match(b)["r0"] == 0
    assert index.sizes() == {"r0": 6} and index.evicted == 2


def test_a_next_turn_records_only_the_blocks_its_replica_lacks():
    index = PrefixIndex(block_chars=8, max_blocks_per_replica=100)
    first = index.block_hashes(text("system", "turn1"))
    index.insert("r0", first)
    young = index._replicas["r0"].young
    index.insert("r0", index.block_hashes(text("system", "turn1", "turn2")))
    assert index._replicas["r0"].young is young and index.sizes() == {"r0": 3}
    assert index.match(index.block_hashes(text("system", "turn1", "turn2", "x"))) == {"r0": 3}


def test_eviction_takes_a_prompt_from_its_tail_so_what_remains_still_matches():
    index = PrefixIndex(block_chars=8, max_blocks_per_replica=10)
    long = index.block_hashes(text(*(f"b{i}" for i in range(8))))
    index.insert("r0", long)
    assert index.match(long) == {"r0": 5}  # a generation's worth: the first five blocks
    single = PrefixIndex(block_chars=8, max_blocks_per_replica=1)
    single.insert("r0", long)
    single.insert("r0", long[:1])
    assert single.match(long) == {"r0": 1} and single.sizes() == {"r0": 1}


def test_a_dropped_replica_is_forgotten():
    index = PrefixIndex(block_chars=8)
    hashes = index.block_hashes(text("a", "b"))
    index.insert("r0", hashes)
    index.insert("r1", hashes)
    assert index.drop_replica("r1") == 2
    assert index.match(hashes) == {"r0": 2}
    assert index.drop_replica("r1") == 0


def test_the_memory_bound_holds_after_ten_thousand_conversations():
    """10,000 three-turn conversations over two replicas into an index bounded at 4,096
    blocks per replica: the block count never passes the bound, and the memory the index
    holds stays under its documented bytes bound. Each conversation's last turn is
    recorded (its earlier turns are prefixes of it: the same blocks)."""
    index = PrefixIndex(max_blocks_per_replica=4_096)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(10_000):
            replica = f"r{n % 2}"
            index.insert(
                replica, index.block_hashes(prompt_key(None, conversation(n, 3)), f"tenant-{n % 3}")
            )
            assert index.sizes()[replica] <= 4_096
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # eviction ran: each record holds at least its young generation and at most the bound
    assert index.bound_blocks(2) // 4 <= index.blocks() <= index.bound_blocks(2)
    assert index.evicted > 10_000
    assert held <= index.bound_bytes(2), (held, index.bound_bytes(2))


@pytest.mark.parametrize(
    "bad", [{"block_chars": 0}, {"max_blocks_per_replica": 0}, {"max_prompt_blocks": 0}]
)
def test_sizes_below_one_are_refused(bad):
    with pytest.raises(ValueError, match="at least 1"):
        PrefixIndex(**bad)


class Reference:
    """The index as plainly as it can be written: two lists per replica (young, old), a
    prompt's missing blocks walked one by one into the young one, the old one forgotten
    when the young one would pass half the bound, and a match that walks the prompt."""

    def __init__(self, bound):
        self.half, self.keeps_old = max(1, bound // 2), bound >= 2
        self.young, self.old = {}, {}

    def insert(self, replica, hashes):
        young = self.young.setdefault(replica, [])
        old = self.old.setdefault(replica, [])
        new = [block for block in hashes if block not in young]
        if len(young) + len(new) > self.half:
            self.old[replica] = young if self.keeps_old else []
            young = self.young[replica] = []
            old = self.old[replica]
            new = list(hashes[: self.half])
        young.extend(new)
        self.old[replica] = [block for block in old if block not in new]

    def match(self, hashes, replica):
        count = 0
        for block in hashes:
            held = self.young.get(replica, []) + self.old.get(replica, [])
            if block not in held:
                break
            count += 1
        return count

    def size(self, replica):
        return len(self.young.get(replica, [])) + len(self.old.get(replica, []))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["r0", "r1"]), st.lists(st.sampled_from("abc"), min_size=1, max_size=6)
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(min_value=1, max_value=20),  # from 8 on, eviction drops several at once
)
def test_the_binary_search_match_agrees_with_a_walk_under_any_history(routes, bound):
    """Prompts are short words over 3 letters, so they share prefixes often; whatever was
    routed and evicted, the index's match equals the walk of the reference."""
    index, reference = PrefixIndex(block_chars=1, max_blocks_per_replica=bound), Reference(bound)
    for replica, word in routes:
        hashes = index.block_hashes("".join(word))
        index.insert(replica, hashes)
        reference.insert(replica, hashes)
        for _, probe in routes:
            probe_hashes = index.block_hashes("".join(probe))
            matched = index.match(probe_hashes, ["r0", "r1"])
            assert matched == {r: reference.match(probe_hashes, r) for r in ("r0", "r1")}
        sizes = index.sizes()
        assert all(sizes[r] == reference.size(r) <= bound for r in sizes)


_content = st.one_of(
    st.text(alphabet="ab\u00e9\u4e2d ", max_size=40),
    st.lists(
        st.dictionaries(st.sampled_from(["type", "text"]), st.text(alphabet="xy", max_size=5)),
        max_size=2,
    ),
)
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", 7]), "content": _content}
    ),
    st.fixed_dictionaries({"content": _content}),  # no role at all
    st.just("not a message"),
)


def plain_chain(key, scope, size, cap):
    """The chain as the design writes it, with no memo: hash((previous, block text))."""
    running, out = hash(("trident-prefix", scope)), []
    for start in range(0, min(len(key) // size, cap) * size, size):
        running = hash((running, key[start : start + size]))
        out.append(running)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.lists(_message, max_size=5), st.text(alphabet="ab\x1e\x1f\u00e9", max_size=60)
            ),
            st.sampled_from([None, "salt-a", "salt-b"]),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=20),  # from 8 on, eviction drops several at once
)
def test_the_memo_never_changes_a_chain(prompts, size, cap):
    """Whatever the prompt (chat messages with odd roles, non-text content and entries
    that are no message; or plain text with separators anywhere), the salt and the sizes,
    and whatever the memo met before (the same first record under another salt, or
    followed by other text), the hashes are the plain chain's: the memo saves work,
    never changes an answer."""
    index = PrefixIndex(block_chars=size, max_prompt_blocks=cap)
    for prompt, scope in prompts + prompts:  # the second pass hits the memo
        if isinstance(prompt, str):
            assert index.block_hashes(prompt, scope) == plain_chain(prompt, scope, size, cap)
            continue
        key = prompt_key(None, prompt)
        assert index.prompt_hashes(None, prompt, scope) == plain_chain(key, scope, size, cap)


def test_a_tenant_never_gets_another_tenants_memoized_system_prompt():
    index = PrefixIndex(block_chars=8)
    messages = conversation(1, 2)
    acme = index.prompt_hashes(None, messages, "salt-of-acme")
    assert index._memo  # the system prompt is memoized
    globex = index.prompt_hashes(None, messages, "salt-of-globex")
    assert globex != acme
    assert globex == plain_chain(prompt_key(None, messages), "salt-of-globex", 8, 512)


def test_the_memo_stays_inside_its_bound_under_ten_thousand_distinct_first_messages():
    """Every conversation opens with its own first message (no shared system prompt):
    the memo empties itself at its limits, and the memory it holds (tracemalloc; the
    texts it keeps alive included, as each request's are made and dropped here) stays
    under MEMO_BYTES_BOUND."""
    index = PrefixIndex()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(10_000):
            messages = [{"role": "user", "content": f"question {n}: " + "why? " * (n % 300)}]
            index.prompt_hashes(None, messages, "salt")
            assert len(index._memo) <= MEMO_ENTRIES and index._memo_chars <= MEMO_CHARS
        del messages
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < held <= MEMO_BYTES_BOUND, (held, MEMO_BYTES_BOUND)


def _gc_walk() -> int:
    """What a full collection of the cyclic GC visits: the references of every object it
    tracks (the walk a gen-2 collection makes, with one cache miss per block it reaches)."""
    gc.collect()
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def test_the_garbage_collector_never_walks_the_recorded_blocks():
    """12,000 blocks recorded over two replicas, through a generation turnover: the GC's
    walk grows by the few objects the index is made of, not by its blocks. (It walked
    every block when the generations were sets: a collection inside a decision was its
    p99, bench/prefix_decision.py.)"""
    index = PrefixIndex(block_chars=8, max_blocks_per_replica=8_192)
    prompts = [text(*(f"{n}-{b}" for b in range(60))) for n in range(200)]
    hashes = [index.block_hashes(p, "tenant") for p in prompts]
    before = _gc_walk()
    for n, blocks in enumerate(hashes):
        index.insert(f"r{n % 2}", blocks)
    grown = _gc_walk() - before
    assert index.blocks() == 12_000  # 6,000 a replica: past one 4,096-block generation
    assert grown < 100, grown
