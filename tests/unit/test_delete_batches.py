"""How the sweep DAG orders deletes before cutting them into batches (``interleaved``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reaper.model import Action, Decision
from reaper.sweep.factory import interleaved
from tests.builders import D, inst


def _deletes(projects: list[str]) -> list[Decision]:
    return [
        Decision("gce", inst(project=p, hb_age=D), Action.DELETE, "heartbeat_stale", "heartbeat_stale")
        for p in projects
    ]


def test_takes_scopes_in_turns() -> None:
    out = interleaved(_deletes(["a", "a", "a", "b", "c", "c"]))
    assert [d.resource.project for d in out] == ["a", "b", "c", "a", "c", "a"]


@given(st.lists(st.sampled_from("abcde"), max_size=60))
def test_a_permutation_that_keeps_each_scopes_order_and_balances_every_prefix(projects: list[str]) -> None:
    deletes = _deletes(sorted(projects))
    out = interleaved(deletes)
    assert sorted(id(d) for d in out) == sorted(id(d) for d in deletes)
    for scope in set(projects):
        assert [d for d in out if d.resource.project == scope] == [d for d in deletes if d.resource.project == scope]
    total = {p: projects.count(p) for p in set(projects)}
    for k in range(len(out) + 1):
        taken = {p: sum(1 for d in out[:k] if d.resource.project == p) for p in total}
        unfinished = [taken[p] for p in total if taken[p] < total[p]]
        # no scope that still has deletes left is more than one turn behind any other
        assert not unfinished or max(taken.values()) - min(unfinished) <= 1
