"""How the sweep cuts deletes into batches (``cut_batches``): scopes in turns, a run never split; what fits
before the run's deadline (``fit_before_deadline``); and
which plans a delete task may run (``stale``): only its own execution's, under its lease and config."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.config import parse_settings
from reaper.model import GceInstance, K8sObject
from reaper.records import PlanRef
from reaper.sweep.deadline import fit_before_deadline
from reaper.sweep.deletes import config_digest, cut_batches, stale
from tests.builders import D, inst, obj


def _instances(projects: list[str]) -> list[GceInstance]:
    return [inst(project=p, hb_age=D) for p in projects]


def _gce_unit(r: GceInstance) -> tuple[str, str]:
    return r.project, r.id


def _run(o: K8sObject) -> tuple[str, str]:
    return o.cluster, o.labels["iterion.io/run-id"]


def test_takes_scopes_in_turns() -> None:
    out = cut_batches(_instances(["a", "a", "a", "b", "c", "c"]), 100, _gce_unit)
    assert [r.project for r in out[0]] == ["a", "b", "c", "a", "c", "a"]


def test_a_plan_within_the_size_in_every_scope_is_one_batch_however_many_scopes() -> None:
    # Ten deletes in each of 200 projects: one task sends them as fast as twenty tasks would (each scope has
    # its own rate limit, the pool runs one batch at a time), without nineteen task starts.
    planned = _instances([f"p{n:03d}" for n in range(200) for _ in range(10)])
    assert [len(b) for b in cut_batches(planned, 10, _gce_unit)] == [2000]
    assert [len(b) for b in cut_batches(planned, 4, _gce_unit)] == [800, 800, 400]  # by the turns of each scope


@given(st.lists(st.sampled_from("abcde"), max_size=60), st.integers(1, 7))
def test_every_resource_once_each_scope_in_order_every_prefix_balanced(projects: list[str], size: int) -> None:
    resources = _instances(sorted(projects))
    batches = cut_batches(resources, size, _gce_unit)
    out = [r for batch in batches for r in batch]
    assert all(n <= size for batch in batches for n in Counter(r.project for r in batch).values())
    assert sorted(r.id for r in out) == sorted(r.id for r in resources)
    for scope in set(projects):
        assert [r for r in out if r.project == scope] == [r for r in resources if r.project == scope]
    total = {p: projects.count(p) for p in set(projects)}
    for k in range(len(out) + 1):
        taken = {p: sum(1 for r in out[:k] if r.project == p) for p in total}
        unfinished = [taken[p] for p in total if taken[p] < total[p]]
        # no scope that still has deletes left is more than one turn behind any other
        assert not unfinished or max(taken.values()) - min(unfinished) <= 1


@st.composite
def runs(draw) -> list[K8sObject]:
    objects = []
    for r in range(draw(st.integers(0, 12))):
        cluster = draw(st.sampled_from(["c1", "c2"]))
        kinds = draw(st.lists(st.sampled_from(["Pod", "Secret", "NetworkPolicy"]), min_size=1, max_size=6))
        objects += [obj(kind, f"r{r}", cluster=cluster) for kind in kinds]
    return draw(st.permutations(objects))


@given(runs(), st.integers(1, 9))
def test_a_run_is_never_split_across_batches(objects: list[K8sObject], size: int) -> None:
    # Cut by count, a run's Pod could land in one batch and its Secrets in the next.
    batches = cut_batches(objects, size, _run)
    home: dict[tuple[str, str], int] = {}
    for i, batch in enumerate(batches):
        for cluster, n in Counter(o.cluster for o in batch).items():  # only a run larger than a batch
            assert n <= size or len({_run(o) for o in batch if o.cluster == cluster}) == 1
        for o in batch:
            assert home.setdefault(_run(o), i) == i, f"run {_run(o)} split across batches"
    assert sorted(o.uid for b in batches for o in b) == sorted(o.uid for o in objects)


@given(runs(), st.integers(1, 9), st.integers(1, 6))
def test_never_more_batches_than_the_most_and_still_no_run_split(
    objects: list[K8sObject], size: int, most: int
) -> None:
    batches = cut_batches(objects, size, _run, most)
    assert len(batches) <= most
    homes = [{_run(o) for o in b} for b in batches]
    assert all(a.isdisjoint(b) for i, a in enumerate(homes) for b in homes[i + 1 :]), "a run split across batches"
    assert sorted(o.uid for b in batches for o in b) == sorted(o.uid for o in objects)


@given(runs(), st.floats(0.1, 20), st.floats(-5, 5))
def test_what_fits_before_the_deadline_is_within_every_scopes_rate_in_whole_runs_and_in_plan_order(
    objects: list[K8sObject], rate: float, seconds: float
) -> None:
    fits, left = fit_before_deadline(objects, _run, rate, seconds)
    for cluster in {o.cluster for o in objects}:
        assert sum(o.cluster == cluster for o in fits) <= (1 + rate * seconds if seconds > 0 else 0)  # 1 banked
    assert {_run(o) for o in fits}.isdisjoint(_run(o) for o in left), "a run split by the deadline"
    assert sorted(o.uid for o in fits + left) == sorted(o.uid for o in objects)
    for cluster in {o.cluster for o in objects}:  # a scope's later runs never jump the queue
        order = list(dict.fromkeys(_run(o) for o in objects if o.cluster == cluster))
        kept = [r in {_run(o) for o in fits} for r in order]
        assert kept == sorted(kept, reverse=True)


def test_with_time_enough_everything_fits_and_past_the_deadline_nothing() -> None:
    planned = _instances(["a"] * 5 + ["b"] * 2)
    assert fit_before_deadline(planned, _gce_unit, 2.0, 10) == (planned, [])
    assert fit_before_deadline(planned, _gce_unit, 2.0, 1) == ([*planned[:3], *planned[5:]], planned[3:5])
    assert fit_before_deadline(planned, _gce_unit, 2.0, 0) == ([], planned)


_LOCKED_DOWN = [
    {"gce": {"protected_projects": ["ci-project-a"]}},
    {"rules": {"terminated": "off"}},
    {"max_deletions_per_sweep": 0},
    {"budget": {"min_stale": 4}},
]


@pytest.mark.parametrize("change", _LOCKED_DOWN)
def test_a_plan_made_under_another_config_is_stale(change: dict[str, object]) -> None:
    # docs/design.md §6: an operator who locks the target down between plan and delete must win.
    before = PlanRef(1, "token", config_digest(parse_settings({}, "x")))
    after = PlanRef(1, "token", config_digest(parse_settings(change, "x")))
    assert stale(before, after) == "planned under another config"


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        (PlanRef(1, "t", "c"), "planned by execution 1 of this run; this is execution 2"),
        (PlanRef(2, "other", "c"), "planned under another sweep lease than the one this task runs under"),
    ],
)
def test_a_plan_of_another_execution_or_lease_is_stale(plan: PlanRef, why: str) -> None:
    assert stale(plan, PlanRef(2, "t", "c")) == why


def test_only_the_same_execution_lease_and_config_may_run_a_plan() -> None:
    digest = config_digest(parse_settings({"gce": {"slack": "2h"}}, "x"))
    assert digest == config_digest(parse_settings({"gce": {"slack": "2h"}}, "y"))  # the source is not the config
    assert stale(PlanRef(3, "t", digest), PlanRef(3, "t", digest)) is None
