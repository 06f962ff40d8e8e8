"""Sweep summaries over time as chart columns: per DAG its fleet, and one scope on demand.

A summary (the ledger's, one per execution) already holds everything the overview charts: the census
per scope, the decisions counted by (scope, rule, reason, action), the outcomes, each scope's verdict,
the override and the cap. So the overview reads summaries only, never a decision record.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from reaper.report.charts import Column
from reaper.report.rows import when

MAX_COLUMNS = 120  # more sweeps than this (14 days every 10 min: 2016) share columns


class Panel(NamedTuple):
    """One scope's charts of one DAG (``scope`` empty: the DAG's own, e.g. deletions by outcome)."""

    dag_id: str
    scope: str
    charts: list[tuple[str, list[Column]]]


def census_counts(census: dict[str, object]) -> dict[str, int]:
    """A scope's census by status (GCE) or kind (Kubernetes), or whatever ``by_*`` count a target has."""
    for key in ("by_status", "by_kind"):
        if isinstance(census.get(key), dict):
            return {str(k): int(v) for k, v in census[key].items()}  # type: ignore[union-attr]
    by = next((v for k, v in census.items() if k.startswith("by_") and isinstance(v, dict)), None)
    return {str(k): int(v) for k, v in by.items()} if by else {}


def scope_counts(summary: dict[str, object], scope: str) -> dict[str, dict[str, int]]:
    """One sweep's counts for one scope: census, findings by rule, reports by reason."""
    target = str(summary.get("target", ""))
    census = ((summary.get("census") or {}).get(target) or {}).get(scope) or {}  # type: ignore[union-attr]
    findings: Counter[str] = Counter()
    reports: Counter[str] = Counter()
    for d in summary.get("decisions") or []:  # type: ignore[union-attr]
        if d.get("scope") != scope:
            continue
        if d.get("action") in ("report", "delete"):
            findings[str(d.get("rule") or "none")] += int(d.get("count", 0))
        if d.get("action") == "report":
            reports[str(d.get("reason"))] += int(d.get("count", 0))
    return {"census": census_counts(census), "findings": dict(findings), "reports": dict(reports)}


def marks(summary: dict[str, object], scope: str | None) -> tuple[str, ...]:
    """What to flag on the time axis: holds of ``scope`` (every scope's when None), overrides, a run of a phase
    other than the active one (confirmed, or a what-if), the cap."""
    found = []
    for verdict in summary.get("scopes") or []:  # type: ignore[union-attr]
        if scope is not None and verdict.get("scope") != scope:
            continue
        for hold in verdict.get("holds") or []:
            blocks = " (blocks deletes)" if hold in (verdict.get("blocking") or []) else ""
            found.append(f"hold {hold} on {verdict.get('scope')}{blocks}{_sl(verdict)}")
    for key, value in summary.items():
        if key.startswith("override") and isinstance(value, dict):
            applied = "" if value.get("applied", True) else " (not applied)"
            lifted = value.get("scopes")  # the scopes whose budget hold it lifts (none recorded before they were)
            on = f" on {', '.join(map(str, lifted))}" if isinstance(lifted, list) and lifted else ""
            found.append(f"{key} by {value.get('user', '?')}{on}: {value.get('reason', '')}{applied}")
    gate = summary.get("phase_gate")
    if isinstance(gate, dict):
        if gate.get("confirmed"):
            found.append(f"phase {gate.get('phase')} confirmed by {gate.get('user', '?')}: {gate.get('reason', '')}")
        else:
            found.append(f"what-if of {gate.get('phase')} (active phase {gate.get('active')}): deleted nothing")
    for target, planned in (summary.get("capped") or {}).items():  # type: ignore[union-attr]
        found.append(f"cap: {target} planned {planned} deletes, over max_deletions_per_sweep")
    return tuple(found)


def _sl(verdict: dict[str, object]) -> str:
    """The budget's two sides where the verdict has them: S stale of L labeled (GCE), orphaned of managed runs."""
    if "stale" in verdict and "labeled" in verdict:
        return f", S {verdict['stale']} / L {verdict['labeled']}"
    if "orphaned_runs" in verdict and "managed_runs" in verdict:
        return f", S {verdict['orphaned_runs']} / L {verdict['managed_runs']} runs"
    return ""


def _buckets(summaries: list[dict[str, object]]) -> list[list[dict[str, object]]]:
    """Consecutive sweeps in groups, so at most MAX_COLUMNS columns; oldest first."""
    size = max(1, math.ceil(len(summaries) / MAX_COLUMNS))
    return [summaries[i : i + size] for i in range(0, len(summaries), size)]


def panels(summaries: list[dict[str, object]], href: dict[tuple[str, str, int], str], scope: str = "") -> list[Panel]:
    """Every DAG's fleet panel from its summaries (any order), and its panel of ``scope`` when one is asked for.

    The fleet panel is a few charts for the whole target, whatever its number of scopes: orphans found
    (reports and deletes) by rule, deletions by outcome, and how many scopes a hold blocks deletes in,
    by hold. A scope's panel drills down: its census, findings by rule and reports by reason. A column
    shared by several sweeps shows the latest one's levels, the sum of their deletions, and all their
    marks; it links to the latest. ``href`` maps (dag_id, run_id, execution) to the sweep's page.
    """
    by_dag: dict[str, list[dict[str, object]]] = {}
    for s in sorted(summaries, key=lambda s: (str(s.get("dag_id")), when(s.get("at")))):
        by_dag.setdefault(str(s["dag_id"]), []).append(s)
    out = []
    for dag_id, sweeps in by_dag.items():
        groups = _buckets(sweeps)

        def column(group: list[dict[str, object]], values: dict[str, int], of: str | None) -> Column:
            last = group[-1]
            at = href.get((dag_id, str(last["run_id"]), int(last.get("execution") or 0)), "")  # noqa: B023
            label = when(last.get("at"))[5:16] + (f" ({len(group)} sweeps)" if len(group) > 1 else "")
            return Column(label, values, at, _marks(group, of))

        deletions = [
            column(g, dict(sum((Counter(s.get("outcomes") or {}) for s in g), Counter())), None) for g in groups
        ]
        found = [column(g, fleet_counts(g[-1])["found"], None) for g in groups]
        held = [column(g, fleet_counts(g[-1])["held"], None) for g in groups]
        charts = [("orphans found, by rule", found), ("deleted, by outcome", deletions), ("scopes held, by hold", held)]
        out.append(Panel(dag_id, "", charts))
        if scope and any(v.get("scope") == scope for s in sweeps for v in s.get("scopes") or []):  # type: ignore[union-attr]
            counts = [(g, scope_counts(g[-1], scope)) for g in groups]
            titles = (
                ("census by status or kind", "census"),
                ("findings by rule", "findings"),
                ("reports by reason", "reports"),
            )
            out.append(Panel(dag_id, scope, [(t, [column(g, c[key], scope) for g, c in counts]) for t, key in titles]))
    return out


def fleet_counts(summary: dict[str, object]) -> dict[str, dict[str, int]]:
    """One sweep's counts for its whole target: orphans found by rule, scopes whose deletes a hold blocks."""
    found: Counter[str] = Counter()
    for d in summary.get("decisions") or []:  # type: ignore[union-attr]
        if d.get("action") in ("report", "delete"):
            found[str(d.get("rule") or "none")] += int(d.get("count", 0))
    held = Counter(str(h) for v in summary.get("scopes") or [] for h in (v.get("blocking") or [])[:1])  # type: ignore[union-attr]
    return {"found": dict(found), "held": dict(held)}


def scopes_of(summaries: list[dict[str, object]]) -> list[str]:
    """Every scope the summaries hold a verdict of: what the overview's drill-down offers."""
    return sorted({str(v.get("scope")) for s in summaries for v in s.get("scopes") or []})  # type: ignore[union-attr]


def _marks(group: list[dict[str, object]], scope: str | None) -> tuple[str, ...]:
    """The marks of every sweep of a column, each once, with when it was."""
    seen: dict[str, None] = {}
    for s in group:
        for mark in marks(s, scope):
            seen.setdefault(f"{when(s.get('at'))[5:16]} {mark}", None)
    return tuple(seen)
