"""What needs a human now: the overview's first screen, from the latest sweep of each DAG that deletes.

Only the active phase's DAG of each target deletes on its schedule (docs/design.md §8), so only its
latest sweep can say that deletes are held, failing or capped, and only its absence is a missing
sweep; another phase's holds are information, charted below. Each item carries the one action
docs/runbook.md gives for it, under the section (an alert's name) it links to. Pure: the routes in
:mod:`reaper.audit` read the ledger, the config and Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import msgspec
from msgspec import UnsetType

from reaper.alerting import reapers
from reaper.durations import duration
from reaper.records import SweepSummary, Verdict, summary_of
from reaper.vocabulary import Reason, Result


class Runbook(NamedTuple):
    """Where docs/runbook.md says what to do (an alert's section), and that one action in a sentence."""

    section: str
    action: str


# A hold that blocks deletes -> its runbook entry.
HOLD_ACTIONS: dict[str, Runbook] = {
    Reason.BUDGET_EXCEEDED: Runbook(
        "ReaperBudgetHold",
        "Check that the stale ones are really dead, then approve the reviewed ones on the sweep's page (or "
        "reaper approve) and trigger the DAG with approval=<id>; override_budget is the blunter tool.",
    ),
    Reason.WRITER_UNHEALTHY: Runbook(
        "ReaperWriterHold", "Fix the runner managers the scope's verdict lists as unhealthy writers."
    ),
    Reason.WRITER_HEALTH_UNKNOWN: Runbook(
        "ReaperWriterHold",
        "Make the managers' writer-health series readable; the scope's verdict says what is unknown.",
    ),
    Reason.HEARTBEAT_LABEL_UNSEEN: Runbook(
        "ReaperOrphansHeld",
        "Check gce.heartbeat_label against the label the runner managers stamp (reaper check names it): no VM of "
        "the scope carries a fresh heartbeat under it, so its unlabeled VMs are reported, not deleted.",
    ),
    Reason.STEP_LABELS_UNSEEN: Runbook(
        "ReaperOrphansHeld",
        "Check k8s.step_label and k8s.attempt_label against the labels the runners put on their step Pods: no Pod "
        "of the cluster carries either, so no run's results are proven durable and its deletes are held.",
    ),
    Reason.INVENTORY_INCOMPLETE: Runbook(
        "ReaperInventoryIncomplete",
        "Fix what made the listing partial (the sweep's incomplete problems): usually a permission or the quota.",
    ),
}
OTHER_HOLD = Runbook("", "Open the sweep: the scope's verdict says what holds it.")
FAILED = Runbook("ReaperDeletionsFailing", "Read the failed outcomes' detail on the sweep page and fix that cause.")
CAPPED = Runbook(
    "ReaperCapped",
    "Check the planned deletes against reality; approve the orphans on the sweep's page (or reaper approve) and "
    "trigger the DAG with approval=<id>; max_deletions with an override_reason is the blunter tool.",
)
FAILED_RUN = Runbook("ReaperNotSweeping", "Read the failed task's log in Airflow, fix the cause, then clear the run.")
MISSING = Runbook("ReaperNotSweeping", "Check that the DAG is unpaused, the scheduler runs, and its runs succeed.")
UNREADABLE = Runbook(
    "",
    "A summary of this run does not decode as this version reads summaries: read it in the "
    "ledger (GET /reaper/api/sweeps) and report it; the other sweeps are shown without it.",
)
LATE = 2  # a sweep is missing when none ended within this many schedule intervals


class Need(NamedTuple):
    """One thing for a human: what, where, why, what to do (``runbook``), and since when."""

    what: str
    dag_id: str
    run_id: str
    scope: str
    why: str
    runbook: Runbook
    at: object = None


def readable(docs: Iterable[Mapping[str, object]]) -> tuple[list[SweepSummary], list[Need]]:
    """The summaries typed, each on its own: one that does not decode (a field of a type no version wrote) is a
    need of its own, never the whole overview's failure."""
    typed: list[SweepSummary] = []
    unreadable: list[Need] = []
    for doc in docs:
        try:
            typed.append(summary_of(doc))
        except msgspec.ValidationError as exc:
            dag_id, run_id = str(doc.get("dag_id", "")), str(doc.get("run_id", ""))
            unreadable.append(Need("summary unreadable", dag_id, run_id, "", str(exc), UNREADABLE, doc.get("at")))
    return typed, unreadable


def _said(value: str | UnsetType) -> str:
    """A summary's text field, empty where the summary has none."""
    return value if isinstance(value, str) else ""


def _at(summary: SweepSummary) -> datetime | None:
    return summary.at if isinstance(summary.at, datetime) else None


def counts(summary: SweepSummary) -> bool:
    """Whether a summary is of a sweep that ran for real: not a dry run, not a run skipped because another
    sweep held the lease. Only such a sweep says what holds, fails or is missing."""
    return summary.state != "skipped" and summary.dry_run is not True


def needs(
    sweeps: Mapping[str, list[SweepSummary]], expected: Mapping[str, timedelta], now: datetime | None = None
) -> list[Need]:
    """Everything that needs a human in the sweeps of each DAG of ``expected`` (the active phases' DAG ids and
    their schedule intervals; ``0``: triggered by hand only, never missing). ``sweeps``: each DAG's summaries
    in the window, oldest first.

    Read from the sweeps that :func:`counts`, so a later dry run or skipped run hides nothing: each scope's
    verdict from the latest of them that swept it (a run of some scopes only leaves the others' standing),
    the failures, the cap and the state from the latest of them, and a sweep missing measured from it.
    """
    now = now or datetime.now(UTC)
    found: list[Need] = []
    for dag_id, every in expected.items():
        real = [s for s in sweeps.get(dag_id, []) if counts(s)]
        skipped = [s for s in sweeps.get(dag_id, []) if s.state == "skipped"]
        since_skip = f"; the latest run was skipped: {_said(skipped[-1].why)}" if skipped else ""
        if not real:
            if every:
                why = "no sweep recorded in the window shown" + since_skip
                found.append(Need("no sweep", dag_id, "", "", why, MISSING))
            continue
        s = real[-1]
        run, at = s.run_id, _at(s)
        ended = at
        if ended is not None and ended.tzinfo is None:
            ended = ended.replace(tzinfo=UTC)
        if every and ended is not None and now - ended > LATE * every:
            age, interval = duration((now - ended).total_seconds()), duration(every.total_seconds())
            why = f"the latest sweep is {age} old; the schedule is every {interval}{since_skip}"
            found.append(Need("sweep missing", dag_id, run, "", why, MISSING, at))
        if s.state == "failed":
            found.append(Need("sweep failed", dag_id, run, "", _said(s.why) or "a task failed", FAILED_RUN, at))
        verdicts: dict[str, tuple[Verdict, SweepSummary]] = {}
        for sweep in real:  # oldest first: the latest verdict of each scope stays
            for v in sweep.scopes or []:
                verdicts[v.scope] = (v, sweep)
        for scope, (v, by) in verdicts.items():
            if v.blocking:
                why = "deletes held: " + ", ".join(v.blocking)
                hold = HOLD_ACTIONS.get(v.blocking[0], OTHER_HOLD)
                found.append(Need("scope held", dag_id, by.run_id, scope, why, hold, _at(by)))
        failed = (s.outcomes or {}).get(Result.FAILED, 0)
        if failed:
            found.append(Need("deletions failing", dag_id, run, "", f"{failed} deletes failed", FAILED, at))
        for target, planned in (s.capped or {}).items():
            why = f"{target}: {planned} deletes planned, over max_deletions_per_sweep: nothing deleted"
            found.append(Need("cap reached", dag_id, run, "", why, CAPPED, at))
    return found


def firing(alerts: Iterable[dict[str, object]], runbook_url: str) -> list[Need]:
    """The reaper's alerts that fire (not those pending), each with its labels and summary."""
    found = []
    for a in alerts:
        if a.get("state") != "firing" or not reapers(a, runbook_url):
            continue
        labels, notes = dict(a.get("labels") or {}), dict(a.get("annotations") or {})  # type: ignore[call-overload]  # JSON objects
        name = str(labels.get("alertname", ""))
        where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
        why = f"{labels.get('severity', '')} {notes.get('summary', '')}".strip() + (f" ({where})" if where else "")
        see = Runbook(name, f"Follow the runbook's {name} entry.")
        found.append(Need("alert firing", "", "", str(labels.get("scope", "")), why, see, a.get("activeAt")))
    return found
