"""The router's prefix index: which replica most likely still holds a prompt's KV cache.

Pure: no Triton, no clock, no I/O. The router cuts each routed prompt into fixed-size
blocks of characters and keeps, per replica, the chained hashes of the blocks it sent
there. A later prompt's blocks are looked up in the same chain order, so the number of
blocks matched on a replica is the length of the longest prefix this prompt shares with
something that replica has already been given: the part of the prompt its engine's prefix
cache can skip, if it has not evicted it since.

Why characters, not the model's tokens (docs/router.md, "Replicas and cache-aware
routing"): an engine's prefix cache keys on token blocks, and two prompts that share a
text prefix share a token prefix up to the last token before they differ, so block
boundaries in characters find the same shared prefixes at a fraction of the cost of
tokenizing every request a second time (bench/prefix_decision.py measures both). The
index is approximate either way: an engine evicts on its own, so a match is a guess.

Why the chain is seeded with the tenant's cache salt: the engines salt a tenant's cache
(vLLM folds `cache_salt` into its first block's hash), so another tenant's prefix is never
a cache hit there. Seeding the chain the same way means one tenant's blocks can never
match another's, and routing reveals nothing about what other tenants sent.

Bounded: at most `max_blocks_per_replica` blocks per replica, kept in two generations of
half that each (a two-generation approximation of LRU). A prompt's blocks go into the
young generation; when it is full, the old one is forgotten, the young one becomes old,
and a new young one starts with the prompt. A block therefore survives at least half the
bound's worth of newer blocks after it was last routed, and at most the whole bound.
Both generations always hold whole prefixes of the chains they were given, so what
remains of a prompt is always a prefix of it, and the blocks every new conversation
touches (system prompts) are always young.

Why generations and not an exact LRU order: recording a next turn then touches only the
blocks its replica's young generation lacks (a binary search finds them: ~4 new blocks
of a ~40-block turn here), where an OrderedDict needed a move_to_end per block of the
prompt, each a Python step and a linked-list relink in a 6 MiB index (~10 us a decision;
issue 23's budget for the whole decision is 50 us at p99). Forgetting a generation is
one dict dropped, not a sort or a walk.

Cheap to keep (issue 23's budget for the whole decision is 50 us at p99): the blocks of a
chat's first message, the system prompt a tenant's conversations share, are hashed once
and looked up after that (`block_hashes`' memo).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BLOCK_CHARS = 128  # ~32 tokens: a vLLM block on CPU, two on GPU
MAX_BLOCKS_PER_REPLICA = 16_384  # 2 MiB of prompt text (~500k tokens) per replica
MAX_PROMPT_BLOCKS = 512  # a prompt's first 64 KiB decide; its tail is not hashed
# Measured with tracemalloc (CPython 3.11): one recorded block costs 140-180 bytes (its
# int, a dict entry; the tables grow in doublings). The documented bound leaves headroom
# for that: 4 MiB per replica at the default size.
BYTES_PER_BLOCK_BOUND = 256
# The first-record memo (block_hashes) is emptied whenever it passes either limit. Its
# memory is apart from the records': the texts it keeps alive (at most 4 bytes a
# character), and per entry its tuples and ints (~600 bytes, and 40 a block hashed).
MEMO_ENTRIES = 4_096
MEMO_CHARS = 256 * 1024
MEMO_BYTES_BOUND = 4 * MEMO_CHARS + MEMO_ENTRIES * 600 + MEMO_CHARS // 128 * 40

_RECORD, _UNIT = "\x1e", "\x1f"  # ASCII record/unit separators: never in chat text
# A memo entry: chain hash after a first record's full blocks, its partial last block,
# and its full blocks' hashes.
_Step = tuple[int, str, tuple[int, ...]]


def prompt_key(text: str | None, messages: list[Any] | None) -> str:
    """The string the index cuts into blocks: the prompt text, or the chat messages in
    order. A conversation's next turn resends its history, so its key starts with the
    previous turn's key (a prefix, block for block)."""
    if messages is None:
        return text or ""
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            continue  # the engine rejects it; it has no prefix to share
        content = message.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True, separators=(",", ":"))
        parts.append(f"{message.get('role', '')}{_UNIT}{content}{_RECORD}")
    return "".join(parts)


class PrefixIndex:
    """Per-replica chained block hashes of routed prompts, with LRU eviction.

    Python's own `hash` keys the chain: it is randomized per process (a client cannot
    craft colliding prompts), 64 bits wide, and fast; the index lives and dies with the
    router process, so it never needs to be stable across processes."""

    def __init__(
        self,
        block_chars: int = BLOCK_CHARS,
        max_blocks_per_replica: int = MAX_BLOCKS_PER_REPLICA,
        max_prompt_blocks: int = MAX_PROMPT_BLOCKS,
    ):
        if block_chars < 1 or max_blocks_per_replica < 1 or max_prompt_blocks < 1:
            raise ValueError(
                "block_chars, max_blocks_per_replica and max_prompt_blocks must be at least 1"
            )
        self.block_chars = block_chars
        self.max_blocks_per_replica = max_blocks_per_replica
        self.max_prompt_blocks = max_prompt_blocks
        self._replicas: dict[str, _Record] = {}
        self._generation = max(1, max_blocks_per_replica // 2)  # blocks per generation
        self._keeps_old = 2 * self._generation <= max_blocks_per_replica  # not at bound 1
        self.evicted = 0
        # (salt scope, a key's first record) -> (chain hash after the record's full
        # blocks, its partial last block, its full blocks' hashes): never mutated
        self._memo: dict[tuple[str | None, str], _Step] = {}
        self._memo_chars = 0

    # -- hashing ---------------------------------------------------------------------

    def block_hashes(self, key: str, salt_scope: str | None = None) -> list[int]:
        """Chained hashes of the full blocks of `key` (a trailing partial block is left
        out, as the engines leave a partial block out of their prefix caches). Block i's
        hash covers blocks 0..i and the tenant's salt scope (None: the unsalted, shared
        cache).

        A chat key's first record (its first message: the system prompt that a tenant's
        conversations share, 1,000 tokens or more, most of a short chat's blocks) is
        looked up in a memo when it was met before, not cut and hashed again. The memo
        is keyed by the salt scope and the record's text, so one tenant's entry never
        serves another's; a key with no record separator is hashed whole."""
        cut = key.find(_RECORD) + 1
        if cut < self.block_chars:  # no first record, or shorter than a block: no gain
            return self._chain(hash(("trident-prefix", salt_scope)), key, self.max_prompt_blocks)
        first = key[:cut]
        step = self._memo.get((salt_scope, first))
        if step is None:
            seed = hash(("trident-prefix", salt_scope))
            blocks = tuple(self._chain(seed, first, self.max_prompt_blocks))
            step = (blocks[-1] if blocks else seed, first[len(blocks) * self.block_chars :], blocks)
            self._remember((salt_scope, first), step, cut)
        running, tail, blocks = step
        left = self.max_prompt_blocks - len(blocks)
        if left <= 0:
            return list(blocks[: self.max_prompt_blocks])
        return [*blocks, *self._chain(running, tail + key[cut:], left)]

    def _chain(self, running: int, key: str, limit: int) -> list[int]:
        size = self.block_chars
        count = min(len(key) // size, limit)
        hashes = []
        for start in range(0, count * size, size):
            running = hash((running, key[start : start + size]))
            hashes.append(running)
        return hashes

    def prompt_hashes(
        self, text: str | None, messages: list[Any] | None, salt_scope: str | None = None
    ) -> list[int]:
        """block_hashes of the prompt's key (prompt_key): what the router records."""
        return self.block_hashes(prompt_key(text, messages), salt_scope)

    def _remember(self, key: tuple[str | None, str], step: _Step, chars: int) -> None:
        # Emptied, not evicted one by one: it refills within a few requests, and a bound
        # this simple cannot be got wrong.
        if chars > MEMO_CHARS:
            return  # a message larger than the whole memo is not kept at all
        if len(self._memo) >= MEMO_ENTRIES or self._memo_chars + chars > MEMO_CHARS:
            self._memo.clear()
            self._memo_chars = 0
        self._memo[key] = step
        self._memo_chars += chars

    # -- lookup and record -----------------------------------------------------------

    def match(self, hashes: Sequence[int], replicas: Iterable[str] | None = None) -> dict[str, int]:
        """Blocks of this prompt's prefix each replica holds (0 where none): the longest
        run of `hashes` from the start found in that replica's record.

        A binary search, not a walk: what a replica holds of any chain is a prefix of it
        (each generation is given whole prefixes, and block i+1 never joins one without
        block i already there), so "block k is held" is true up to some k, false after.
        """
        names = self._replicas if replicas is None else replicas
        records = self._replicas
        out = {}
        for name in names:
            record = records.get(name)
            out[name] = _held(record.young, record.old, hashes) if record else 0
        return out

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        """Record that this prompt was routed to `replica`: the blocks its young
        generation lacks join it (from the first one missing: the young generation holds
        a prefix of every chain it was given, so those are all a binary search away)."""
        record = self._replicas.get(replica)
        if record is None:
            record = self._replicas[replica] = _Record()
        young = record.young
        held = _held(young, _EMPTY, hashes)
        if held == len(hashes):
            return  # nothing new, and nothing to refresh: it is young already
        new = hashes[held:]
        if len(young) + len(new) > self._generation:
            self.evicted += len(record.old)  # disjoint from the young one: all forgotten
            record.old = young if self._keeps_old else {}
            young = record.young = {}
            new = hashes[: self._generation]  # the whole chain, so the young one starts
        old = record.old  # with a prefix; a prompt longer than it keeps its head
        for block in new:
            young[block] = None
            if block in old:  # the generations stay disjoint
                del old[block]

    def drop_replica(self, replica: str) -> int:
        """Forget a replica (dead, unloaded, or restarted with an empty cache); returns
        how many blocks it held."""
        record = self._replicas.pop(replica, None)
        return len(record.young) + len(record.old) if record else 0

    # -- size ------------------------------------------------------------------------

    def sizes(self) -> Mapping[str, int]:
        """Blocks recorded per replica."""
        return {name: len(r.young) + len(r.old) for name, r in self._replicas.items()}

    def blocks(self) -> int:
        return sum(self.sizes().values())

    def bound_blocks(self, replicas: int) -> int:
        """The most blocks the index holds for `replicas` replicas."""
        return replicas * self.max_blocks_per_replica

    def bound_bytes(self, replicas: int) -> int:
        """The documented memory bound for `replicas` replicas (bench checks it)."""
        return self.bound_blocks(replicas) * BYTES_PER_BLOCK_BOUND


class _Record:
    """One replica's blocks: two disjoint generations of chained block hashes.

    Dicts of int to None, not sets, because the cyclic garbage collector never tracks a
    dict that holds only ints and None, while it tracks every set: a collection walked
    every block of every replica (16,384 ints each at the bound, one cache miss apiece),
    and a generation just started sat in the youngest GC generation, walked by the
    frequent collections too. Those walks landed inside ~1% of decisions, at the p99;
    untracked, a gen-0 collection costs half as much (docs/router.md: the p99 itself did
    not move, it is mostly the decision's own spread)."""

    __slots__ = ("young", "old")

    def __init__(self) -> None:
        self.young: dict[int, None] = {}
        self.old: dict[int, None] = {}


_EMPTY: dict[int, None] = {}


def _held(young: Mapping[int, None], old: Mapping[int, None], hashes: Sequence[int]) -> int:
    """How many of `hashes`, from the first, the two generations hold together: a binary
    search, since what they hold of a chain is always a prefix of it."""
    low, high = 0, len(hashes) if young or old else 0
    while low < high:  # the answer lies in [low, high]
        middle = (low + high + 1) // 2
        block = hashes[middle - 1]
        if block in young or block in old:
            low = middle
        else:
            high = middle - 1
    return low
