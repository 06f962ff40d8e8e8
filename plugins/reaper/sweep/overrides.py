"""What a manual trigger may lift (docs/design.md §6, "Overrides"): the budget holds of the scopes it names, and
the global cap for incident recovery, each with a reason, in the run's first execution only.

``resolve_scopes`` checks the params before anything is read (:func:`check_budget_override`,
:func:`check_raised_cap`, and :func:`check_override_scopes` again once the scopes are resolved);
``evaluate_policy`` makes them an :class:`Overrides` (:func:`run_overrides`), which the policy applies
and every decision made under it carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException
from msgspec import UNSET

from reaper.config import config_path
from reaper.model import Override, Resolved
from reaper.records import OverrideRecord
from reaper.sweep.params import param_text

if TYPE_CHECKING:
    from reaper.sweep.steps import Ids
    from reaper.sweep.targets import Target


@dataclass(frozen=True)
class Overrides:
    """What a manual trigger lifts in this execution, and the ledger's record of it (None: nothing asked)."""

    budget: Override | None
    max_deletions: int
    record: OverrideRecord | None

    def stamp(self, target: str, scope: str) -> OverrideRecord | None:
        """The override record a decision in ``scope`` carries, if it was made under an applied override:
        a raised cap is global and covers every scope, a budget override the scopes it names."""
        if not self.record or self.record.applied is not True:
            return None
        if self.record.raises_cap or (self.budget is not None and self.budget.lifts(target, scope)):
            return self.record
        return None


def check_budget_override(params: dict[str, object], wanted: list[str], target: Target[Any]) -> None:
    """``override_budget`` needs ``override_reason``, and names the scopes it lifts (:func:`check_override_scopes`)."""
    if params.get("override_budget") and not param_text(params, "override_reason"):
        raise AirflowFailException("params.override_reason: expected a non-empty reason with override_budget")
    check_override_scopes(params, wanted, target)


def check_override_scopes(
    params: dict[str, object], wanted: list[str], target: Target[Any], resolved: list[Resolved] | None = None
) -> None:
    """``override_scopes`` names the scopes whose budget hold ``override_budget`` lifts (docs/design.md §6):
    some, each swept by this run (``wanted``), and only beside ``override_budget``.

    Before the scopes are resolved (``resolved`` None) only the form of the param is checked; after, each name
    must be a swept scope as configured or the id it resolved to (as the audit view shows it held).
    """
    named = override_scopes(params)
    if not params.get("override_budget"):
        if named:
            raise AirflowFailException(
                f"params.override_scopes: {named} given without override_budget; expected override_budget=true "
                "with it, or no override_scopes"
            )
        return
    if not named:
        raise AirflowFailException(
            "params.override_scopes: expected the scopes whose budget hold override_budget lifts (the audit "
            "view's scopes held on budget_exceeded), got none"
        )
    if resolved is None:
        return
    ids = {r.scope for r in resolved if not r.problem}
    outside = sorted(set(named) - set(wanted) - ids)
    if outside:
        also = f" or their ids {sorted(ids - set(wanted))}" if ids - set(wanted) else ""
        among = (
            f"params.scopes {sorted(wanted)}{also}"
            if params.get("scopes")
            else f"the configured {sorted(wanted)}{also} (config key {target.name}.{target.scope_key})"
        )
        raise AirflowFailException(
            f"params.override_scopes: {outside} are not swept by this run; expected a subset of {among}"
        )


def override_scopes(params: dict[str, object]) -> list[str]:
    """The scopes ``override_scopes`` names, each once, in order (a cleared form field sends null: none)."""
    named = params.get("override_scopes") or []
    if not isinstance(named, list) or not all(isinstance(s, str) for s in named):
        raise AirflowFailException(f"params.override_scopes: expected a list of scope names, got {named!r}")
    return list(dict.fromkeys(named))


def check_raised_cap(params: dict[str, object], configured: int) -> None:
    """``max_deletions`` is a whole number; above the configured cap (``max_deletions_per_sweep``) only with
    ``override_reason``."""
    cap = params.get("max_deletions")
    if cap is not None and (type(cap) is not int or cap < 0):
        raise AirflowFailException(f"params.max_deletions: expected a whole number >= 0 or null, got {cap!r}")
    if cap is not None and cap > configured and not param_text(params, "override_reason"):
        raise AirflowFailException(
            f"params.max_deletions: {cap} is above max_deletions_per_sweep ({configured} "
            f"in {config_path()}); expected a non-empty override_reason with it"
        )


def run_overrides(
    params: dict[str, object],
    ids: Ids,
    triggered_by: str,
    rerun: bool,
    configured: int,
    target: str,
    resolution: Sequence[Resolved] = (),
) -> Overrides:
    """What this execution's params lift, and what the ledger records about it (docs/design.md §6).

    ``override_budget`` lifts the budget holds of the scopes of ``target`` that ``override_scopes``
    names, and no other; ``max_deletions`` above the configured cap (``configured``) raises the
    global cap, for incident recovery. Both need ``override_reason`` (``resolve_scopes``
    refused them without, and the budget without its scopes) and are given for the evidence their trigger saw:
    they apply to the run's first execution only. A cleared or re-run run (``rerun``: the ledger
    holds an earlier execution of it) sees new evidence and runs without them, and records that it
    did; Airflow does not tell a task who cleared its run (its audit log does). A ``max_deletions``
    at or below the cap only lowers it: a limit, no override, kept in every execution.

    ``override_scopes`` names scopes as configured; ``resolution`` maps each to the scope the policy keys
    it by (a GCE project configured by its number is held, and lifted, under its id).
    """
    wanted = params.get("max_deletions")
    reason = param_text(params, "override_reason")
    asked = configured if wanted is None else int(wanted)  # type: ignore[call-overload]  # an int (check_form)
    lower = min(asked, configured)  # what holds in every execution, override or not
    # Raised only with a reason, checked again here: the config may have lowered the cap since resolve_scopes.
    raised = asked > configured and bool(reason)
    budget = bool(params.get("override_budget"))
    if not (budget or raised):
        return Overrides(None, lower, None)
    scope_of = {name: r.scope for r in resolution for name in (*r.configured, r.scope)}
    scopes = sorted({scope_of.get(name, name) for name in override_scopes(params)}) if budget else []
    record = partial(
        OverrideRecord,
        reason=reason,
        user=triggered_by,
        budget=budget,
        scopes=scopes if budget else UNSET,
        max_deletions=asked if raised else UNSET,
    )
    if rerun or ids.execution > 0:
        why = "the run was cleared or re-run: an override applies to its first execution only"
        return Overrides(None, lower, record(applied=False, why=why))
    lifted = Override(reason, triggered_by, frozenset((target, s) for s in scopes)) if budget else None
    return Overrides(lifted, asked, record(applied=True))
