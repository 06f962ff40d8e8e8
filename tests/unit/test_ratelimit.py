"""The round robin that spreads rate-limited work over scopes (deleters and delete batches share it)."""

from __future__ import annotations

from reaper.ratelimit import round_robin


def test_round_robin_takes_one_of_each_scope_in_turn_keeping_their_order() -> None:
    items = ["a1", "a2", "a3", "b1", "c1", "c2"]
    assert round_robin(items, key=lambda s: s[0]) == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_round_robin_keeps_falsy_items() -> None:
    """Indexes are what the GCE deleter interleaves: index 0 must not be dropped as a filler."""
    assert round_robin(range(4), key=lambda i: i % 2) == [0, 1, 2, 3]
    assert round_robin([], key=str) == []
