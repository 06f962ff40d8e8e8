"""The ``approval`` param of a sweep: checked with the other params, claimed by one execution, reported per item.

An approval (:mod:`reaper.approvals`) is given for the items an operator reviewed, in the state they were
reviewed in; the policy lets through only those (:mod:`reaper.policy.approval`). Here it is bound to one
execution, as an override is (docs/design.md §6, "a plan belongs to one execution"): ``evaluate_policy`` claims
it in the ledger (atomically, only when unused or claimed by this same execution: a retried task) before it
plans a single delete under it, and a cleared task, a re-run or a second run naming it fails with the
execution that used it, deleting nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec
from airflow.sdk.exceptions import AirflowFailException

from reaper.approvals import Approval, Standing, problem, used_elsewhere
from reaper.model import Action, Plan
from reaper.records import ApprovalUse, ItemResult
from reaper.sweep.params import param_text

if TYPE_CHECKING:
    from reaper.ledger import Ledger
    from reaper.sweep.steps import Execution, Ids

PLANNED = "planned"  # an approved item the plan deletes (its outcome replaces this in the summary)
NOT_LISTED = "not_listed"  # an approved item this sweep did not list: gone, or in a scope it did not sweep


def wanted(params: Mapping[str, object]) -> str:
    """The approval id a run's params name, trimmed; "" for none (the form's cleared field sends null)."""
    return param_text(params, "approval")


def check_form(params: Mapping[str, object]) -> None:
    """``resolve_scopes``'s first check, of the params alone: one clear message naming the param and what was
    expected. ``approval`` is a sweep's one tool for held deletes: not beside ``override_budget`` (the blunt one)
    nor a ``max_deletions`` (the approval's cap is its item count)."""
    if not wanted(params):
        return
    if params.get("override_budget"):
        raise AirflowFailException(
            "params.approval: expected either approval (the reviewed items) or override_budget (every held delete "
            "of the scopes named), not both"
        )
    if params.get("max_deletions") is not None:
        raise AirflowFailException(
            "params.max_deletions: expected null with approval: an approval's cap is the number of its items"
        )


def check_param(sweep: Execution, params: Mapping[str, object], ledger: Ledger) -> None:
    """``resolve_scopes``'s check in the ledger, before the lease is taken: the approval exists, is of this DAG,
    unexpired, and unused by another execution."""
    if name := wanted(params):
        read(sweep, name, ledger, time.time())


def read(sweep: Execution, name: str, ledger: Ledger, now: float) -> Approval:
    """The approval ``name`` if this run may use it now (:func:`reaper.approvals.problem`), else the param error."""
    found = ledger.approval(name)
    approval = msgspec.convert(found, Approval) if found is not None else None
    ids = sweep.ids
    why = problem(approval, name, ids.dag_id, sweep.target.name, now) or (
        approval and used_elsewhere(approval, ids.dag_id, ids.run_id, ids.execution)
    )
    if why or approval is None:
        raise AirflowFailException(f"params.approval: {why}")
    return approval


def take(sweep: Execution, params: Mapping[str, object], ledger: Ledger, ids: Ids, claim: bool) -> Approval | None:
    """The run's approval for ``evaluate_policy``, claimed by this execution (``ids``) when ``claim`` (a plan that
    may delete: no dry run, no inputs another execution read); None without one.

    Checked again as at ``resolve_scopes`` (it may have expired, or been used, since); the claim is the atomic
    step: a cleared or re-run task, or a second run, finds it used by another execution and fails here, before
    a single decision is recorded under it.
    """
    name = wanted(params)
    if not name:
        return None
    approval = read(sweep, name, ledger, time.time())
    if claim and ledger.claim_approval(name, ids.fields()) is None:
        read(sweep, name, ledger, time.time())  # revoked or used by another execution since: says so
        why = (
            f"approval {name!r} was used by an earlier sweep lease of this execution (a cleared task); an approval is "
            "used by one execution only: expected a new approval of what is still held"
        )
        raise AirflowFailException(f"params.approval: {why}")
    return approval


def withdrawn(name: str, ledger: Ledger, target: str, ids: Mapping[str, object]) -> str:
    """Why the approval ``name`` no longer stands (revoked, or no longer in the ledger: deleted by hand, nothing
    proves it stands; unreadable, or no longer the approval of ``target`` that the execution ``ids`` claimed:
    edited by hand, nothing proves it either), or empty while it does. Whatever time a revocation carries (an
    operator's clock ahead, a value no clock gives), revoked is revoked. Not the items
    (:class:`reaper.approvals.Standing`): a batch reads this every half second, and the claim read them."""
    found = ledger.revocation(name)
    if found is None:
        return "gone from the ledger"
    try:
        standing = msgspec.convert(found, Standing)
    except msgspec.ValidationError as exc:
        return f"unreadable in the ledger ({exc})"
    used = standing.used_by
    claimed = (standing.id, standing.target, standing.dag_id, used.dag_id, used.run_id, used.execution, used.lease)
    if claimed != (name, target, ids["dag_id"], ids["dag_id"], ids["run_id"], ids["execution"], ids["lease"]):
        return "no longer the approval this execution claimed (edited in the ledger)"
    revoked = standing.revoked
    return f"revoked by {revoked.user}: {revoked.reason}" if revoked is not None else ""


def summary(approval: Approval, plan: Plan, configured_cap: int, claimed: bool) -> ApprovalUse:
    """The summary's record of the approval: who gave it and why, its cap (its item count; above
    ``max_deletions_per_sweep`` is recorded), and per approved item what the plan made of it."""
    decided = {(d.scope, d.resource.uid): PLANNED if d.action is Action.DELETE else d.reason for d in plan.recorded}
    for _, reason, group in plan.kept:  # plain keeps (a fresh heartbeat, a protected scope), without a Decision each
        decided.update({(r.scope, r.uid): reason for r in group})
    results = [
        ItemResult(**msgspec.structs.asdict(item), state=decided.get((item.scope, item.uid), NOT_LISTED))
        for item in approval.items
    ]
    return ApprovalUse(
        id=approval.id,
        user=approval.user,
        reason=approval.reason,
        expires_at=approval.expires_at,
        from_run=approval.run_id,
        items=len(approval.items),
        max_deletions=len(approval.items),
        above_cap=len(approval.items) > configured_cap,
        claimed=claimed,
        results=results,
    )


def with_outcomes(record: ApprovalUse, outcomes: Iterable[Mapping[str, object]]) -> ApprovalUse:
    """The approval's record with each planned item's outcome (deleted, changed_since_plan, ...) in its state."""
    result = {(str(o["scope"]), str(o["uid"])): str(o["result"]) for o in outcomes}
    items = [
        msgspec.structs.replace(r, state=result.get((r.scope, r.uid), r.state)) if r.state == PLANNED else r
        for r in record.results
    ]
    return msgspec.structs.replace(record, results=items)
