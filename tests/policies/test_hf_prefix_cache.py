"""HFPolicy's prefix cache as a data structure: longest-prefix lookup, LRU eviction under a byte budget,
superseded entries, and refusal of KV computed under older weights (no model needed)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from agentgym.policies.hf import PrefixCache  # noqa: E402

LAYERS, HEADS, DIM = 2, 1, 4
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4  # keys + values, float32


def kv(n: int, fill: float = 0.0) -> list[tuple[Any, Any]]:
    return [(torch.full((1, HEADS, n, DIM), fill), torch.full((1, HEADS, n, DIM), fill)) for _ in range(LAYERS)]


def test_lookup_finds_the_longest_shared_prefix_and_leaves_one_token() -> None:
    c = PrefixCache(10**6)
    assert c.store([1, 2, 3, 4], kv(4), c.epoch)
    assert c.store([1, 2, 9], kv(3), c.epoch)
    e, n = c.lookup([1, 2, 3, 4, 5, 6])
    assert n == 4 and e is not None and list(e.tokens) == [1, 2, 3, 4]
    e, n = c.lookup([1, 2, 9, 9])
    assert n == 3 and e is not None and list(e.tokens) == [1, 2, 9]
    e, n = c.lookup([1, 2, 3, 4])  # the whole prompt is cached: the last token is still forwarded
    assert n == 3
    assert c.lookup([7, 8]) == (None, 0)
    assert c.counters["hits"] == 3 and c.counters["reused_tokens"] == 4 + 3 + 3


def test_lru_eviction_keeps_the_cache_under_its_budget() -> None:
    c = PrefixCache(10 * BYTES_PER_TOKEN)
    assert c.store([1, 1, 1, 1], kv(4), c.epoch)
    assert c.store([2, 2, 2, 2], kv(4), c.epoch)
    c.lookup([1, 1, 1, 1, 5])  # touch the first: the second is now least recently used
    assert c.store([3, 3, 3, 3], kv(4), c.epoch)
    assert c.bytes <= c.budget_bytes and len(c) == 2 and c.counters["evicted"] == 1
    assert c.lookup([2, 2, 2, 2, 5]) == (None, 0)
    assert c.lookup([1, 1, 1, 1, 5])[1] == 4 and c.lookup([3, 3, 3, 3, 5])[1] == 4
    assert not c.store(list(range(11)), kv(11), c.epoch)  # bigger than the whole budget: never kept
    assert len(c) == 2 and c.bytes == 8 * BYTES_PER_TOKEN


def test_a_longer_turn_of_the_same_session_replaces_its_prefix() -> None:
    c = PrefixCache(10**6)
    assert c.store([1, 2, 3], kv(3), c.epoch)
    assert c.store([1, 2, 3, 4, 5], kv(5), c.epoch)  # the next turn of the same conversation
    assert len(c) == 1 and c.tokens == 5 and c.bytes == 5 * BYTES_PER_TOKEN
    assert not c.store([1, 2], kv(2), c.epoch)  # already covered by the longer entry
    assert len(c) == 1


def test_invalidate_drops_everything_and_refuses_older_kv() -> None:
    c = PrefixCache(10**6)
    old = c.epoch
    assert c.store([1, 2, 3], kv(3), old)
    c.invalidate()
    assert len(c) == 0 and c.bytes == 0 and c.lookup([1, 2, 3, 4]) == (None, 0)
    assert not c.store([1, 2, 3], kv(3), old)  # computed under the weights before the change
    assert c.store([1, 2, 3], kv(3), c.epoch)
