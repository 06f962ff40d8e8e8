"""The staleness budget (docs/design.md §4), shared by both targets.

Many stale heartbeats (or orphaned runs) in one scope at once are more likely a
broken writer than a broken fleet, so past the budget the scope's deletes are
held. Both targets apply the same thresholds and the same override rule, so
they live here rather than in either target's module.
"""

from __future__ import annotations

from reaper.config import Settings
from reaper.model import Override
from reaper.vocabulary import Reason


def budget_tripped(stale: int, total: int, config: Settings) -> bool:
    """Whether ``stale`` of ``total`` is over the budget: at least ``budget.min_stale`` and
    strictly more than ``budget.max_stale_fraction`` of the total.

    Both thresholds must be passed: ``min_stale`` keeps a small scope (two instances, one
    stale) from tripping on every sweep; the fraction is strict, so exactly at it does not trip.
    """
    budget = config.budget
    return total > 0 and stale >= budget.min_stale and stale / total > budget.max_stale_fraction


def budget_hold(
    stale: int, total: int, config: Settings, override: Override | None, target: str, scope: str
) -> tuple[tuple[Reason, ...], tuple[Reason, ...]]:
    """The budget's part of ``scope``'s verdict: (holds, overridden), each empty or ``("budget_exceeded",)``.

    An override (a manual trigger with a reason) lifts this hold and no other, and only in the
    scopes it names (docs/design.md §6): the tripped budget is then recorded as overridden, so the
    report still says it tripped. In a scope it does not name, the hold stands.
    """
    if not budget_tripped(stale, total, config):
        return (), ()
    lifted = override is not None and override.lifts(target, scope)
    return ((), (Reason.BUDGET_EXCEEDED,)) if lifted else ((Reason.BUDGET_EXCEEDED,), ())
