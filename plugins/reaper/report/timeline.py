"""Sweep summaries over time as chart columns: per DAG its fleet, and one scope on demand.

A summary (the ledger's, one per execution, read as :class:`reaper.records.SweepSummary`) already holds
everything the overview charts: the census per scope, the decisions counted by (scope, rule, reason, action),
the outcomes, each scope's verdict, the override and the cap. So the overview reads summaries only, never a
decision record.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from reaper.records import ScopeCensus, SweepSummary
from reaper.report.charts import Column
from reaper.report.rows import when

MAX_COLUMNS = 120  # more sweeps than this (14 days every 10 min: 2016) share columns


class Panel(NamedTuple):
    """One scope's charts of one DAG (``scope`` empty: the DAG's own, e.g. deletions by outcome)."""

    dag_id: str
    scope: str
    charts: list[tuple[str, list[Column]]]


def census_counts(census: ScopeCensus | None) -> dict[str, int]:
    """A scope's census by status (GCE) or kind (Kubernetes)."""
    return dict(census.counts) if census else {}


def scope_counts(summary: SweepSummary, scope: str) -> dict[str, dict[str, int]]:
    """One sweep's counts for one scope: census, findings by rule, reports by reason."""
    findings: Counter[str] = Counter()
    reports: Counter[str] = Counter()
    for d in summary.decisions or []:
        if d.scope != scope:
            continue
        if d.action in ("report", "delete"):
            findings[d.rule or "none"] += d.count
        if d.action == "report":
            reports[d.reason] += d.count
    return {"census": census_counts(summary.census_of(scope)), "findings": dict(findings), "reports": dict(reports)}


def marks(summary: SweepSummary, scope: str | None) -> tuple[str, ...]:
    """What to flag on the time axis: holds of ``scope`` (every scope's when None), overrides, a run of a phase
    other than the active one (confirmed, or a what-if), the cap."""
    found = []
    for verdict in summary.scopes or []:
        if scope is not None and verdict.scope != scope:
            continue
        sides = f", {verdict.sides()}" if verdict.sides() else ""
        for hold in verdict.holds:
            blocks = " (blocks deletes)" if hold in verdict.blocking else ""
            found.append(f"hold {hold} on {verdict.scope}{blocks}{sides}")
    override = summary.override
    if override:
        applied = " (not applied)" if override.applied is False else ""  # the first records lack it: applied
        lifted = override.scopes  # the scopes whose budget hold it lifts (none recorded before they were)
        on = f" on {', '.join(lifted)}" if lifted else ""
        found.append(f"override by {override.user}{on}: {override.reason}{applied}")
    gate = summary.phase_gate
    if gate:
        if gate.confirmed:
            found.append(f"phase {gate.phase} confirmed by {gate.user}: {gate.reason or ''}")
        else:
            found.append(f"what-if of {gate.phase} (active phase {gate.active}): deleted nothing")
    for target, planned in (summary.capped or {}).items():
        found.append(f"cap: {target} planned {planned} deletes, over max_deletions_per_sweep")
    return tuple(found)


def _buckets(summaries: list[SweepSummary]) -> list[list[SweepSummary]]:
    """Consecutive sweeps in groups, so at most MAX_COLUMNS columns; oldest first."""
    size = max(1, math.ceil(len(summaries) / MAX_COLUMNS))
    return [summaries[i : i + size] for i in range(0, len(summaries), size)]


def panels(summaries: list[SweepSummary], href: dict[tuple[str, str, int], str], scope: str = "") -> list[Panel]:
    """Every DAG's fleet panel from its summaries (any order), and its panel of ``scope`` when one is asked for.

    The fleet panel is a few charts for the whole target, whatever its number of scopes: orphans found
    (reports and deletes) by rule, deletions by outcome, and how many scopes a hold blocks deletes in,
    by hold. A scope's panel drills down: its census, findings by rule and reports by reason. A column
    shared by several sweeps shows the latest one's levels, the sum of their deletions, and all their
    marks; it links to the latest. ``href`` maps (dag_id, run_id, execution) to the sweep's page.
    """
    by_dag: dict[str, list[SweepSummary]] = {}
    for s in sorted(summaries, key=lambda s: (s.dag_id, when(s.at))):
        by_dag.setdefault(s.dag_id, []).append(s)
    out = []
    for dag_id, sweeps in by_dag.items():
        groups = _buckets(sweeps)

        def column(group: list[SweepSummary], values: dict[str, int], of: str | None) -> Column:
            last = group[-1]
            at = href.get((dag_id, last.run_id, last.execution), "")  # noqa: B023
            label = when(last.at)[5:16] + (f" ({len(group)} sweeps)" if len(group) > 1 else "")
            return Column(label, values, at, _marks(group, of))

        deletions = [column(g, dict(sum((Counter(s.outcomes or {}) for s in g), Counter())), None) for g in groups]
        found = [column(g, fleet_counts(g[-1])["found"], None) for g in groups]
        held = [column(g, fleet_counts(g[-1])["held"], None) for g in groups]
        charts = [("orphans found, by rule", found), ("deleted, by outcome", deletions), ("scopes held, by hold", held)]
        out.append(Panel(dag_id, "", charts))
        if scope and any(v.scope == scope for s in sweeps for v in s.scopes or []):
            counts = [(g, scope_counts(g[-1], scope)) for g in groups]
            titles = (
                ("census by status or kind", "census"),
                ("findings by rule", "findings"),
                ("reports by reason", "reports"),
            )
            out.append(Panel(dag_id, scope, [(t, [column(g, c[key], scope) for g, c in counts]) for t, key in titles]))
    return out


def fleet_counts(summary: SweepSummary) -> dict[str, dict[str, int]]:
    """One sweep's counts for its whole target: orphans found by rule, scopes whose deletes a hold blocks."""
    found: Counter[str] = Counter()
    for d in summary.decisions or []:
        if d.action in ("report", "delete"):
            found[d.rule or "none"] += d.count
    held = Counter(h for v in summary.scopes or [] for h in v.blocking[:1])
    return {"found": dict(found), "held": dict(held)}


def scopes_of(summaries: list[SweepSummary]) -> list[str]:
    """Every scope the summaries hold a verdict of: what the overview's drill-down offers."""
    return sorted({v.scope for s in summaries for v in s.scopes or []})


def _marks(group: list[SweepSummary], scope: str | None) -> tuple[str, ...]:
    """The marks of every sweep of a column, each once, with when it was."""
    seen: dict[str, None] = {}
    for s in group:
        for mark in marks(s, scope):
            seen.setdefault(f"{when(s.at)[5:16]} {mark}", None)
    return tuple(seen)
