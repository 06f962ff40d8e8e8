"""Every reason code the policy can give, as a sentence filled from the decision's evidence.

The policy's decisions carry a code (``lease_absent_run_active``) and the facts it decided on
(``{"lease": "absent", "store": "active", "status": "running"}``); people read a sentence. The
thresholds (quarantine, grace, minimum age) are not in the evidence: they come from a config, and
without one the sentence leaves them out rather than guess. A code without a sentence here (a
new one) is shown as the code itself with its raw evidence: never hidden.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from reaper.config import Settings


class Limits(NamedTuple):
    """The thresholds a sentence quotes, in seconds (from the config the decision was judged under)."""

    quarantine: float
    terminated_grace: float
    unlabeled_max_age: float
    min_age: float
    writer_stale_after: float
    min_stale: int
    max_stale_fraction: float

    @classmethod
    def of(cls, config: Settings) -> Limits:
        gce, k8s = config.gce, config.k8s
        return cls(
            gce.quarantine.total_seconds(),
            gce.terminated_grace.total_seconds(),
            gce.unlabeled_max_age.total_seconds(),
            k8s.min_age.total_seconds(),
            gce.writer_stale_after.total_seconds(),
            config.budget.min_stale,
            config.budget.max_stale_fraction,
        )


def duration(seconds: object) -> str:
    """``5 h 12 min``, ``3 d 4 h``, ``45 s``: the largest unit and the next one when not zero, for people."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "unknown"
    left = int(abs(seconds))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    first = next((i for i, (_, size) in enumerate(units) if left >= size), len(units) - 1)
    (big, big_size), rest = units[first], units[first + 1 : first + 2]
    parts = [f"{left // big_size} {big}"] + [
        f"{left % big_size // size} {unit}" for unit, size in rest if left % big_size // size
    ]
    return ("-" if seconds < 0 else "") + " ".join(parts)


Evidence = dict[str, object]
Sentence = Callable[[Evidence, Limits | None], str]


def _limit(limits: Limits | None, field: str, text: str) -> str:
    """``, quarantine 4 h`` when the limit is known, else nothing."""
    return f", {text} {duration(getattr(limits, field))}" if limits else ""


def _heartbeat(ev: Evidence) -> str:
    age = ev.get("heartbeat_age_s")
    return f"heartbeat {duration(age)} old" if age is not None else f"heartbeat label {ev.get('heartbeat')!r}"


def _holds(ev: Evidence) -> str:
    holds = ev.get("holds")
    return f" (holds in force: {', '.join(map(str, holds))})" if isinstance(holds, list) and holds else ""


def _run(ev: Evidence) -> str:
    return f"run {ev['run']}: " if ev.get("run") else ""


def _kept_by(ev: Evidence) -> str:
    """Which objects carry a run-wide guard (Kubernetes), or the label value found (GCE)."""
    if isinstance(ev.get("kept_by"), list):
        return f" ({', '.join(map(str, ev['kept_by']))})"
    return f" ({ev['opt_out_label']!r})" if "opt_out_label" in ev else ""


def _store(ev: Evidence) -> str:
    status = f" ({ev['status']})" if ev.get("status") else ""
    return f"run store says {ev.get('store', 'unknown')}{status}"


SENTENCES: dict[str, Sentence] = {
    # GCE findings (docs/design.md §4)
    "terminated": lambda ev, lim: f"TERMINATED longer than the grace{_limit(lim, 'terminated_grace', 'of')}",
    "heartbeat_stale": lambda ev, lim: f"{_heartbeat(ev)}{_limit(lim, 'quarantine', 'quarantine')}",
    "unlabeled_age": lambda ev, lim: (
        f"no valid heartbeat label and older than the maximum age{_limit(lim, 'unlabeled_max_age', 'of')}"
    ),
    # GCE anomalies: reported, never deleted by the heartbeat or age rules
    "heartbeat_in_future": lambda ev, lim: f"heartbeat label {ev.get('heartbeat')!r} is in the future: clock skew?",
    "heartbeat_malformed": lambda ev, lim: f"heartbeat label {ev.get('heartbeat')!r} is not a unix time",
    "heartbeat_before_creation": lambda ev, lim: (
        f"heartbeat label {ev.get('heartbeat')!r} is older than the instance: copied or a wrong clock"
    ),
    "created_in_future": lambda ev, lim: "created in the future: clock skew, every age is meaningless",
    "deletion_protected": lambda ev, lim: (
        f"would be deleted ({', '.join(map(str, ev.get('findings') or []))}) but has deletion protection"
    ),
    "rule_off": lambda ev, lim: f"found {', '.join(map(str, ev.get('findings') or []))} but the rule is off",
    # holds of a scope (GCE project, Kubernetes cluster)
    "writer_unhealthy": lambda ev, lim: f"{_heartbeat(ev)}, but a heartbeat writer of the project is failing or stale",
    "writer_health_unknown": lambda ev, lim: (
        f"{_heartbeat(ev)}, but the writers' health is unknown (unreadable, or no series for the project)"
    ),
    "budget_exceeded": lambda ev, lim: (
        f"{_run(ev) or _heartbeat(ev) + ', '}held: too many orphans in the scope at once"
        + (f" (over {lim.max_stale_fraction:.0%}, at least {lim.min_stale})" if lim else "")
        + ": more likely a broken writer than a broken fleet"
    ),
    "inventory_incomplete": lambda ev, lim: "the scope's listing was incomplete this sweep: nothing there is deleted",
    "max_deletions_exceeded": lambda ev, lim: (
        f"{ev.get('finding')}, but the sweep planned more than max_deletions_per_sweep "
        f"({ev.get('max_deletions_per_sweep')}): nothing deleted"
    ),
    # a run carrying an approval (docs/design.md §6): what it does not cover stays held
    "not_approved": lambda ev, lim: (
        f"{ev.get('finding')}, but not among the items of approval {ev.get('approval')}: new since the review, or "
        "not selected; held"
    ),
    "approval_changed": lambda ev, lim: (
        f"{ev.get('finding')}, approved by {ev.get('approval')}, but changed since its review (state "
        f"{ev.get('approved_fingerprint')} -> {ev.get('fingerprint')}: a label written, a heartbeat?); held"
    ),
    "approval_expired": lambda ev, lim: f"{ev.get('finding')}, but approval {ev.get('approval')} had expired; held",
    "approval_run_partial": lambda ev, lim: (
        f"{_run(ev)}approved by {ev.get('approval')}, but another object of its run is changed, new or gone since "
        "the review: a run is deleted whole or not at all; held"
    ),
    # guards and plain keeps
    "opt_out": lambda ev, lim: f"opted out by its label{_kept_by(ev)}",
    "opt_out_malformed": lambda ev, lim: f"the opt-out label has an unexpected value, so it is kept{_kept_by(ev)}",
    "protected_scope": lambda ev, lim: "in a protected project or namespace",
    "fresh": lambda ev, lim: (
        f"{_heartbeat(ev)}{_limit(lim, 'quarantine', 'quarantine')}: fresh" if ev else "heartbeat is fresh"
    ),
    "no_finding": lambda ev, lim: "no heartbeat label, younger than the maximum age",
    # Kubernetes rows (docs/design.md §5), decided per run
    "min_age": lambda ev, lim: (
        f"{_run(ev)}youngest object {duration(ev.get('youngest_age_s'))} old{_limit(lim, 'min_age', 'minimum age')}"
    ),
    "lease_held": lambda ev, lim: f"{_run(ev)}lease held",
    "lease_unknown": lambda ev, lim: f"{_run(ev)}lease unknown (unreadable, or not proven the right source)",
    "lease_absent_run_active": lambda ev, lim: f"{_run(ev)}lease absent, but {_store(ev)}: the runner may be alive",
    "store_unknown": lambda ev, lim: (
        f"{_run(ev)}lease absent, run store unknown (unreadable, or not proven the right one)"
    ),
    "run_key_shared": lambda ev, lim: (
        f"{_run(ev)}more than one NetworkPolicy, or one step attempt twice, carries this run id "
        f"({', '.join(map(str, ev.get('pods') or []))}): k8s.run_label is not one run's id here, so nothing "
        "proves the run gone"
    ),
    "results_egress_in_progress": lambda ev, lim: (
        f"{_run(ev)}lease absent, {_store(ev)}, results-egress sidecar still running"
    ),
    "results_not_durable": lambda ev, lim: (
        f"{_run(ev)}lease absent, {_store(ev)}, step results not durable yet"
        + (f" ({', '.join(f'{k}: {v}' for k, v in ev['steps'].items())})" if isinstance(ev.get("steps"), dict) else "")
    ),
    "sandbox_orphan": lambda ev, lim: f"{_run(ev)}lease absent, {_store(ev)}: an orphan{_holds(ev)}",
    "in_use_outside_run": lambda ev, lim: f"{_run(ev)}{ev.get('used_by')}: in use outside its run",
    "pod_terminating": lambda ev, lim: f"{_run(ev)}its Pod is still terminating; the rest waits",
    "terminating": lambda ev, lim: "already being deleted (deletionTimestamp set)",
    "run_label_missing": lambda ev, lim: f"no {ev.get('run_label', 'run')} label: its run cannot be known",
    # residual instance groups (docs/design.md §10): reported, never deleted
    "residual_group": lambda ev, lim: (
        f"manager {ev.get('manager')} has not reported writer health for longer than the quarantine"
        f" ({duration(ev.get('quarantine_s'))}), yet the group still holds {ev.get('instances')} instances"
    ),
    "group_empty": lambda ev, lim: "the group holds no instance",
    "manager_reporting": lambda ev, lim: "the group's manager reported writer health within the quarantine",
    "group_member": lambda ev, lim: "a managed instance group's member: its group is decided, not the instance",
}


def explain(reason: str | None, evidence: Evidence | None, limits: Limits | None = None, raw: bool = True) -> str:
    """The reason in words; an unknown code, or evidence a sentence cannot read, as the code and its facts.

    ``raw`` False: the code alone in that case, without the facts (a notice that leaves Airflow quotes no
    evidence it was not written for: docs/notifications.md).
    """
    ev = evidence or {}
    sentence = SENTENCES.get(reason or "")
    if sentence is not None:
        try:
            return sentence(ev, limits)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # evidence of an older or newer shape: the raw facts below say it all
    facts = ", ".join(f"{k}={v}" for k, v in ev.items() if v not in (None, [], {})) if raw else ""
    return f"{reason or 'no reason'}" + (f" ({facts})" if facts else "")


def _budget(verdict: Evidence, lim: Limits | None) -> str:
    """A scope's budget sides: S stale heartbeats of L (GCE), or orphaned runs of the managed ones (Kubernetes)."""
    if "managed_runs" in verdict:
        sides = f"{verdict.get('orphaned_runs')} of {verdict.get('managed_runs')} runs are orphans"
    else:
        sides = f"{verdict.get('stale')} of {verdict.get('labeled')} valid heartbeats are stale"
    over = f" (over {lim.max_stale_fraction:.0%}, at least {lim.min_stale})" if lim else ""
    return f"{sides}, over the budget{over}: more likely a broken writer than a broken fleet"


def _writers(verdict: Evidence) -> str:
    bad = verdict.get("unhealthy_writers")
    if not isinstance(bad, list) or not bad:
        return ""
    return " (" + ", ".join(f"{w.get('manager')}: {w.get('problem')}" for w in bad if isinstance(w, dict)) + ")"


def _unknown(verdict: Evidence) -> str:
    unknown = verdict.get("unknown_evidence")
    return f": {'; '.join(map(str, unknown))}" if isinstance(unknown, list) and unknown else ""


# A hold of a whole scope in words, from the scope's verdict (``ScopeVerdict.as_dict``): the notices and any
# reader of a verdict, where SENTENCES speaks of one resource held by it.
SCOPE_HOLDS: dict[str, Sentence] = {
    "budget_exceeded": _budget,
    "writer_unhealthy": lambda v, lim: (
        f"a heartbeat writer of the project is failing or stale{_writers(v)}"
        + _limit(lim, "writer_stale_after", "stale after")
    ),
    "writer_health_unknown": lambda v, lim: f"the heartbeat writers' health is unknown{_unknown(v) or _writers(v)}",
    "inventory_incomplete": lambda v, lim: SENTENCES["inventory_incomplete"](v, lim),
    "protected_scope": lambda v, lim: "a protected project or namespace: nothing there is ever deleted",
    "max_deletions_exceeded": lambda v, lim: (
        f"the sweep planned {v.get('planned')} deletes, more than max_deletions_per_sweep ({v.get('cap')}): "
        "nothing was deleted"
    ),
}


def explain_hold(hold: str, verdict: Evidence, limits: Limits | None = None) -> str:
    """A scope's hold in words; an unknown hold (a new one) as its code."""
    sentence = SCOPE_HOLDS.get(hold)
    if sentence is not None:
        try:
            return sentence(verdict, limits)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a verdict of another shape: the code says what it is
    return hold
