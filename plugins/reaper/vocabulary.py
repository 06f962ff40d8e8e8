"""The reaper's words: every reason a decision or hold can carry, every result a delete can record, and the
actions of the ledger's delete records, each with what the report says of it.

One enum per kind of word, as httpx's status codes carry their phrase: a member is the code the ledger,
the summaries and the metrics store (a ``StrEnum`` member is its value: it compares, hashes and encodes as
that string), and it carries its sentence, so a new code cannot be given without one and a typo in a code
fails at import instead of writing a reason nobody explains. The policy names its reasons only through
:class:`Reason`, the deleters their results only through :class:`Result`.

Where one string is both a reason and a result (``terminating``: an object kept because it is being
deleted, and a Pod whose delete was accepted but which is still there), each enum has its member, named
for what it means there: the ledger stores the same string for both, as it always has.

This module imports nothing of the reaper's but :mod:`reaper.durations` (and, for type checkers only, the
report's ``Limits``): the policy, the deleters and the report all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from reaper.durations import duration

if TYPE_CHECKING:
    from reaper.report.reasons import Limits

# The facts a decision was taken on (its evidence), or a scope's verdict (``ScopeVerdict.as_dict``).
Facts = dict[str, object]
# A reason in words, from those facts and the thresholds of the config it was judged under (None: unknown).
Sentence = Callable[[Facts, "Limits | None"], str]


def _limit(limits: Limits | None, field: str, text: str) -> str:
    """``, quarantine 4 h`` when the limit is known, else nothing."""
    return f", {text} {duration(getattr(limits, field))}" if limits else ""


def _heartbeat(ev: Facts) -> str:
    age = ev.get("heartbeat_age_s")
    return f"heartbeat {duration(age)} old" if age is not None else f"heartbeat label {ev.get('heartbeat')!r}"


def _holds(ev: Facts) -> str:
    holds = ev.get("holds")
    return f" (holds in force: {', '.join(map(str, holds))})" if isinstance(holds, list) and holds else ""


def _run(ev: Facts) -> str:
    return f"run {ev['run']}: " if ev.get("run") else ""


def _kept_by(ev: Facts) -> str:
    """Which objects carry a run-wide guard (Kubernetes), or the label value found (GCE)."""
    kept_by = ev.get("kept_by")
    if isinstance(kept_by, list):
        return f" ({', '.join(map(str, kept_by))})"
    return f" ({ev['opt_out_label']!r})" if "opt_out_label" in ev else ""


def _store(ev: Facts) -> str:
    status = f" ({ev['status']})" if ev.get("status") else ""
    return f"run store says {ev.get('store', 'unknown')}{status}"


def _incomplete(ev: Facts, lim: Limits | None) -> str:
    return "the scope's listing was incomplete this sweep: nothing there is deleted"


def _budget(verdict: Facts, lim: Limits | None) -> str:
    """A scope's budget sides: S stale heartbeats of L (GCE), or orphaned runs of the managed ones (Kubernetes)."""
    if "managed_runs" in verdict:
        sides = f"{verdict.get('orphaned_runs')} of {verdict.get('managed_runs')} runs are orphans"
    else:
        sides = f"{verdict.get('stale')} of {verdict.get('labeled')} valid heartbeats are stale"
    over = f" (over {lim.max_stale_fraction:.0%}, at least {lim.min_stale})" if lim else ""
    return f"{sides}, over the budget{over}: more likely a broken writer than a broken fleet"


def _writers(verdict: Facts) -> str:
    bad = verdict.get("unhealthy_writers")
    if not isinstance(bad, list) or not bad:
        return ""
    return " (" + ", ".join(f"{w.get('manager')}: {w.get('problem')}" for w in bad if isinstance(w, dict)) + ")"


def _unknown(verdict: Facts) -> str:
    unknown = verdict.get("unknown_evidence")
    return f": {'; '.join(map(str, unknown))}" if isinstance(unknown, list) and unknown else ""


class Reason(StrEnum):
    """Why a resource is kept, reported or deleted: every code a decision, a scope's hold or a liveness reading
    carries (docs/design.md §3 to §6, §10).

    ``sentence`` says it of one resource, from the decision's evidence. A reason that can hold a whole scope
    also has ``hold_sentence``, which says it of the scope, from the scope's verdict (the owners' notices).
    """

    sentence: Sentence
    hold_sentence: Sentence | None

    def __new__(cls, value: str, sentence: Sentence, hold_sentence: Sentence | None = None) -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.sentence = sentence
        member.hold_sentence = hold_sentence
        return member

    # GCE findings (docs/design.md §4): each is also the name of the rule that finds it
    TERMINATED = (
        "terminated",
        lambda ev, lim: f"TERMINATED longer than the grace{_limit(lim, 'terminated_grace', 'of')}",
    )
    HEARTBEAT_STALE = "heartbeat_stale", lambda ev, lim: f"{_heartbeat(ev)}{_limit(lim, 'quarantine', 'quarantine')}"
    UNLABELED_AGE = (
        "unlabeled_age",
        lambda ev, lim: (
            f"no valid heartbeat label and older than the maximum age{_limit(lim, 'unlabeled_max_age', 'of')}"
        ),
    )
    # GCE anomalies: reported, never deleted by the heartbeat or age rules
    HEARTBEAT_IN_FUTURE = (
        "heartbeat_in_future",
        lambda ev, lim: f"heartbeat label {ev.get('heartbeat')!r} is in the future: clock skew?",
    )
    HEARTBEAT_MALFORMED = (
        "heartbeat_malformed",
        lambda ev, lim: f"heartbeat label {ev.get('heartbeat')!r} is not a unix time",
    )
    HEARTBEAT_BEFORE_CREATION = (
        "heartbeat_before_creation",
        lambda ev, lim: f"heartbeat label {ev.get('heartbeat')!r} is older than the instance: copied or a wrong clock",
    )
    HEARTBEAT_ELSEWHERE = (
        "heartbeat_elsewhere",
        lambda ev, lim: (
            f"label {ev.get('heartbeat_elsewhere')}={ev.get('heartbeat_elsewhere_value')} reads as a recent unix "
            "time: a manager stamping its heartbeat under another label name?"
        ),
    )
    CREATED_IN_FUTURE = (
        "created_in_future",
        lambda ev, lim: "created in the future: clock skew, every age is meaningless",
    )
    DELETION_PROTECTED = (
        "deletion_protected",
        lambda ev, lim: (
            f"would be deleted ({', '.join(map(str, ev.get('findings') or []))}) but has deletion protection"
        ),
    )
    RULE_OFF = "rule_off", lambda ev, lim: f"found {', '.join(map(str, ev.get('findings') or []))} but the rule is off"
    # holds of a scope (GCE project, Kubernetes cluster)
    WRITER_UNHEALTHY = (
        "writer_unhealthy",
        lambda ev, lim: f"{_heartbeat(ev)}, but a heartbeat writer of the project is failing or stale",
        lambda v, lim: (
            f"a heartbeat writer of the project is failing or stale{_writers(v)}"
            + _limit(lim, "writer_stale_after", "stale after")
        ),
    )
    WRITER_HEALTH_UNKNOWN = (
        "writer_health_unknown",
        lambda ev, lim: (
            f"{_heartbeat(ev)}, but the writers' health is unknown (unreadable, or no series for the project)"
        ),
        lambda v, lim: f"the heartbeat writers' health is unknown{_unknown(v) or _writers(v)}",
    )
    HEARTBEAT_LABEL_UNSEEN = (
        "heartbeat_label_unseen",
        lambda ev, lim: (
            "no valid heartbeat label and older than the maximum age, but no VM of its project carries a fresh "
            "heartbeat under that label: the label's name may be wrong (gce.heartbeat_label)"
        ),
        lambda v, lim: (
            "no in-scope VM of the project carries a fresh heartbeat under the label (gce.heartbeat_label): its "
            "name may be wrong or renamed, so no VM's lack of it proves anything"
        ),
    )
    STEP_LABELS_UNSEEN = (
        "step_labels_unseen",
        lambda ev, lim: (
            f"{_run(ev)}held: a step store is configured, but no Pod of the cluster carries its step or attempt label: "
            "their names may be wrong (k8s.step_label, k8s.attempt_label), so no run's results are proven durable"
        ),
        lambda v, lim: (
            "a step store is configured, but no listed Pod of the cluster carries k8s.step_label or "
            "k8s.attempt_label: their names may be wrong or renamed, so no run's results are proven durable"
        ),
    )
    BUDGET_EXCEEDED = (
        "budget_exceeded",
        lambda ev, lim: (
            f"{_run(ev) or _heartbeat(ev) + ', '}held: too many orphans in the scope at once"
            + (f" (over {lim.max_stale_fraction:.0%}, at least {lim.min_stale})" if lim else "")
            + ": more likely a broken writer than a broken fleet"
        ),
        _budget,
    )
    INVENTORY_INCOMPLETE = "inventory_incomplete", _incomplete, _incomplete
    MAX_DELETIONS_EXCEEDED = (
        "max_deletions_exceeded",
        lambda ev, lim: (
            f"{ev.get('finding')}, but the sweep planned more than max_deletions_per_sweep "
            f"({ev.get('max_deletions_per_sweep')}): nothing deleted"
        ),
        lambda v, lim: (
            f"the sweep planned {v.get('planned')} deletes, more than max_deletions_per_sweep ({v.get('cap')}): "
            "nothing was deleted"
        ),
    )
    # a run carrying an approval (docs/design.md §6): what it does not cover stays held
    NOT_APPROVED = (
        "not_approved",
        lambda ev, lim: (
            f"{ev.get('finding')}, but not among the items of approval {ev.get('approval')}: new since the review, or "
            "not selected; held"
        ),
    )
    APPROVAL_CHANGED = (
        "approval_changed",
        lambda ev, lim: (
            f"{ev.get('finding')}, approved by {ev.get('approval')}, but changed since its review (state "
            f"{ev.get('approved_fingerprint')} -> {ev.get('fingerprint')}: a label written, a heartbeat?); held"
        ),
    )
    APPROVAL_EXPIRED = (
        "approval_expired",
        lambda ev, lim: f"{ev.get('finding')}, but approval {ev.get('approval')} had expired; held",
    )
    APPROVAL_RUN_PARTIAL = (
        "approval_run_partial",
        lambda ev, lim: (
            f"{_run(ev)}approved by {ev.get('approval')}, but another object of its run is changed, new or gone since "
            "the review: a run is deleted whole or not at all; held"
        ),
    )
    # guards and plain keeps
    OPT_OUT = "opt_out", lambda ev, lim: f"opted out by its label{_kept_by(ev)}"
    OPT_OUT_MALFORMED = (
        "opt_out_malformed",
        lambda ev, lim: f"the opt-out label has an unexpected value, so it is kept{_kept_by(ev)}",
    )
    PROTECTED_SCOPE = (
        "protected_scope",
        lambda ev, lim: "in a protected project or namespace",
        lambda v, lim: "a protected project or namespace: nothing there is ever deleted",
    )
    FRESH = (
        "fresh",
        lambda ev, lim: (
            f"{_heartbeat(ev)}{_limit(lim, 'quarantine', 'quarantine')}: fresh" if ev else "heartbeat is fresh"
        ),
    )
    NO_FINDING = "no_finding", lambda ev, lim: "no heartbeat label, younger than the maximum age"
    # Kubernetes rows (docs/design.md §5), decided per run
    MIN_AGE = (
        "min_age",
        lambda ev, lim: (
            f"{_run(ev)}youngest object {duration(ev.get('youngest_age_s'))} old{_limit(lim, 'min_age', 'minimum age')}"
        ),
    )
    LEASE_HELD = "lease_held", lambda ev, lim: f"{_run(ev)}lease held"
    LEASE_UNKNOWN = (
        "lease_unknown",
        lambda ev, lim: f"{_run(ev)}lease unknown (unreadable, or not proven the right source)",
    )
    LEASE_ABSENT_RUN_ACTIVE = (
        "lease_absent_run_active",
        lambda ev, lim: f"{_run(ev)}lease absent, but {_store(ev)}: the runner may be alive",
    )
    STORE_UNKNOWN = (
        "store_unknown",
        lambda ev, lim: f"{_run(ev)}lease absent, run store unknown (unreadable, or not proven the right one)",
    )
    RUN_KEY_SHARED = (
        "run_key_shared",
        lambda ev, lim: (
            f"{_run(ev)}more than one NetworkPolicy, or one step attempt twice, carries this run id "
            f"({', '.join(map(str, ev.get('pods') or []))}): k8s.run_label is not one run's id here, so nothing "
            "proves the run gone"
        ),
    )
    RESULTS_EGRESS_IN_PROGRESS = (
        "results_egress_in_progress",
        lambda ev, lim: f"{_run(ev)}lease absent, {_store(ev)}, results-egress sidecar still running",
    )
    RESULTS_SIDECAR_UNSEEN = (
        "results_sidecar_unseen",
        lambda ev, lim: (
            f"{_run(ev)}lease absent, {_store(ev)}, but containers still run "
            f"({', '.join(map(str, ev.get('running') or []))}) and no Pod of the cluster has a container named as "
            "k8s.results_sidecar: one may be the results sidecar under another name (set k8s.results_sidecar, or "
            "none where the runners have no sidecar)"
        ),
    )
    RESULTS_NOT_DURABLE = (
        "results_not_durable",
        lambda ev, lim: (
            f"{_run(ev)}lease absent, {_store(ev)}, step results not durable yet"
            + (
                f" ({', '.join(f'{k}: {v}' for k, v in ev['steps'].items())})"
                if isinstance(ev.get("steps"), dict)
                else ""
            )
        ),
    )
    # Kubernetes' one finding, and the name of its one rule
    SANDBOX_ORPHAN = "sandbox_orphan", lambda ev, lim: f"{_run(ev)}lease absent, {_store(ev)}: an orphan{_holds(ev)}"
    IN_USE_OUTSIDE_RUN = "in_use_outside_run", lambda ev, lim: f"{_run(ev)}{ev.get('used_by')}: in use outside its run"
    POD_TERMINATING = "pod_terminating", lambda ev, lim: f"{_run(ev)}its Pod is still terminating; the rest waits"
    # an object that is itself being deleted: kept, sent no delete (the result of that name is Result.STILL_TERMINATING)
    TERMINATING = "terminating", lambda ev, lim: "already being deleted (deletionTimestamp set)"
    RUN_LABEL_MISSING = (
        "run_label_missing",
        lambda ev, lim: f"no {ev.get('run_label', 'run')} label: its run cannot be known",
    )
    # residual instance groups (docs/design.md §10): reported, never deleted; the finding names its rule
    RESIDUAL_GROUP = (
        "residual_group",
        lambda ev, lim: (
            f"manager {ev.get('manager')} has not reported writer health for longer than the quarantine"
            f" ({duration(ev.get('quarantine_s'))}), yet the group still holds {ev.get('instances')} instances"
        ),
    )
    GROUP_EMPTY = "group_empty", lambda ev, lim: "the group holds no instance"
    MANAGER_REPORTING = (
        "manager_reporting",
        lambda ev, lim: "the group's manager reported writer health within the quarantine",
    )
    GROUP_MEMBER = (
        "group_member",
        lambda ev, lim: "a managed instance group's member: its group is decided, not the instance",
    )


class Result(StrEnum):
    """What came of one planned delete, as its outcome record says (docs/design.md §6 and §7).

    ``phrase``: what the report says of an approved item that ended so (the sweep page's approval record);
    None where the report shows the code itself.
    """

    phrase: str | None

    def __new__(cls, value: str, phrase: str | None = None) -> Result:
        member = str.__new__(cls, value)
        member._value_ = value
        member.phrase = phrase
        return member

    DELETED = "deleted", "deleted"  # the delete was sent and took effect (a 404 after this sweep's own call too)
    ALREADY_GONE = "already_gone"  # a 404 before any delete call of this execution: gone already, a success
    CHANGED_SINCE_PLAN = "changed_since_plan", "changed between the plan and the delete: kept"
    FAILED = "failed"  # refused, or its operation failed: alerts when it repeats
    # A Pod whose delete was accepted but which was still there after k8s.pod_gone_timeout, or that a 409 found
    # already terminating: its run's Secrets and NetworkPolicy wait (the reason of that name is Reason.TERMINATING).
    STILL_TERMINATING = "terminating"
    NOT_ATTEMPTED = "not_attempted", "not attempted before the run's deadline"  # left for the next sweep
    # A delete call went out, its answer was lost (timeout, 5xx), and no retry was allowed (deadline, stop):
    # it may have been applied; the next sweep finds out.
    UNCONFIRMED = "unconfirmed"
    OPERATION_PENDING = "operation_pending"  # GCE: accepted; its operation had not finished by the deadline
    # Not an outcome record: the count of a batch's deletes a task refused to run, its plan another execution's.
    STALE_PLAN = "stale_plan"


# The results after which the resource is gone: a Kubernetes run's next object may be deleted.
GONE = frozenset({Result.DELETED, Result.ALREADY_GONE})


class RecordAction(StrEnum):
    """The ``action`` of a ledger record a delete writes (a decision's is its :class:`reaper.model.Action`): part of
    the record's fence key (docs/design.md §7). ``kind``: the record's ``kind``, what the audit view reads it as."""

    kind: str

    def __new__(cls, value: str, kind: str) -> RecordAction:
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind = kind
        return member

    DELETE_INTENT = "delete_intent", "intent"  # written, and acknowledged, before the delete is sent
    OUTCOME = "outcome", "outcome"  # what came of it, a :class:`Result`
