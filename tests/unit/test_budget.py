"""docs/design.md §4: the staleness budget both targets apply, at its boundaries.

The policy tests (test_policy_gce, test_policy_k8s) show a tripped budget holding a scope's
deletes; these pin the thresholds themselves, each on both sides of its edge.
"""

from __future__ import annotations

from typing import cast

import pytest

from reaper.model import Override
from reaper.policy.budget import budget_hold, budget_tripped
from reaper.vocabulary import Reason
from tests.builders import settings

DEFAULT = settings()  # budget.min_stale 3, budget.max_stale_fraction 0.5
OVERRIDE = Override("writer outage fixed", "alice", frozenset({("gce", "p1")}))


def test_the_defaults_are_the_documented_ones() -> None:
    # The boundary cases below are written against these values.
    assert (DEFAULT.budget.min_stale, DEFAULT.budget.max_stale_fraction) == (3, 0.5)


@pytest.mark.parametrize(
    ("stale", "total", "tripped"),
    [
        (3, 5, True),  # over the fraction, at min_stale
        (2, 2, False),  # all stale, but one under min_stale
        (3, 3, True),  # exactly min_stale, all stale
        (3, 6, False),  # exactly at the fraction: the fraction is strict
        (4, 7, True),  # just over the fraction
        (3, 7, False),  # just under the fraction
        (0, 0, False),  # an empty scope
        (0, 5, False),
    ],
)
def test_default_thresholds(stale: int, total: int, tripped: bool) -> None:
    assert budget_tripped(stale, total, DEFAULT) is tripped


@pytest.mark.parametrize(
    ("min_stale", "fraction", "stale", "total", "tripped"),
    [
        (1, 0.2, 1, 4, True),  # 0.25 > 0.2
        (1, 0.2, 1, 5, False),  # 0.2 is not over 0.2
        (5, 0.2, 4, 4, False),  # min_stale from config, not the default 3
        (5, 0.2, 5, 5, True),
        (0, 0.0, 1, 5, True),  # any stale instance trips a zero fraction
        (0, 0.0, 0, 5, False),  # ...but none does not, although 0 >= min_stale
        (0, 0.0, 0, 0, False),  # an empty scope never trips (and never divides by zero)
        (0, 1.0, 5, 5, False),  # a fraction of 1 never trips: nothing is over all of them
    ],
)
def test_thresholds_follow_config(min_stale: int, fraction: float, stale: int, total: int, tripped: bool) -> None:
    config = settings(budget={"min_stale": min_stale, "max_stale_fraction": fraction})
    assert budget_tripped(stale, total, config) is tripped


def test_a_tripped_budget_holds_the_scope() -> None:
    assert budget_hold(3, 5, DEFAULT, None, "gce", "p1") == ((Reason.BUDGET_EXCEEDED,), ())


def test_an_override_records_the_tripped_budget_as_overridden() -> None:
    assert budget_hold(3, 5, DEFAULT, OVERRIDE, "gce", "p1") == ((), (Reason.BUDGET_EXCEEDED,))


@pytest.mark.parametrize(("target", "scope"), [("gce", "p2"), ("k8s", "p1")])
def test_an_override_lifts_the_hold_only_in_the_scopes_it_names(target: str, scope: str) -> None:
    # Another project, or a cluster of the same name: the hold stands.
    assert budget_hold(3, 5, DEFAULT, OVERRIDE, target, scope) == ((Reason.BUDGET_EXCEEDED,), ())


def test_an_override_names_its_scopes() -> None:
    with pytest.raises(ValueError, match="override_scopes"):
        Override("writer outage fixed", "alice", frozenset())


@pytest.mark.parametrize("override", [None, OVERRIDE])
def test_a_budget_not_tripped_neither_holds_nor_is_overridden(override: Override | None) -> None:
    assert budget_hold(3, 6, DEFAULT, override, "gce", "p1") == ((), ())


def test_the_hold_is_named_as_the_verdicts_and_alerts_know_it() -> None:
    assert cast(str, Reason.BUDGET_EXCEEDED) == "budget_exceeded"
