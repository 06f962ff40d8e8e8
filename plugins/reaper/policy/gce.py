"""GCE rules (DESIGN.md section 4): heartbeat, TERMINATED and age findings, and the per-project holds.

One pass classifies each in-scope instance and counts the project's census and
budget numbers; only instances with a finding or anomaly (a small minority in a
healthy fleet) are resolved in a second pass, once the project's holds are known.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable

from reaper.config import Mode, Settings
from reaper.model import (
    ACTION_OF_MODE,
    Action,
    Decision,
    Evidence,
    GceInstance,
    Override,
    ScopeVerdict,
    WriterRecord,
)

TARGET = "gce"
KEEP, REPORT, DELETE = Action.KEEP, Action.REPORT, Action.DELETE
_RANK = {KEEP: 0, REPORT: 1, DELETE: 2}
# Holds that turn a heartbeat_stale delete into a report; the other rules ignore them.
HEARTBEAT_HOLDS = ("writer_health_unknown", "writer_unhealthy", "budget_exceeded")

# Upper bounds (seconds) of the heartbeat-age census buckets; a last "+Inf" bucket is implied.
AGE_BUCKETS = (600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 86400, 3 * 86400, 7 * 86400)
BUCKET_LABELS = (*tuple(str(b) for b in AGE_BUCKETS), "+Inf")

# A candidate is (rule, reason, is_finding, held_by_heartbeat_holds). Anomalies are never findings:
# their most is a report, and they belong to the heartbeat rule (DESIGN.md section 3).
_TERMINATED = ("terminated", "terminated", True, False)
_STALE = ("heartbeat_stale", "heartbeat_stale", True, True)
_UNLABELED = ("unlabeled_age", "unlabeled_age", True, False)
_FUTURE = ("heartbeat_stale", "heartbeat_in_future", False, False)
_MALFORMED = ("heartbeat_stale", "heartbeat_malformed", False, False)


def evaluate_gce(
    instances: Iterable[GceInstance],
    evidence: Evidence,
    config: Settings,
    modes: dict[str, Mode],
    now: float,
    override: Override | None,
) -> tuple[list[Decision], list[ScopeVerdict], dict[str, dict[str, object]]]:
    """Decide every in-scope instance; return decisions, per-project verdicts and census."""
    selector = tuple(config.gce.selector.items())
    by_project: dict[str, list[GceInstance]] = defaultdict(list)
    for inst in instances:
        labels = inst.labels
        for key, value in selector:
            if labels.get(key) != value:
                break
        else:
            by_project[inst.project].append(inst)

    writers = _writers_by_project(evidence.writer_health)
    decisions: list[Decision] = []
    verdicts: list[ScopeVerdict] = []
    census: dict[str, dict[str, object]] = {}
    for project in sorted(by_project):
        verdict, project_census = _evaluate_project(
            project, by_project[project], evidence, writers, config, modes, now, override, decisions
        )
        verdicts.append(verdict)
        census[project] = project_census
    return decisions, verdicts, census


def _writers_by_project(records: list[WriterRecord] | None) -> dict[str, list[WriterRecord]] | None:
    if records is None:
        return None
    grouped: dict[str, list[WriterRecord]] = defaultdict(list)
    for record in records:
        grouped[record.project].append(record)
    return grouped


def writer_hold(
    records: list[WriterRecord] | None, config: Settings, now: float
) -> tuple[str | None, list[dict[str, object]]]:
    """The writer-health hold of one project, and the managers that caused it.

    ``records is None`` means the source could not be read: unknown, so hold. A
    project with no records has no live writer: its instances go stale and are
    reaped (a dead manager stops reporting; that is what the reaper is for).
    """
    if records is None:
        return "writer_health_unknown", []
    stale_before = now - config.gce.writer_stale_after.total_seconds()
    future_after = now + config.gce.clock_skew.total_seconds()
    bad = []
    for r in records:
        if r.failing:
            bad.append({"manager": r.manager, "problem": "failing"})
        elif r.last_pass < stale_before:
            bad.append({"manager": r.manager, "problem": "stale", "last_pass": r.last_pass})
        elif r.last_pass > future_after:
            bad.append({"manager": r.manager, "problem": "last_pass_in_future", "last_pass": r.last_pass})
    return ("writer_unhealthy" if bad else None), bad


def _evaluate_project(
    project: str,
    instances: list[GceInstance],
    evidence: Evidence,
    writers: dict[str, list[WriterRecord]] | None,
    config: Settings,
    modes: dict[str, Mode],
    now: float,
    override: Override | None,
    out: list[Decision],
) -> tuple[ScopeVerdict, dict[str, object]]:
    gce = config.gce
    hb_label = gce.heartbeat_label
    opt_key, opt_value = gce.opt_out_label
    quarantine = gce.quarantine.total_seconds()
    future_after = now + gce.clock_skew.total_seconds()
    grace = gce.terminated_grace.total_seconds()
    max_age = gce.unlabeled_max_age.total_seconds()
    protected = project in gce.protected_projects
    append = out.append

    by_status: dict[str, int] = defaultdict(int)
    findings: dict[str, int] = defaultdict(int)
    buckets = [0] * (len(AGE_BUCKETS) + 1)
    age_sum = 0.0
    labeled = stale = 0
    pending: list[tuple[GceInstance, list[tuple[str, str, bool, bool]], dict[str, object]]] = []

    for inst in instances:
        by_status[inst.status] += 1
        labels = inst.labels
        if labels.get(opt_key) == opt_value:
            findings["opt_out"] += 1
            append(Decision(TARGET, inst, KEEP, None, "opt_out"))
            continue
        candidates = []
        raw = labels.get(hb_label)
        age = None
        unlabeled = raw is None
        if unlabeled:
            findings["heartbeat_absent"] += 1
        elif raw.isascii() and raw.isdigit():
            beat = int(raw)
            if beat > future_after:
                findings["heartbeat_in_future"] += 1
                candidates.append(_FUTURE)
            else:
                labeled += 1
                age = now - beat
                age_sum += age
                buckets[bisect_left(AGE_BUCKETS, age)] += 1
                if age > quarantine:
                    stale += 1
                    findings["heartbeat_stale"] += 1
                    candidates.append(_STALE)
        else:
            unlabeled = True
            findings["heartbeat_malformed"] += 1
            candidates.append(_MALFORMED)
        if inst.status == "TERMINATED" and now - (inst.last_stop or inst.created) > grace:
            findings["terminated"] += 1
            candidates.insert(0, _TERMINATED)
        if unlabeled and now - inst.created > max_age:
            findings["unlabeled_age"] += 1
            candidates.append(_UNLABELED)
        if protected:
            append(Decision(TARGET, inst, KEEP, None, "protected_scope"))
        elif candidates:
            pending.append((inst, candidates, {"status": inst.status, "heartbeat": raw, "heartbeat_age_s": age}))
        else:
            append(Decision(TARGET, inst, KEEP, None, "fresh" if age is not None else "no_finding"))

    holds, overridden, details = _project_holds(project, labeled, stale, evidence, writers, config, now, override)
    incomplete = "inventory_incomplete" in holds
    heartbeat_hold = next((h for h in holds if h in HEARTBEAT_HOLDS), None)
    for inst, candidates, facts in pending:
        append(_resolve(inst, candidates, facts, modes, incomplete, heartbeat_hold, holds))

    census: dict[str, object] = {
        "instances": len(instances),
        "by_status": dict(by_status),
        "by_finding": dict(findings),
        "heartbeat_age_seconds": {
            "buckets": dict(zip(BUCKET_LABELS, _cumulative(buckets), strict=True)),
            "sum": age_sum,
            "count": labeled,
        },
    }
    return ScopeVerdict(TARGET, project, holds, overridden, details), census


def _cumulative(counts: list[int]) -> list[int]:
    total, out = 0, []
    for count in counts:
        total += count
        out.append(total)
    return out


def _project_holds(
    project: str,
    labeled: int,
    stale: int,
    evidence: Evidence,
    writers: dict[str, list[WriterRecord]] | None,
    config: Settings,
    now: float,
    override: Override | None,
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, object]]:
    holds: list[str] = []
    overridden: list[str] = []
    if project in config.gce.protected_projects:
        holds.append("protected_scope")
    if (TARGET, project) in evidence.incomplete:
        holds.append("inventory_incomplete")
    writer, bad_writers = writer_hold(None if writers is None else writers.get(project, []), config, now)
    if writer:
        holds.append(writer)
    fraction = stale / labeled if labeled else 0.0
    if budget_tripped(stale, labeled, config):
        (overridden if override else holds).append("budget_exceeded")
    details: dict[str, object] = {
        "labeled": labeled,
        "stale": stale,
        "stale_fraction": round(fraction, 6),
        "unhealthy_writers": bad_writers,
    }
    return tuple(holds), tuple(overridden), details


def budget_tripped(stale: int, total: int, config: Settings) -> bool:
    """DESIGN.md section 4: many stale at once means the writer, not the fleet, is broken."""
    budget = config.budget
    return total > 0 and stale >= budget.min_stale and stale / total > budget.max_stale_fraction


def _resolve(
    inst: GceInstance,
    candidates: list[tuple[str, str, bool, bool]],
    facts: dict[str, object],
    modes: dict[str, Mode],
    incomplete: bool,
    heartbeat_hold: str | None,
    holds: tuple[str, ...],
) -> Decision:
    """Pick the strongest action among the instance's candidates after holds; ties go to the first."""
    best: tuple[Action, str | None, str] | None = None
    for rule, reason, is_finding, holdable in candidates:
        mode = modes[rule]
        if mode is Mode.OFF:
            continue
        action = ACTION_OF_MODE[mode] if is_finding else REPORT
        if action is DELETE:
            if incomplete:
                action, reason = REPORT, "inventory_incomplete"
            elif holdable and heartbeat_hold:
                action, reason = REPORT, heartbeat_hold
        if best is None or _RANK[action] > _RANK[best[0]]:
            best = (action, rule, reason)
    facts["findings"] = [c[1] for c in candidates]
    if holds:
        facts["holds"] = list(holds)
    if best is None:
        return Decision(TARGET, inst, KEEP, candidates[0][0], "rule_off", facts)
    return Decision(TARGET, inst, best[0], best[1], best[2], facts)
