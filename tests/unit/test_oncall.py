"""What needs a human now (``reaper.report.oncall``): read from the sweeps that ran for real."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reaper.records import SweepSummary, summary_of
from reaper.report.oncall import HOLD_ACTIONS, needs

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DAG = "reaper_gce_enforcement"
EVERY = {DAG: timedelta(minutes=10)}


def _sweep(run: str, minutes_ago: float, **fields: object) -> SweepSummary:
    at = NOW - timedelta(minutes=minutes_ago)
    return summary_of({"dag_id": DAG, "run_id": run, "at": at, "state": "success", **fields})


HELD = _sweep(
    "scheduled__1",
    5,
    scopes=[
        {"scope": "ci-a", "holds": ["budget_exceeded"], "blocking": ["budget_exceeded"]},
        {"scope": "ci-b", "holds": [], "blocking": []},
    ],
    outcomes={"failed": 7},
)


def test_a_held_scope_and_failing_deletes_need_a_human_with_the_runbooks_action() -> None:
    found = needs({DAG: [HELD]}, EVERY, NOW)
    assert [(n.what, n.scope) for n in found] == [("scope held", "ci-a"), ("deletions failing", "")]
    assert found[0].runbook == HOLD_ACTIONS["budget_exceeded"] and found[0].runbook.section == "ReaperBudgetHold"


def test_a_later_skipped_run_or_dry_run_of_some_scopes_hides_nothing() -> None:
    # Review finding: only the latest summary was read, whatever it was.
    skipped = _sweep("scheduled__2", 1, state="skipped", why="another gce sweep holds the sweep lease; skipped")
    dry = _sweep("manual__3", 0.5, dry_run=True, scopes=[{"scope": "ci-a", "holds": [], "blocking": []}])
    assert {n.what for n in needs({DAG: [HELD, skipped, dry]}, EVERY, NOW)} == {"scope held", "deletions failing"}


def test_a_run_of_some_scopes_leaves_the_others_verdicts_standing() -> None:
    only_b = _sweep("manual__4", 1, scopes=[{"scope": "ci-b", "holds": [], "blocking": []}], outcomes={})
    found = needs({DAG: [HELD, only_b]}, EVERY, NOW)
    assert [(n.what, n.scope, n.run_id) for n in found] == [("scope held", "ci-a", "scheduled__1")]


def test_skipped_runs_do_not_hide_a_missing_sweep() -> None:
    old = _sweep("scheduled__1", 45)
    skips = [_sweep(f"scheduled__{i}", 45 - 10 * i, state="skipped", why="lease held") for i in range(1, 5)]
    (missing,) = needs({DAG: [old, *skips]}, EVERY, NOW)
    assert missing.what == "sweep missing" and "45 min old" in missing.why and "skipped: lease held" in missing.why
    assert needs({DAG: skips}, EVERY, NOW)[0].what == "no sweep"
    assert needs({DAG: [old]}, {DAG: timedelta(0)}, NOW) == []  # triggered by hand only: never missing


def test_a_failed_or_capped_sweep_needs_a_human() -> None:
    failed = _sweep("scheduled__5", 1, state="failed", why="list_inventory failed", capped={"gce": 900})
    assert [n.what for n in needs({DAG: [failed]}, EVERY, NOW)] == ["sweep failed", "cap reached"]


def test_a_summary_that_does_not_decode_is_a_need_of_its_own() -> None:
    """One summary of a type no version wrote (``blocking: null``) fails alone: the others are read, and it is
    listed as a need, never the whole overview's error."""
    from reaper.report.oncall import readable

    good = {"dag_id": DAG, "run_id": "scheduled__1", "at": NOW, "state": "success"}
    bad = {**good, "run_id": "scheduled__2", "scopes": [{"scope": "ci-a", "blocking": None}]}
    typed, unreadable = readable([good, bad])
    assert [s.run_id for s in typed] == ["scheduled__1"]
    ((what, dag_id, run_id, *_),) = unreadable
    assert (what, dag_id, run_id) == ("summary unreadable", DAG, "scheduled__2")
