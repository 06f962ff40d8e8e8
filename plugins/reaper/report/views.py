"""The audit view's pages and the what-if report, from plain data (the routes in :mod:`reaper.audit` read it).

Every page shares :mod:`reaper.report.html`'s shell, the charts of :mod:`reaper.report.charts` and the
row of :mod:`reaper.report.rows`, so the plugin and ``reaper evaluate --format html`` look the same.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import quote

import msgspec
from msgspec import UNSET

from reaper.model import Action, place
from reaper.records import ApprovalUse, Census, Stored, SweepSummary, Verdict, verdict_record
from reaper.report.charts import Column, stacked_bars
from reaper.report.html import action, document, facts, link, query, table, text
from reaper.report.oncall import Need
from reaper.report.reasons import explain
from reaper.report.rows import Row, plan_row, when
from reaper.report.timeline import Panel, census_counts, marks
from reaper.transitions import described
from reaper.vocabulary import Reason, Result

if TYPE_CHECKING:
    from reaper.model import Plan
    from reaper.report.queries import History, Recorded
    from reaper.report.reasons import Limits

FILTERS = ("scope", "kind", "rule", "reason", "action", "outcome", "name")
SORTABLE = ("scope", "kind", "location", "name", "uid", "action", "rule", "reason", "execution")
# The per-resource table's headers; those in SORTABLE link to sorting by them.
ROW_HEADERS = ("scope", "kind", "location", "name", "uid", "action", "rule", "reason", "intent", "outcome", "detail")


class Urls(NamedTuple):
    """Where the audit view and Airflow's UI live, seen from the browser (the app's mount point)."""

    root: str  # the plugin's prefix, e.g. /reaper

    def overview(self, **params: object) -> str:
        return query(f"{self.root}/", params)

    def sweep(self, dag_id: str, run_id: str, **params: object) -> str:
        return query(f"{self.root}/sweeps/{quote(dag_id, safe='')}/{quote(run_id, safe='')}", params)

    def export(self, dag_id: str, run_id: str, fmt: str, params: Mapping[str, object]) -> str:
        return query(f"{self.root}/sweeps/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/rows.{fmt}", params)

    def history(self, term: str = "") -> str:
        return query(f"{self.root}/history", {"q": term})

    @staticmethod
    def dag_run(dag_id: str, run_id: str, task_id: str = "") -> str:
        """The DAG run (or one of its tasks: the mapped ``delete`` lists its batches and their logs) in Airflow's UI."""
        run = f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
        return f"{run}/tasks/{quote(task_id, safe='')}/mapped" if task_id else run

    def approve(self, dag_id: str, run_id: str) -> str:
        return f"{self.root}/sweeps/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/approve"

    def approvals(self, dag_id: str, approval_id: str = "") -> str:
        """The approvals of a DAG (one of them, with ``approval_id``: its row)."""
        return f"{self.root}/approvals/{quote(dag_id, safe='')}" + (f"#{anchor(approval_id)}" if approval_id else "")

    @staticmethod
    def dag(dag_id: str) -> str:
        """The DAG's page in Airflow's UI, its Trigger button there: the route ``dags/:dagId`` of Airflow 3's
        ``airflow-core/src/airflow/ui/src/router.tsx``. Airflow 3.3 has no route that opens the Trigger form, nor
        one that fills its conf from the URL (its form prefills only from an earlier run's conf, "Trigger again
        with this config"): the operator types the approval's id (:func:`trigger_help`)."""
        return f"/dags/{quote(dag_id, safe='')}"

    def nav(self) -> list[tuple[str, str]]:
        return [(self.overview(), "Overview"), (self.history(), "Resource history"), ("/", "Airflow")]


# --- rows ---------------------------------------------------------------------------------------


def row_cells(row: Row, urls: Urls | None) -> list[str]:
    """One resource's cells: its name links to its history; the reason's words carry the raw evidence."""
    name = link(urls.history(row.name), row.name) if urls else text(row.name)
    evidence = text(json.dumps(row.evidence, sort_keys=True, default=str))
    why = f'<span title="{evidence}">{text(row.why)}</span><br><code class="muted">{text(row.reason)}</code>'
    outcome = text(row.outcome) + (f'<br><span class="muted">{text(row.outcome_at)}</span>' if row.outcome_at else "")
    return [
        text(row.scope),
        f'<span class="chip">{text(row.kind)}</span>',
        text(row.location),
        name,
        f"<code>{text(row.uid)}</code>",
        action(row.action),
        text(row.rule),
        why,
        text(row.intent_at),
        outcome,
        text(row.detail),
    ]


def rows_table(rows: list[Row], urls: Urls | None, sort_link: Mapping[str, str] | None = None) -> str:
    """The per-resource table; ``sort_link`` maps sortable headers to the URL that sorts by them."""
    headers = [link(sort_link[h], h) if sort_link and h in sort_link else text(h) for h in ROW_HEADERS]
    return table(headers, (row_cells(r, urls) for r in rows), css="rows")


def runs_table(rows: list[Row], urls: Urls | None) -> str:
    """A Kubernetes sweep's rows one per run (consecutive rows of a run, as ordered by run), its objects inside."""
    runs: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        runs.setdefault((r.scope, r.run), []).append(r)
    out = []
    for (scope, run), objects in runs.items():
        inner = table(ROW_HEADERS, (row_cells(r, urls) for r in objects), css="rows")
        summary = ", ".join(f"{n} {a}" for a, n in Counter(r.action for r in objects).items())
        outcomes = ", ".join(f"{n} {o}" for o, n in Counter(r.outcome for r in objects if r.outcome).items())
        reasons = ", ".join(dict.fromkeys(r.why for r in objects))
        details = f"<details><summary>{len(objects)} objects</summary>{inner}</details>"
        out.append(
            [
                text(scope),
                f"<b>{text(run or '(no run label)')}</b>",
                text(summary),
                text(reasons),
                text(outcomes),
                details,
            ]
        )
    return table(["scope", "run", "actions", "why", "outcomes", "objects"], out, css="runs")


# --- the overview ---------------------------------------------------------------------------------


TARGETS = {"gce": "GCE", "k8s": "Kubernetes"}


class Overview(NamedTuple):
    """What the overview shows: the needs (and why alerts are unknown), per target the DAG charted, its
    panels (fleet, and the scope drilled into), the scopes it has, the latest sweep of each DAG, the window."""

    needs: list[Need]
    alerts_unknown: str
    charted: dict[str, str | None]
    panels: list[Panel]
    scopes: dict[str, list[str]]  # each charted DAG's scopes: what its drill-down offers
    scope: str
    latest: dict[str, SweepSummary]
    days: int


def charted_dag(
    target: str, latest: Mapping[str, SweepSummary], expected: Mapping[str, object], asked: str | None
) -> str | None:
    """The DAG whose fleet a target's charts show: the one asked for, else the active phase's, else the one
    of the target swept most recently; None when the target has no sweep to chart."""
    prefix = f"reaper_{target}_"
    if asked and asked.startswith(prefix):
        return asked
    active = next((d for d in expected if d.startswith(prefix)), None)
    if active in latest:
        return active
    swept = [d for d in latest if d.startswith(prefix)]
    return max(swept, key=lambda d: when(latest[d].at)) if swept else None


def runbook_link(base: str, section: str) -> str:
    """A link to a runbook section where the runbook has an address a browser can open, else its path in words."""
    if not section:
        return ""
    href = f"{base}#{section.lower()}"
    return (
        link(href, section, target="_blank")
        if base.startswith(("http://", "https://"))
        else f"<code>{text(href)}</code>"
    )


def needs_table(needs: list[Need], urls: Urls, runbook: str) -> str:
    """The overview's first screen: each thing that needs a human, with its one action and where to act."""
    if not needs:
        return (
            '<p id="needs" class="ok">Nothing needs a human now: every active phase swept on time, no hold blocks '
            "deletes, no delete failed.</p>"
        )
    rows = []
    for n in needs:
        where = link(urls.sweep(n.dag_id, n.run_id), f"{n.dag_id} / {n.run_id}") if n.run_id else text(n.dag_id)
        rows.append(
            [
                f"<b>{text(n.what)}</b>",
                where + (f"<br>scope <b>{text(n.scope)}</b>" if n.scope else ""),
                text(n.why),
                text(n.runbook.action),
                runbook_link(runbook, n.runbook.section),
                text(when(n.at)),
            ]
        )
    return table(["needs", "where", "why", "what to do", "runbook", "since"], rows, css="needs")


def overview_page(view: Overview, newest: list[SweepSummary], urls: Urls, runbook: str) -> str:
    """What needs a human now; then per target a few fleet charts over time, with a drill-down to one scope;
    then the latest sweeps. Every time is UTC."""
    days = view.days
    parts = [
        f"<h1>Reaper, last {days} days</h1>",
        f'<p class="muted">Times are UTC. Days: {" ".join(link(urls.overview(days=n), n) for n in (1, 7, 14, 30))} · '
        f"{link(urls.history(), 'find a resource')} by name, uid or run id.</p>",
        f"<h2>Needs a human now ({len(view.needs)})</h2>",
        needs_table(view.needs, urls, runbook),
    ]
    if view.alerts_unknown:
        parts.append(f'<p class="muted">{text(view.alerts_unknown)}</p>')
    for target, title in TARGETS.items():
        dag_id = view.charted.get(target)
        if dag_id is None:
            continue
        others = sorted(d for d in view.latest if d.startswith(f"reaper_{target}_") and d != dag_id)
        switch = " · ".join(link(urls.overview(days=days, dag_id=d), d) for d in others)
        parts.append(f"<h2>{title}: {text(dag_id)}</h2>")
        if switch:
            parts.append(f'<p class="muted">other DAGs of {title}: {switch}</p>')
        for panel in (p for p in view.panels if p.dag_id == dag_id):
            if panel.scope:
                parts.append(f"<h3>scope {text(panel.scope)}</h3>")
            parts.append('<div class="charts">' + "".join(stacked_bars(t, c) for t, c in panel.charts) + "</div>")
        drill = _select(
            "scope",
            "drill down to a scope",
            view.scope,
            [("", "the whole fleet"), *((s, s) for s in view.scopes[dag_id])],
        )
        parts.append(
            f'<form class="filters" method="get"><input type="hidden" name="days" value="{days}">'
            f'<input type="hidden" name="dag_id" value="{text(dag_id)}">{drill}<button>Show</button></form>'
        )
    if not view.latest:
        parts.append('<p class="muted">No sweep recorded in this window.</p>')
    parts.append("<h2>Latest sweeps</h2>")
    if view.latest:  # each DAG's approvals of held deletes (docs/audit-view.md)
        dags = " · ".join(link(urls.approvals(d), d) for d in sorted(view.latest))
        parts.append(f'<p class="muted" id="approvals">Approvals of held deletes: {dags}</p>')
    parts.append(sweeps_table(newest, urls))
    return document("Reaper sweeps", "".join(parts), urls.nav())


def sweeps_table(summaries: list[SweepSummary], urls: Urls) -> str:
    headers = ["at", "DAG", "run", "exec", "phase", "branch and why", "deleted", "reported", "holds, overrides, cap"]
    rows = []
    for s in summaries:
        reported = sum(d.count for d in s.decisions or [] if d.action == "report")
        rows.append(
            [
                text(when(s.at)),
                text(s.dag_id),
                link(urls.sweep(s.dag_id, s.run_id), s.run_id),
                text(s.execution),
                text(s.phase),
                f"<b>{text(s.branch)}</b> {text(s.why)}",
                text((s.outcomes or {}).get(Result.DELETED, 0)),
                text(reported),
                "<br>".join(text(m) for m in marks(s, None)),
            ]
        )
    return table(headers, rows)


# --- one sweep ------------------------------------------------------------------------------------


# What summary_facts shows in its own words; any other plain value of the summary is listed as it is.
_SHOWN = {
    "at",
    "dag_id",
    "run_id",
    "execution",
    "lease",
    "target",
    "phase",
    "active_phase",
    "branch",
    "why",
    "state",
    "dry_run",
    "triggered_by",
    "outcomes",
    "capped",
    "deletes",
    "stale_plan",
    "stale_inputs",
    "warnings",
    "phase_gate",
    "notifications",
    "approval",
    "override",
}


def summary_facts(s: SweepSummary, urls: Urls | None, unknown: Mapping[str, object] | None = None) -> str:
    """A summary's facts at the top of its page: the branch and why, the state, the phase, the cap, the override.

    Any other plain value the summary carries (how many it left, a metrics push's failures) is listed too, and so
    are those of fields this version has no name for (``unknown``: a worker's hostname, a later version's).
    """
    pairs = [
        ("execution", f"{text(s.execution)} <span class='muted'>lease {text(s.lease)}</span>"),
        ("at", text(when(s.at))),
        ("phase", f"{text(s.phase)} (active phase {text(s.active_phase)})"),
        ("branch", f"<b>{text(s.branch)}</b>: {text(s.why)}"),
        ("state", text(s.state)),
        ("dry run", text("yes" if s.dry_run else "no")),
        ("triggered by", text(s.triggered_by)),
        ("planned deletes", text(s.deletes)),
        ("outcomes", text(", ".join(f"{k} {v}" for k, v in (s.outcomes or {}).items()) or "none")),
        (
            "cap",
            text(", ".join(f"{k}: {v} planned, over the cap" for k, v in (s.capped or {}).items()) or "not reached"),
        ),
    ]
    told = s.notifications
    if told:  # what the owners were told (docs/notifications.md), and what failed
        failed = [n for n in told.notices or [] if not n.ok]
        why = "".join(f"<br>{text(n.channel)} {text(n.event)}: {text(n.error)}" for n in failed)
        error = f"<br>{text(told.error)}" if told.error else ""
        pairs.append(("notifications", f"sent {text(told.sent)}, failed {text(told.failed)}{why}{error}"))
    gate = s.phase_gate
    if gate:
        confirmed = f"confirmed by {gate.user}: {gate.reason or ''}"
        pairs.append(("phase gate", text(confirmed if gate.confirmed else gate.why)))
    if s.approval and urls is not None:
        pairs.append(("approval", approval_record(s.approval, urls, s.dag_id)))
    if s.stale_plan:
        pairs.append(("stale plans refused", text(s.stale_plan)))
    if s.warnings:
        pairs.append(("warnings", "<br>".join(text(w) for w in s.warnings)))
    if s.override:  # a budget override's scopes as a list of names, the scopes it lifted
        fields = msgspec.structs.asdict(s.override).items()
        plain = {k: ", ".join(v) if isinstance(v, list) else v for k, v in fields if v is not UNSET}
        pairs.append(("override", text("; ".join(f"{k}: {v}" for k, v in plain.items()))))
    plain = {key: getattr(s, key) for key in SweepSummary.__struct_fields__ if key not in _SHOWN}
    for key, value in {**plain, **(unknown or {})}.items():
        if isinstance(value, str | int | float | bool):
            pairs.append((key, text(value)))
    if urls is not None:
        pairs.append(
            (
                "in Airflow",
                link(urls.dag_run(s.dag_id, s.run_id), "DAG run", target="_top")
                + " · "
                + link(urls.dag_run(s.dag_id, s.run_id, "delete"), "delete task logs", target="_top"),
            )
        )
    return facts(pairs)


def scopes_table(verdicts: list[Verdict]) -> str:
    """Each scope's verdict: its holds, which of them block a delete, the budget's S and L, and why evidence
    there is unknown (a store that did not prove it is the right one, writer health with no series)."""
    rows = []
    for v in verdicts:
        budget = v.sides()
        if v.stale_fraction is not UNSET:
            budget += f" ({v.stale_fraction:.0%})"
        writers = ", ".join(f"{w.manager} {w.problem}" for w in v.unhealthy_writers or [])
        rows.append(
            [
                text(v.target),
                text(v.scope),
                text(", ".join(v.holds) or "ok"),
                text(", ".join(v.blocking)),
                text(", ".join(v.overridden)),
                text(budget),
                text(writers),
                "<br>".join(text(why) for why in v.unknown_evidence or []),
            ]
        )
    headers = ["target", "scope", "holds", "blocking deletes", "overridden", "budget S / L", "unhealthy writers"]
    return table([*headers, "unknown evidence"], rows)


def _select(name: str, label: str, chosen: str, options: list[tuple[str, str]]) -> str:
    shown = "".join(
        f'<option value="{text(v)}"{" selected" if v == chosen else ""}>{text(words)}</option>' for v, words in options
    )
    return f'<label>{text(label)}<select name="{name}">{shown}</select></label>'


def _filter(name: str, chosen: str, values: list[str]) -> str:
    """A filter of the rows: a choice of the values this sweep has (any other one asked for shown too), or, for
    the name, text that a name holds or a uid."""
    if name == "name":
        return f'<label>name holds, or uid<input name="name" value="{text(chosen)}"></label>'
    values = values if not chosen or chosen in values else [*values, chosen]
    return _select(name, name, chosen, [("", "any"), *((v, v) for v in values)])


def choices(executions: list[SweepSummary]) -> dict[str, list[str]]:
    """The values each filter can take in this sweep, from its summaries: what its choices offer."""
    found: dict[str, set[str]] = {f: set() for f in FILTERS}
    for s in executions:
        for d in s.decisions or []:
            if d.action != "keep":
                for f in ("scope", "rule", "reason", "action"):
                    found[f].add(str(getattr(d, f) or ""))
        found["outcome"] |= set(s.outcomes or {})
        for census in (s.census.k8s or {}).values() if s.census else ():
            found["kind"] |= set(census.by_kind)
        if s.target == "gce":
            found["kind"].add("instance")
    return {f: sorted(v - {""}) for f, v in found.items()}


class Page(NamedTuple):
    """Which rows of the filtered set a page shows."""

    number: int
    size: int
    total: int

    @property
    def last(self) -> int:
        return max(1, -(-self.total // self.size))


def sweep_page(
    executions: list[Recorded],
    rows: list[Row],
    page: Page,
    params: dict[str, str],
    urls: Urls,
    dag_id: str,
    run_id: str,
    held: list[dict[str, object]] | None = None,
    approvals: list[dict[str, object]] | None = None,
    now: float = 0.0,
) -> str:
    """A sweep: each execution's summary and scopes, its held deletes to approve (``held``), the approvals made
    from it (``approvals``, with their items; ``now``: what is expired), the filter form, one page of rows, the
    exports."""
    parts = [f"<h1>{text(dag_id)} / {text(run_id)}</h1>"]
    for s, unknown in executions:
        parts.append(summary_facts(s, urls, unknown))
        parts.append("<h3>scopes</h3>" + scopes_table(s.scopes or []))
    if held:
        parts.append(approval_form(held, urls.approve(dag_id, run_id)))
    if approvals:
        parts.append(
            f'<h2 id="approvals">Approvals from this sweep ({len(approvals)})</h2>'
            + approvals_table(approvals, urls, now)
            + f'<p class="muted">{link(urls.approvals(dag_id), "every approval of " + dag_id)}</p>'
        )
    if not executions:
        parts.append('<p class="muted">No summary recorded (the run failed before its record task).</p>')
        parts.append(link(urls.dag_run(dag_id, run_id), "DAG run in Airflow", target="_top"))
    summaries = [s for s, _ in executions]
    lists = choices(summaries)
    inputs = "".join(_filter(f, params.get(f, ""), lists.get(f, [])) for f in FILTERS)
    kept = ["size"]
    if any(s.target == "k8s" for s in summaries):  # a run's objects together, one row per run
        inputs += _select("order", "rows", params.get("order", ""), [("", "one per object"), ("run", "one per run")])
    else:
        kept.append("order")
    hidden = "".join(f'<input type="hidden" name="{k}" value="{text(params[k])}">' for k in kept if params.get(k))
    parts.append(
        f'<h2>Resources</h2><form class="filters" method="get">{inputs}{hidden}'
        f"<button>Filter</button>{link(urls.sweep(dag_id, run_id), 'clear')}</form>"
    )
    filtered = {k: v for k, v in params.items() if k in FILTERS and v}
    order = params.get("order", "scope")
    sort_link = {
        h: urls.sweep(dag_id, run_id, **filtered, size=params.get("size", ""), order=("-" + h if order == h else h))
        for h in SORTABLE
    }

    def at(n: int) -> str:
        return urls.sweep(dag_id, run_id, **filtered, order=order, size=params.get("size", ""), page=n)

    first = (page.number - 1) * page.size + 1 if page.total else 0
    pager = (
        f'<nav class="pager"><span id="shown">{first}–{min(page.total, page.number * page.size)} of '
        f'<b id="total">{page.total}</b></span>'
        + (link(at(page.number - 1), "‹ previous", rel="prev") if page.number > 1 else "")
        + f"<span>page {page.number} of {page.last}</span>"
        + (link(at(page.number + 1), "next ›", rel="next") if page.number < page.last else "")
        + link(urls.export(dag_id, run_id, "csv", filtered), "export CSV")
        + link(urls.export(dag_id, run_id, "json", filtered), "export JSON")
        + "</nav>"
    )
    grouped = order == "run" and any(r.run for r in rows)
    parts += [pager, runs_table(rows, urls) if grouped else rows_table(rows, urls, sort_link), pager]
    return document(f"Reaper: {dag_id} {run_id}", "".join(parts), urls.nav())


APPROVAL_COLUMNS = ("scope", "kind", "name", "run", "uid", "state", "held by")


def anchor(approval_id: str) -> str:
    """An approval's row on a page: its fragment id."""
    return f"approval-{quote(approval_id, safe='')}"


def trigger_help(dag_id: str, approval_id: str) -> str:
    """How to run an approval: the DAG's Trigger form with the id in its ``approval`` field (or the conf to paste
    as its Configuration JSON), or the CLI. Airflow 3.3 cannot fill the form from a link (:meth:`Urls.dag`)."""
    conf = json.dumps({"approval": approval_id})
    cli = f"airflow dags trigger {dag_id} --conf '{conf}'"
    return (
        f"{link(Urls.dag(dag_id), 'open ' + dag_id, target='_top')}, press Trigger, type "
        f"<code>{text(approval_id)}</code> in its <b>approval</b> field (or paste <code>{text(conf)}</code> as the "
        f"Configuration JSON under Advanced options), Trigger; or run <code>{text(cli)}</code>"
    )


def approval_use(a: Mapping[str, object], urls: Urls, now: float) -> str:
    """Whether an approval was used, and by which run (a link to its sweep), or revoked; how to use it while it
    may be."""
    used, revoked = a.get("used_by"), a.get("revoked")
    gone = (
        f"<b>revoked</b> by {text(revoked.get('user'))}: {text(revoked.get('reason'))} "
        f'<span class="muted">at {text(when(revoked.get("at")))}</span>'
        if isinstance(revoked, dict)
        else ""
    )
    if isinstance(used, dict):
        dag_id, run_id = str(used.get("dag_id")), str(used.get("run_id"))
        return (
            f"used by {link(urls.sweep(dag_id, run_id), run_id)} (execution {text(used.get('execution', 0))}) "
            f'<span class="muted">at {text(when(used.get("at")))}</span>'
            + (f"; {gone} (its batches begun after that send nothing)" if gone else "")
        )
    if gone:
        return gone
    if now >= float(a.get("expires_at") or 0):  # type: ignore[arg-type]  # a number, as the ledger wrote it
        return '<span class="muted">expired unused</span>'
    return "<b>unused</b>: " + trigger_help(str(a.get("dag_id")), str(a.get("id")))


def approvals_table(approvals: list[Stored], urls: Urls, now: float) -> str:
    """Each approval (with its items, :meth:`reaper.ledger.Ledger.approvals_of`): id, who, when, why, expiry, the
    items each with the fingerprint it was approved in, the sweep it came from, and its use. Times are UTC."""
    if not approvals:
        return '<p class="muted">No approval recorded.</p>'
    rows = []
    for a in approvals:
        items = [i for i in a.get("items") or [] if isinstance(i, dict)]
        inner = table(
            ["scope", "kind", "name", "run", "uid", "fingerprint"],
            (
                [text(i.get(k)) for k in ("scope", "kind", "name", "group")]
                + [f"<code>{text(i.get('uid'))}</code>", f"<code>{text(i.get('fingerprint'))}</code>"]
                for i in items
            ),
        )
        dag_id, run_id = str(a.get("dag_id")), str(a.get("run_id"))
        rows.append(
            [
                f'<code id="{text(anchor(str(a.get("id"))))}">{text(a.get("id"))}</code>',
                text(a.get("user")),
                text(when(a.get("created_at"))),
                text(a.get("reason")),
                text(when(a.get("expires_at"))),
                f"<details><summary>{len(items)} items</summary>{inner}</details>",
                link(urls.sweep(dag_id, run_id), run_id),
                approval_use(a, urls, now),
            ]
        )
    return table(["id", "by", "at", "why", "expires", "items", "from sweep", "used"], rows, css="approvals")


def approvals_page(dag_id: str, approvals: list[dict[str, object]], urls: Urls, now: float) -> str:
    """The approvals of one DAG, newest first."""
    body = (
        f"<h1>Approvals of {text(dag_id)}</h1>"
        f'<p class="muted">Times are UTC. Newest {len(approvals)} first; each is used by one run only, and deletes '
        "only its items still in the state shown (docs/audit-view.md).</p>" + approvals_table(approvals, urls, now)
    )
    return document(f"Reaper: approvals of {dag_id}", body, urls.nav())


# What came of an approved item, in words (:func:`reaper.sweep.approved.summary` and ``with_outcomes``); any other
# state is a keep's or an outcome's code (heartbeat_fresh, failed, ...), shown as it is.
ITEM_STATES = {
    Result.DELETED: Result.DELETED.phrase,
    "planned": "planned, no outcome recorded (the run ended first)",
    "not_listed": "not listed by this sweep: gone already, or in a scope it did not sweep",
    Reason.APPROVAL_CHANGED: "changed since the review (labels, status, a stop, or resourceVersion): kept",
    Reason.APPROVAL_RUN_PARTIAL: "its Kubernetes run is not approved and unchanged whole: kept",
    Reason.APPROVAL_EXPIRED: "the approval had expired when the sweep listed: kept",
    Result.CHANGED_SINCE_PLAN: Result.CHANGED_SINCE_PLAN.phrase,
    Result.NOT_ATTEMPTED: Result.NOT_ATTEMPTED.phrase,
}


def approval_record(record: ApprovalUse, urls: Urls, dag_id: str) -> str:
    """A sweep's ``approval`` (the approval it ran under, :func:`reaper.sweep.approved.summary`): who gave it and
    why, from which sweep, and per approved item what came of it (deleted, approval_changed, not_listed, ...)."""
    approval_id, results, source = record.id, record.results, record.from_run
    counts = ", ".join(f"{n} {state}" for state, n in Counter(r.state for r in results).items())
    head = (
        f"{link(urls.approvals(dag_id, approval_id), approval_id)} by {text(record.user)}: "
        f"{text(record.reason)} · from {link(urls.sweep(dag_id, source), source)}"
        f" · expires {text(when(record.expires_at))} · {text(record.items)} items"
        + ("" if record.claimed else " · <b>not used</b> (a dry run, or another execution's inputs)")
        + (" · above max_deletions_per_sweep" if record.above_cap else "")
    )
    inner = table(
        ["scope", "kind", "name", "run", "uid", "approved fingerprint", "what came of it"],
        (
            [
                text(r.scope),
                text(r.kind),
                text(r.name),
                text(r.group),
                f"<code>{text(r.uid)}</code>",
                f"<code>{text(r.fingerprint)}</code>",
                f"<b>{text(r.state)}</b> <span class='muted'>{text(ITEM_STATES.get(r.state, ''))}</span>",
            ]
            for r in results
        ),
        css="approval",
    )
    return f"{head}<br>{text(counts)}<details><summary>per item</summary>{inner}</details>"


def approval_form(held: list[dict[str, object]], action: str) -> str:
    """The held deletes with the state each was listed in (docs/design.md §6), to approve all or some: a POST that
    records the approval and comes back here, to its row among the approvals from this sweep, with how to trigger
    a run with it (:func:`trigger_help`). A candidate recorded without its state (an older sweep) is shown, not
    selectable."""
    head = "<tr><th></th>" + "".join(f"<th>{h}</th>" for h in APPROVAL_COLUMNS) + "</tr>"
    rows = []
    for r in held:
        state = str(r.get("fingerprint") or "")
        reviewed = f"{r.get('scope')}/{r.get('uid')}@{state}"  # the one resource shown, in the state shown: choose()
        box = (
            f'<input type="checkbox" name="item" value="{text(reviewed)}" checked>'
            if state
            else '<span class="muted" title="recorded without its state: not approvable">–</span>'
        )
        cells = [r.get("scope"), r.get("resource_kind"), r.get("name"), r.get("group"), r.get("uid"), state or "?"]
        rows.append(
            f"<tr><td>{box}</td>"
            + "".join(f"<td>{text(c or '')}</td>" for c in cells)
            + f"<td>{text(r.get('held_by'))}</td></tr>"
        )
    expiry = "".join(
        f'<option value="{v}"{" selected" if v == "4h" else ""}>{v}</option>' for v in ("1h", "4h", "12h", "1d", "7d")
    )
    return (
        f'<h2 id="approve">Held deletes ({len(held)})</h2><form method="post" action="{text(action)}" class="approve">'
        '<p class="muted">Each is approved in the state shown (GCE labelFingerprint, and its last stop and suspend '
        "in unix seconds; Kubernetes resourceVersion) and its status: a "
        "run with the approval deletes those still in that state, and nothing else, once. A Kubernetes run is "
        "approved whole.</p>"
        f"<table>{head}{''.join(rows)}</table>"
        '<label>reason <input name="reason" required placeholder="INC-123: managers crash-looped"></label> '
        f'<label>expires in <select name="expires">{expiry}</select></label> '
        "<button>Approve the selected</button></form>"
    )


# --- one resource's history -----------------------------------------------------------------------


def config_error_page(why: str, urls: Urls) -> str:
    """The page in place of every other when the reaper's config cannot be read."""
    body = (
        f"<h1>The reaper's config cannot be read</h1><p>{text(why)}</p><p>Nothing can be shown until it is fixed.</p>"
    )
    return document("Reaper: config error", body, urls.nav())


def history_page(term: str, rows: list[Row], found: History | None, urls: Urls) -> str:
    """A search of the history: each resource found with its story (its transitions, oldest first: first
    seen, kept and why, reported, planned for delete, gone) and its decisions; the sweeps of a run so named."""
    form = (
        '<form class="filters" method="get"><label>name or its prefix, uid, Kubernetes run id or Airflow run id'
        f'<input name="q" value="{text(term)}" size="50"></label><button>Search</button></form>'
    )
    parts = ["<h1>Resource history</h1>", form]
    if found is None:
        return document("Reaper: resource history", "".join(parts), urls.nav())
    if found.sweeps:
        links = (
            link(urls.sweep(str(s["dag_id"]), str(s["run_id"])), f"{s['dag_id']} / {s['run_id']}") for s in found.sweeps
        )
        parts.append("<h2>Sweeps of this run</h2><p>" + " · ".join(dict.fromkeys(links)) + "</p>")
    by_uid: dict[str, list[dict[str, object]]] = {}
    for t in sorted(found.transitions, key=lambda t: str(t.get("at"))):
        by_uid.setdefault(str(t.get("uid")), []).append(t)
    by_uid |= {r.uid: by_uid.get(r.uid, []) for r in rows}
    if not by_uid:
        parts.append(f"<p id='story'>Nothing recorded about {text(term)}</p>")
    if found.more:
        parts.append(f'<p class="muted">More resources match than the {len(by_uid)} shown: give more of the name.</p>')
    for uid, story_of in by_uid.items():
        mine = [r for r in rows if r.uid == uid]
        last = story_of[-1] if story_of else {}
        kind, name = (
            last.get("resource_kind") or (mine[0].kind if mine else ""),
            last.get("name") or (mine[0].name if mine else ""),
        )
        where = last.get("scope") or (mine[0].scope if mine else "")
        run = f" · run {text(last['group'])}" if last.get("group") else ""
        parts.append(
            f'<h2 class="resource"><span class="chip">{text(kind)}</span> {text(name)} '
            f'<code class="muted">{text(uid)}</code> <span class="muted">in {text(where)}{run}</span></h2>'
        )
        parts.append(f"<p class='story'>{text(story(mine)) if mine else 'no decision worth a record'}</p>")
        if story_of:
            parts.append(
                table(
                    ["at", "DAG", "run", "what changed", "why"],
                    (
                        [
                            text(when(t.get("at"))),
                            text(t.get("dag_id")),
                            link(urls.sweep(str(t.get("dag_id")), str(t.get("run_id"))), t.get("run_id")),
                            text(described(t)),
                            text(explain(str(t.get("reason") or ""), t.get("evidence") or {})),  # type: ignore[arg-type]  # an object, as written
                        ]
                        for t in story_of
                    ),
                    css="transitions",
                )
            )
        if mine:
            headers = ["at", "DAG", "run", *ROW_HEADERS]
            cells = (
                [text(r.at), text(r.dag_id), link(urls.sweep(r.dag_id, r.run_id), r.run_id), *row_cells(r, None)]
                for r in mine
            )
            parts.append(table(headers, cells))
    return document("Reaper: resource history", "".join(parts), urls.nav())


def story(rows: list[Row]) -> str:
    """``reported in 6 sweeps, deleted at 2026-11-30 12:04:21 (deleted)``: a resource's rows in one line."""
    reported = len({(r.dag_id, r.run_id, r.execution) for r in rows if r.action == "report"})
    parts = [f"reported in {reported} sweep{'s' if reported != 1 else ''}"]
    for r in sorted((r for r in rows if r.outcome), key=lambda r: r.outcome_at):
        parts.append(f"delete intent at {r.intent_at or '?'}, outcome {r.outcome} at {r.outcome_at}")
    return ", ".join(parts)


def chart_of(scopes: Mapping[str, Mapping[str, int]], title: str) -> str:
    """One chart with a column per scope: a single sweep's (or what-if's) counts side by side."""
    return stacked_bars(title, [Column(scope, dict(values)) for scope, values in scopes.items()], over_time=False)


# --- the what-if report ---------------------------------------------------------------------------


def whatif_page(plan: Plan, limits: Limits | None) -> str:
    """``reaper evaluate --format html``: one self-contained page of what a phase would do, for review."""
    acted = sorted(
        (d for d in plan.decisions if d.action is not Action.KEEP), key=lambda d: place(d.target, d.resource)
    )
    kept = Counter((d.target, d.scope, d.reason) for d in plan.decisions if d.action is Action.KEEP)
    findings: dict[str, Counter[str]] = {}
    reports: dict[str, Counter[str]] = {}
    for d in acted:
        findings.setdefault(d.scope, Counter())[d.rule or "none"] += 1
        if d.action is Action.REPORT:
            reports.setdefault(d.scope, Counter())[d.reason] += 1
    typed = msgspec.convert(plan.census, Census)
    census = {
        scope: census_counts(typed.of(target, scope)) for target, by_scope in plan.census.items() for scope in by_scope
    }
    capped = ", ".join(
        f"{t}: {n} deletes planned, over max_deletions_per_sweep: nothing deleted" for t, n in plan.capped.items()
    )
    parts = [
        f"<h1>What phase {text(plan.phase.value)} would do</h1>",
        facts(
            [
                ("evaluated as of", text(when(plan.now))),
                ("would delete", text(sum(1 for d in acted if d.action is Action.DELETE))),
                ("would report", text(sum(1 for d in acted if d.action is Action.REPORT))),
                ("cap", text(capped or "not reached")),
            ]
        ),
        '<div class="charts">',
        chart_of(census, "census by status or kind"),
        chart_of(findings, "findings by rule"),
        chart_of(reports, "reports by reason"),
        "</div><h2>Scopes</h2>",
        scopes_table([verdict_record(v) for v in plan.scopes]),
        f"<h2>Resources reported or deleted ({len(acted)})</h2>",
        rows_table([plan_row(d, limits) for d in acted], None),
        "<h2>Kept without a finding</h2>",
        table(
            ["target", "scope", "reason", "resources"],
            ([text(t), text(s), text(r), text(n)] for (t, s, r), n in sorted(kept.items())),
        ),
    ]
    return document(f"Reaper what-if: {plan.phase.value}", "".join(parts))
