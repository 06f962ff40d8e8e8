"""Approvals: an operator's go for a reviewed subset of a held sweep's deletes (docs/design.md §6).

A scope held by its budget, or a sweep held by the global cap, deletes nothing. An approval names the items
an operator reviewed on the sweep page (or with ``reaper approve``), each with the state it was reviewed in:
a GCE instance's id and ``labelFingerprint`` (a hash of the labels: any change, a heartbeat included), a
Kubernetes object's uid and ``resourceVersion``. A run triggered with ``approval=<id>`` deletes only those
items, and only while each is still in that state (:mod:`reaper.policy.approval`); it is used by one
execution of one run, recorded as used in the ledger, never replayed.

This module holds the records and the checks, no I/O; the ledger stores them (``ledger.approvals_collection``).
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Protocol, cast

import msgspec

from reaper.durations import duration
from reaper.model import GceInstance, K8sObject, Override, Resource
from reaper.vocabulary import Reason, Result

DEFAULT_EXPIRY = timedelta(hours=4)  # long enough to trigger the run after a review, short enough to stay current
MAX_EXPIRY = timedelta(days=7)  # the evidence an approval was given for is old by then: review again
# The holds an approval can lift: the budget's, the global cap's, and those of an earlier approval's run
# (its items changed or new since their review, or the approval expired): reviewed again, approved again.
APPROVABLE = (
    Reason.BUDGET_EXCEEDED,
    Reason.MAX_DELETIONS_EXCEEDED,
    Reason.APPROVAL_CHANGED,
    Reason.APPROVAL_EXPIRED,
    Reason.APPROVAL_RUN_PARTIAL,
    Reason.NOT_APPROVED,
)
# A planned delete whose outcome is this is a candidate too: never sent (its run's deadline, lease, a stop, a
# revocation), it is in the state its run listed it in, for the next approval to cover (docs/runbook.md).
LEFT = Result.NOT_ATTEMPTED


class ApprovedItem(msgspec.Struct, frozen=True):
    """One reviewed resource: where it is, and its state at review (``fingerprint``: GCE ``labelFingerprint``,
    Kubernetes ``resourceVersion``; ``rule`` and, for GCE, ``status``: what the labels do not pin, the rule it was
    found by and its status; a VM started or resumed since its review changes no label). ``group``: a Kubernetes
    object's run (its run label's value)."""

    scope: str
    uid: str
    fingerprint: str
    name: str = ""
    kind: str = ""
    group: str = ""
    rule: str = ""  # the rule it was found by (a record without one is refused: :func:`problem`)
    status: str = ""  # GCE: its status at review, whose class must not change (a VM started since); Kubernetes: ""


class UsedBy(msgspec.Struct, frozen=True):
    """The one execution that used an approval: its run's ids and its sweep lease (``reaper.sweep.steps.Ids``)."""

    dag_id: str
    run_id: str
    execution: int
    lease: str
    at: float = 0.0


class Revoked(msgspec.Struct, frozen=True):
    """Who revoked an approval, when (unix seconds) and why."""

    user: str
    reason: str
    at: float


class Standing(msgspec.Struct, frozen=True):
    """What a sending batch reads of its approval, every :data:`reaper.sweep.deletes.REVOCATION_POLL` seconds: its
    revocation, and the fields without which the document is not the approval it claimed (edited by hand: nothing
    proves it still stands). Not the items, which the claim read: an incident's approval names thousands."""

    id: str
    target: str
    dag_id: str
    used_by: UsedBy
    revoked: Revoked | None = None


STANDING = tuple(Standing.__struct_fields__)  # the fields :meth:`reaper.ledger.Ledger.revocation` reads


class Approval(msgspec.Struct, frozen=True):
    """An approval as the ledger keeps it.

    ``dag_id``/``run_id``: the sweep it was made from (its candidates); only a run of that DAG may use it.
    ``created_at``/``expires_at``: unix seconds. ``used_by``: the execution that used it, once it has.
    ``revoked``: once revoked, no run may claim it, and a run using it sends no delete half a second after.
    """

    id: str
    target: str
    dag_id: str
    run_id: str
    user: str
    reason: str
    created_at: float
    expires_at: float
    items: list[ApprovedItem]
    used_by: UsedBy | None = None
    revoked: Revoked | None = None

    def scopes(self) -> frozenset[tuple[str, str]]:
        """(target, scope) of every approved item: the only scopes whose budget hold it lifts."""
        return frozenset((self.target, i.scope) for i in self.items)

    def override(self) -> Override:
        """The budget override the policy evaluates under: lifted in the approval's scopes only; the approval then
        lets through its own items alone (:func:`reaper.policy.approval.held_unless_approved`)."""
        return Override(f"approval {self.id}: {self.reason}", self.user, self.scopes())

    def by_key(self) -> dict[tuple[str, str], ApprovedItem]:
        return {(i.scope, i.uid): i for i in self.items}


def fingerprint_of(resource: Resource) -> str:
    """The state a resource is reviewed in: a GCE instance's ``labelFingerprint``, and its last stop and suspend
    times once it has stopped or been suspended (``;stopped=<unix seconds>``, ``;suspended=...``: a VM started and
    stopped again, or resumed and suspended again, since its review writes no label and ends in the status it had;
    only these move); a Kubernetes object's ``resourceVersion``; "" for anything else, or an instance listed
    without its fingerprint (no approval covers it)."""
    if isinstance(resource, GceInstance):
        if not resource.label_fingerprint:
            return ""
        times = (("stopped", resource.last_stop), ("suspended", resource.last_suspended))
        return resource.label_fingerprint + "".join(f";{k}={t:.3f}" for k, t in times if t is not None)
    if isinstance(resource, K8sObject):
        return resource.resource_version
    return ""


def new_id() -> str:
    """An approval's id: short enough to type, random enough never to collide (the ledger refuses a duplicate)."""
    return f"apr-{secrets.token_hex(6)}"


def check_expiry(expires_in: timedelta) -> None:
    """An expiry between a minute and :data:`MAX_EXPIRY`; ``ValueError`` naming both bounds otherwise."""
    if not timedelta(minutes=1) <= expires_in <= MAX_EXPIRY:
        raise ValueError(
            f"expires_in: expected between 1 min and {duration(MAX_EXPIRY.total_seconds())}, "
            f"got {duration(expires_in.total_seconds())}"
        )


def choose(candidates: Iterable[Mapping[str, object]], wanted: Iterable[str] | None, target: str) -> list[ApprovedItem]:
    """The approved items among a held sweep's candidate decision records: all of them (``wanted`` None), or those
    ``wanted`` names.

    A wanted item is ``[scope/]key[@state]``: ``key`` a uid, a name or (Kubernetes) a run id; ``scope`` (project,
    cluster) needed where the key is found in several (names are unique per project or namespace only: approving
    one must never approve a twin elsewhere, nor lift its scope's hold); ``state`` the fingerprint the operator
    reviewed (the sweep page sends it), which must still be the candidate's: a newer execution of the sweep that
    listed it in another state is not what was reviewed. A Kubernetes run is approved whole: naming one of its
    objects approves every listed object of the run (docs/design.md §5). A candidate recorded without its
    fingerprint (an older sweep) cannot be approved: ``ValueError`` when named, left out when approving all.
    """
    keyed = [_item(r) for r in candidates if r.get("target") == target]
    if wanted is None:
        return [item for item in keyed if item.fingerprint]
    index: dict[str, list[ApprovedItem]] = defaultdict(list)  # one pass: a form may name thousands
    for item in keyed:
        for key in dict.fromkeys((item.uid, item.name, item.group)):
            if key:
                index[key].append(item)
    runs: set[tuple[str, str]] = set()
    picked: dict[tuple[str, str], ApprovedItem] = {}
    reviewed: set[tuple[str, str]] = set()  # posted with the state shown: then a run's every object must be
    for name in dict.fromkeys(wanted):
        found = _named(index, name)
        if "@" in name:
            reviewed.update((i.scope, i.uid) for i in found)
        for item in found:
            picked[(item.scope, item.uid)] = item
            if item.group:
                runs.add((item.scope, item.group))
    for item in keyed:  # the rest of every named run's objects
        if item.group and (item.scope, item.group) in runs:
            if not item.fingerprint:
                raise ValueError(f"run {item.group}: {item.name} was recorded without its resourceVersion")
            if reviewed and (item.scope, item.uid) not in reviewed:  # new since the page, or not shown in its state
                raise ValueError(
                    f"run {item.group}: {item.scope}/{item.uid} ({item.name}) is not among the reviewed items: "
                    "expected every object of the run, each in the state reviewed (a run is approved whole)"
                )
            picked[(item.scope, item.uid)] = item
    return list(picked.values())


def _named(index: Mapping[str, list[ApprovedItem]], name: str) -> list[ApprovedItem]:
    """The candidates one wanted item names (see :func:`choose`); ``ValueError`` when none, several unrelated, or
    not in the state the operator reviewed."""
    rest, _, state = name.partition("@")
    scope, _, key = rest.rpartition("/")
    found = [i for i in index.get(key, []) if not scope or i.scope == scope]
    if not found:
        raise ValueError(f"{name!r}: not a held candidate of this sweep (expected [scope/]uid, name or run id)")
    if len({(i.scope, i.group or i.uid) for i in found}) > 1:  # one resource, or one Kubernetes run
        where = ", ".join(sorted(f"{i.scope}/{i.uid}" for i in found))
        raise ValueError(f"{name!r}: names several held candidates ({where}); expected scope/uid")
    for item in found:
        if not item.fingerprint:
            raise ValueError(
                f"{name!r}: recorded without its labelFingerprint/resourceVersion (an older sweep): expected a "
                "candidate of a sweep that recorded its state"
            )
        if state and len(found) > 1:
            raise ValueError(f"{name!r}: a state names one resource, not {len(found)}: expected scope/uid@state")
        if state and item.fingerprint != state:
            raise ValueError(
                f"{name!r}: listed since in another state ({item.fingerprint}) than the one reviewed ({state}): "
                "expected a review of the sweep as it is now"
            )
    return found


def _item(record: Mapping[str, object]) -> ApprovedItem:
    # cast: a plan record's "evidence" is a document (a dict) or absent; `.get` on anything else raised here before too.
    evidence = cast("Mapping[str, object]", record.get("evidence") or {})
    return ApprovedItem(
        scope=str(record["scope"]),
        uid=str(record["uid"]),
        fingerprint=str(record.get("fingerprint") or ""),
        name=str(record.get("name") or ""),
        kind=str(record.get("resource_kind") or ""),
        group=str(record.get("group") or ""),
        rule=str(record.get("rule") or ""),
        status=str(evidence.get("status") or "") if record.get("target") == "gce" else "",
    )


def problem(approval: Approval | None, wanted: str, dag_id: str, target: str, now: float) -> str | None:
    """Why a run of ``dag_id`` may not use the approval ``wanted`` (None: unknown), as the one sentence its param
    error gives; None when it may (its being used is checked where it is claimed)."""
    if approval is None:
        return (
            f"no approval {wanted!r} in the ledger (ledger.approvals_collection); expected the id the sweep page "
            "or `reaper approve` printed"
        )
    if approval.target != target or approval.dag_id != dag_id:
        return (
            f"approval {wanted!r} was made from a sweep of {approval.dag_id} (target {approval.target}); expected an "
            f"approval made from a sweep of this DAG, {dag_id}"
        )
    if any(not i.rule or (approval.target == "gce" and not i.status) for i in approval.items):
        return (
            f"approval {wanted!r} was recorded before its items were pinned to their rule and status: expected an "
            "approval made since (approve the held candidates again)"
        )
    if approval.revoked is not None:
        by = approval.revoked
        return (
            f"approval {wanted!r} was revoked by {by.user} {duration(now - by.at)} ago: {by.reason}; expected an "
            "approval not revoked (review the held candidates again and approve them anew)"
        )
    if now >= approval.expires_at:
        return (
            f"approval {wanted!r} expired {duration(now - approval.expires_at)} ago; expected an unexpired approval "
            "(review the held candidates again and approve them anew)"
        )
    return None


def used_elsewhere(approval: Approval, dag_id: str, run_id: str, execution: int) -> str | None:
    """Why an approval already used may not be used by this execution; None when unused or used by it."""
    used = approval.used_by
    if used is None or (used.dag_id, used.run_id, used.execution) == (dag_id, run_id, execution):
        return None
    return (
        f"approval {approval.id!r} was used by {used.dag_id}/{used.run_id} (execution {used.execution}); an approval "
        "is used by one execution only: expected a new approval of what is still held"
    )


class Revocable(Protocol):
    """What :func:`revoke` needs of the ledger (:class:`reaper.ledger.Ledger`)."""

    def approval(self, approval_id: str) -> dict[str, object] | None: ...

    def revoke_approval(self, approval_id: str, revoked: dict[str, object]) -> dict[str, object] | None: ...


def revoke(ledger: Revocable, approval_id: str, user: str, reason: str, now: float) -> Approval:
    """Revoke an approval, used or not, and record who did and why: no run claims it after, and a run already using
    it sends nothing more within half a second (the sends under way finish). ``ValueError`` naming what was
    expected: an approval that exists and is not revoked yet, and a reason."""
    if not reason.strip():
        raise ValueError("reason: expected why the approval is revoked, got nothing")
    revoked = Revoked(user, reason.strip(), now)
    after = ledger.revoke_approval(approval_id, msgspec.to_builtins(revoked))
    if after is not None:
        return msgspec.convert(after, Approval)
    found = ledger.approval(approval_id)
    if found is None:
        raise ValueError(f"no approval {approval_id!r} in the ledger; expected the id `reaper approve` printed")
    earlier = msgspec.convert(found, Approval).revoked
    by = f" by {earlier.user}: {earlier.reason}" if earlier else ""
    raise ValueError(f"approval {approval_id!r} is already revoked{by}; expected one not revoked yet")


class ApprovalSource(Protocol):
    """What :func:`approve` needs of the ledger (:class:`reaper.ledger.Ledger`)."""

    def held(self, dag_id: str, run_id: str) -> list[dict[str, object]]: ...

    def record_approval(self, approval: dict[str, object]) -> None: ...


def approve(
    ledger: ApprovalSource,
    dag_id: str,
    run_id: str,
    wanted: Iterable[str] | None,
    user: str,
    reason: str,
    expires_in: timedelta,
    now: float,
) -> Approval:
    """Approve a sweep's held candidates (all, or those ``wanted`` names: :func:`choose`) and record it; the one
    way the sweep page and ``reaper approve`` make an approval. ``ValueError`` naming what was expected."""
    if not reason.strip():
        raise ValueError("reason: expected why these deletes are approved (an incident, a ticket), got nothing")
    check_expiry(expires_in)
    target = dag_id.split("_")[1] if dag_id.startswith("reaper_") else ""
    if target not in ("gce", "k8s"):
        raise ValueError(f"dag_id: expected a reaper DAG (reaper_gce_<phase>, reaper_k8s_<phase>), got {dag_id!r}")
    candidates = ledger.held(dag_id, run_id)
    items = choose(candidates, wanted, target)
    if not items:
        raise ValueError(
            f"{dag_id}/{run_id}: no held candidate with its state recorded; expected a sweep whose budget or cap "
            "held deletes"
        )
    approval = Approval(new_id(), target, dag_id, run_id, user, reason.strip(), now, now + expires_in.total_seconds(),
                        items)  # fmt: skip
    ledger.record_approval(msgspec.to_builtins(approval))
    return approval
