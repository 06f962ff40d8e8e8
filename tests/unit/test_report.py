"""What the audit view and the what-if report show: reasons in words, rows, charts, the overview's columns."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest

from reaper.cli import main
from reaper.config import Settings
from reaper.durations import duration
from reaper.records import SweepSummary, summary_of
from reaper.report.charts import Column, stacked_bars
from reaper.report.reasons import Limits, explain
from reaper.report.rows import ledger_rows, resource_kind
from reaper.report.timeline import MAX_COLUMNS, panels
from reaper.vocabulary import Reason
from tests.unit.test_cli import INPUTS, NOW


@pytest.mark.parametrize("phase", ["report-only", "enforcement"])
def test_the_samples_decisions_all_read_as_sentences(phase: str) -> None:
    out = io.StringIO()
    assert main(["evaluate", "--now", NOW, "--phase", phase, "--format", "json", *INPUTS], out=out) == 0
    limits = Limits.of(Settings())
    for d in json.loads(out.getvalue())["decisions"]:
        words = explain(d["reason"], d["evidence"], limits)
        assert d["reason"] in set(Reason) and words != d["reason"] and not words.startswith(d["reason"] + " ("), d


def test_sentences_quote_the_evidence_and_the_thresholds() -> None:
    limits = Limits.of(Settings())
    stale = {"heartbeat": "1", "heartbeat_age_s": 5 * 3600 + 12 * 60 + 7, "status": "RUNNING"}
    assert explain("heartbeat_stale", stale, limits) == "heartbeat 5 h 12 min old, quarantine 4 h"
    assert explain("heartbeat_stale", stale) == "heartbeat 5 h 12 min old"  # no config: no threshold
    failed: dict[str, object] = {"run": "r1", "lease": "absent", "store": "terminal", "status": "failed"}
    assert explain("sandbox_orphan", failed) == "run r1: lease absent, run store says terminal (failed): an orphan"
    young = {"run": "r2", "youngest_age_s": 61}
    assert explain("min_age", young, limits) == "run r2: youngest object 1 min 1 s old, minimum age 5 min"
    assert "10 min" in explain("terminated", {"status": "TERMINATED"}, limits)


def test_an_unknown_code_or_odd_evidence_shows_the_code_and_facts() -> None:
    assert explain("brand_new_hold", {"why": "x", "empty": None}) == "brand_new_hold (why=x)"
    assert explain("results_not_durable", {"steps": "not a dict", "run": "r"}).startswith("run r: lease absent")
    assert explain(None, None) == "no reason"


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(0, "0 s"), (45, "45 s"), (3600, "1 h"), (18727, "5 h 12 min"), (90061, "1 d 1 h"), (86405, "1 d"),
     (-90, "-1 min 30 s"), (float("nan"), "unknown"), ("x", "unknown")],
)  # fmt: skip
def test_duration(seconds: object, words: str) -> None:
    assert duration(seconds) == words


def test_a_row_joins_its_own_executions_intent_and_outcome() -> None:
    at = datetime(2026, 11, 30, 12, 4, 21, 123456, tzinfo=UTC)
    ids = {"dag_id": "d", "run_id": "r", "target": "k8s", "scope": "kube", "uid": "u1"}
    decision = {**ids, "execution": 1, "lease": "b", "kind": "decision", "action": "delete", "name": "sb-4",
                "location": "ci", "reason": "sandbox_orphan", "evidence": {"run": "4"}}  # fmt: skip
    earlier = {**ids, "execution": 0, "lease": "a", "kind": "outcome", "action": "outcome", "result": "failed"}
    intent = {**ids, "execution": 1, "lease": "b", "kind": "intent", "action": "delete_intent", "name": "Pod/ci/sb-4",
              "at": at}  # fmt: skip
    outcome = {**intent, "kind": "outcome", "action": "outcome", "result": "deleted", "detail": "", "at": at}
    (row,) = ledger_rows([decision], [earlier, intent, outcome])
    assert (row.kind, row.name, row.location, row.outcome, row.outcome_at) == (
        "Pod",
        "sb-4",
        "ci",
        "deleted",
        "2026-11-30 12:04:21 UTC",
    )
    assert row.why.startswith("run 4: lease absent")
    assert (
        resource_kind({"target": "gce"}) == "instance"
        and resource_kind({"resource_kind": "InstanceGroupManager"}) == "InstanceGroupManager"
    )


class _Columns(HTMLParser):
    """The ``data-values`` of every column of a chart, and the hrefs they link to."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[dict[str, int]] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("class") == "col":
            self.values.append(json.loads(found["data-values"] or "{}"))
            self.hrefs.append(found.get("href") or "")


def _columns(svg: str) -> _Columns:
    parsed = _Columns()
    parsed.feed(svg)
    return parsed


def test_a_chart_has_a_linked_column_per_bar_and_escapes_labels() -> None:
    chart = stacked_bars("t", [Column("a<b>", {"x": 2}, "/s/1", ("hold <h>",)), Column("c", {"x": 1, "y": 3})])
    parsed = _columns(chart)
    assert parsed.values == [{"x": 2}, {"x": 1, "y": 3}] and parsed.hrefs == ["/s/1", ""]
    assert "a<b>" not in chart and "hold &lt;h&gt;" in chart
    assert "nothing recorded" in stacked_bars("t", [])


def _summary(at: datetime, run: str, stale: int, deleted: int, holds: tuple[str, ...] = ()) -> SweepSummary:
    """A GCE sweep's summary of project p1: ``stale`` of 10 instances, reported (held) or deleted."""
    reason, action = ("budget_exceeded", "report") if holds else ("heartbeat_stale", "delete")
    return summary_of({
        "dag_id": "reaper_gce_enforcement", "run_id": run, "execution": 0, "target": "gce", "at": at,
        "census": {"gce": {"p1": {"by_status": {"RUNNING": 10 - stale, "TERMINATED": stale}}}},
        "decisions": [{"target": "gce", "scope": "p1", "rule": "heartbeat_stale", "reason": reason,
                       "action": action, "count": stale}],
        "outcomes": {"deleted": deleted},
        "scopes": [{"scope": "p1", "holds": list(holds), "labeled": 10, "stale": stale}],
    })  # fmt: skip


def test_overview_panels_chart_the_fleet_and_one_scope_on_demand_with_holds_marked() -> None:
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    sweeps = [_summary(t0, "r1", 2, 2), _summary(t0 + timedelta(minutes=10), "r2", 6, 0, ("budget_exceeded",))]
    sweeps[1].scopes[0].blocking.append("budget_exceeded")
    (fleet,) = panels(sweeps, {("reaper_gce_enforcement", "r2", 0): "/s/r2"})  # no scope asked for: the fleet only
    found, deleted, held = (columns for _, columns in fleet.charts)
    assert fleet.scope == "" and [c.values for c in deleted] == [{"deleted": 2}, {}]
    assert [c.values for c in found] == [{"heartbeat_stale": 2}, {"heartbeat_stale": 6}]
    assert [c.values for c in held] == [{}, {"budget_exceeded": 1}]
    _, scope = panels(sweeps, {("reaper_gce_enforcement", "r2", 0): "/s/r2"}, "p1")
    census, findings, reports = (columns for _, columns in scope.charts)
    assert [c.values for c in census] == [{"RUNNING": 8, "TERMINATED": 2}, {"RUNNING": 4, "TERMINATED": 6}]
    assert [c.values for c in findings] == [{"heartbeat_stale": 2}, {"heartbeat_stale": 6}]
    assert [c.values for c in reports] == [{}, {"budget_exceeded": 6}]
    assert reports[0].marks == ()
    assert reports[1].marks == ("11-30 00:10 hold budget_exceeded on p1 (blocks deletes), S 6 / L 10",)
    assert census[1].href == "/s/r2" and census[0].href == ""
    assert len(panels(sweeps, {}, "no-such-scope")) == 1  # a scope the sweeps never had: no panel


def test_many_sweeps_share_columns_levels_from_the_latest_deletions_summed() -> None:
    t0 = datetime(2026, 11, 16, tzinfo=UTC)
    sweeps = [_summary(t0 + timedelta(minutes=10 * i), f"r{i}", i % 5, 1) for i in range(2016)]  # 14 days
    fleet, scope = panels(sweeps, {}, "p1")
    deletions = fleet.charts[1][1]
    assert len(deletions) <= MAX_COLUMNS and sum(c.values["deleted"] for c in deletions) == 2016
    census = scope.charts[0][1]
    assert census[-1].values == {"RUNNING": 10 - 2015 % 5, "TERMINATED": 2015 % 5}


def test_whatif_report_is_one_self_contained_page_with_the_table_and_charts() -> None:
    out, table = io.StringIO(), io.StringIO()
    assert main(["evaluate", "--now", NOW, "--phase", "enforcement", "--format", "html", *INPUTS], out=out) == 0
    main(["evaluate", "--now", NOW, "--phase", "enforcement", "--format", "json", *INPUTS], out=table)
    page = out.getvalue()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<script" not in page  # nothing fetched
    plan = json.loads(table.getvalue())
    acted = [d for d in plan["decisions"] if d["action"] != "keep"]
    assert f"Resources reported or deleted ({len(acted)})" in page
    assert all(f"<code>{d['uid']}</code>" in page for d in acted)
    assert "heartbeat 6 h old, quarantine 4 h" in page  # a-stale, in words
    census = _columns(page).values  # the first chart's columns first: the census, a column per scope
    assert census[0] == plan["census"]["gce"]["ci-runners-a"]["by_status"]
    assert census[3] == plan["census"]["k8s"]["default"]["by_kind"]
