"""The SGLang double's radix cache (support/fake_sglang.PrefixTree): the longest shared
prefix of a prompt, held within the pool's size, however many requests came before."""

from __future__ import annotations

from support.fake_sglang import DEFAULT_MAX_TOTAL_TOKENS, Engine, PrefixTree


def test_the_longest_shared_prefix_of_any_held_sequence_is_found():
    tree = PrefixTree(100)
    tree.insert("sys a b c".split())
    tree.insert("sys x y".split())
    assert tree.shared("sys a b z".split()) == 3
    assert tree.shared("sys x y z".split()) == 3
    assert tree.shared("sys a b c d".split()) == 4
    assert tree.shared("other".split()) == 0
    assert tree.size == 6  # "sys" is held once


def test_a_sequence_that_would_pass_the_capacity_drops_the_tree_first():
    tree = PrefixTree(8)
    tree.insert("a b c d e".split())
    tree.insert("a b c d e f".split())  # one token more: fits
    assert tree.size == 6
    tree.insert("p q r".split())  # 6 + 3 > 8: forget, then hold this one
    assert tree.size == 3
    assert tree.shared("a b".split()) == 0 and tree.shared("p q r".split()) == 3


def test_many_requests_stay_within_the_pool():
    tree = PrefixTree(1000)
    for i in range(5000):
        tree.insert(["sys", "prompt", f"turn{i}", "w1", "w2"])
        assert tree.size <= 1000
    assert tree.shared(["sys", "prompt", "turn4999", "w1"]) == 4


def test_the_engine_sizes_its_tree_by_max_total_tokens():
    assert Engine(model_path="/m")._radix.capacity == DEFAULT_MAX_TOTAL_TOKENS
    assert Engine(model_path="/m", max_total_tokens=4096)._radix.capacity == 4096
