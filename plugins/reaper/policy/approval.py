"""A run carrying an approval deletes only what was approved, as it was reviewed (docs/design.md §6).

Applied to one target's decisions before the global cap, and after every rule: an approval never turns a keep
or a report into a delete; it only lets through a delete the budget or the cap would have held. Of the deletes
the rules planned under it (the budget lifted in the approval's scopes only:
:meth:`reaper.approvals.Approval.override`), each stays a delete only when it was approved and is listed in the
state it was approved in; every other delete is held, with its own reason:

- ``approval_expired``: the approval expired before the sweep listed (every delete of the run is held);
- ``not_approved``: not among the approved items (new since the review, or never selected);
- ``approval_changed``: approved, but listed in another state (GCE ``labelFingerprint`` and last stop and
  suspend times, Kubernetes ``resourceVersion``): a label changed since the review, a heartbeat included, or a VM
  stopped or suspended again (its status as it was); or found by another rule than the one it was reviewed under,
  or (GCE) in another status (a TERMINATED VM started since, a SUSPENDED one resumed: no label need change);
- ``approval_run_partial``: a Kubernetes object approved and unchanged whose run is not: another of the run's
  objects is changed, not approved, or approved but no longer listed. A run is deleted whole or not at all:
  deleting part of it could strip a live sandbox of its credentials or network isolation (docs/design.md §5).
"""

from __future__ import annotations

from collections import defaultdict

from reaper.approvals import Approval, ApprovedItem, fingerprint_of
from reaper.model import Action, Decision, GceInstance, K8sObject
from reaper.vocabulary import Reason


def held_unless_approved(recorded: list[Decision], approval: Approval, now: float, run_label: str) -> list[Decision]:
    """``recorded`` with every delete that ``approval`` does not cover, as listed at ``now``, held as a report."""
    approved = approval.by_key()
    why: dict[tuple[str, str], Reason] = {}
    for d in recorded:
        if d.action is not Action.DELETE:
            continue
        key = (d.scope, d.resource.uid)
        item = approved.get(key)
        if now >= approval.expires_at:
            why[key] = Reason.APPROVAL_EXPIRED
        elif item is None or d.target != approval.target:
            why[key] = Reason.NOT_APPROVED
        elif not item.fingerprint or fingerprint_of(d.resource) != item.fingerprint or d.rule != item.rule:
            why[key] = Reason.APPROVAL_CHANGED  # a label written, or found now by another rule
        elif isinstance(d.resource, GceInstance) and d.resource.status != item.status:
            why[key] = Reason.APPROVAL_CHANGED  # started (or stopped) since the review: no label need change
    _hold_partial_runs(recorded, approval, why, run_label)
    return [
        _held(d, why[key], approval.id, approved.get(key))
        if (key := (d.scope, d.resource.uid)) in why
        else _stamped(d, approval)
        for d in recorded
    ]


def _hold_partial_runs(
    recorded: list[Decision], approval: Approval, why: dict[tuple[str, str], Reason], run_label: str
) -> None:
    """Hold every delete of a Kubernetes run that is not approved and unchanged whole (``why`` gains them)."""
    runs: dict[tuple[str, str], list[Decision]] = defaultdict(list)
    for d in recorded:
        if d.action is Action.DELETE and isinstance(d.resource, K8sObject):
            runs[(d.scope, d.resource.labels.get(run_label, ""))].append(d)
    listed = {key for members in runs.values() for key in ((d.scope, d.resource.uid) for d in members)}
    missing = {(i.scope, i.group) for i in approval.items if i.group and (i.scope, i.uid) not in listed}
    for run, members in runs.items():
        if run in missing or any((d.scope, d.resource.uid) in why for d in members):
            for d in members:
                why.setdefault((d.scope, d.resource.uid), Reason.APPROVAL_RUN_PARTIAL)


def _held(decision: Decision, reason: Reason, approval: str, item: ApprovedItem | None) -> Decision:
    """The delete held, with what it was found, by which approval, and both states (listed and approved)."""
    evidence = {
        **(decision.evidence or {}),
        "finding": decision.reason,
        "approval": approval,
        "fingerprint": fingerprint_of(decision.resource),
    }
    if item is not None:
        evidence["approved_fingerprint"] = item.fingerprint
    return Decision(decision.target, decision.resource, Action.REPORT, decision.rule, reason, evidence)


def _stamped(decision: Decision, approval: Approval) -> Decision:
    """An approved delete says so in its evidence (the audit view shows by which approval)."""
    if decision.action is not Action.DELETE:
        return decision
    evidence = {**(decision.evidence or {}), "approval": approval.id}
    return Decision(decision.target, decision.resource, decision.action, decision.rule, decision.reason, evidence)
