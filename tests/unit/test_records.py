"""The ledger's typed records (reaper/records.py) write exactly the documents written before them, and read every
document the ledger holds, older ones included (docs/design.md §7).

"Exactly": the same BSON bytes, so the same keys in the same order with the same values and types. The documents
"as written before" are built here as the dict-building writers built them, from the same inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bson
import msgspec

from reaper.model import Action, Plan
from reaper.records import (
    Census,
    DecisionRecord,
    DeleteDecision,
    Intent,
    Outcome,
    OverrideRecord,
    PhaseGate,
    ReportDecision,
    SweepSummary,
    document,
    summary_of,
)
from reaper.sweep import steps
from reaper.sweep.deletes import intent, outcome_records
from reaper.sweep.overrides import Overrides
from reaper.sweep.targets import GceTarget
from reaper.transitions import group_of
from reaper.vocabulary import RecordAction, Result
from tests.builders import FLEETING, D, M, group, inst, obj, plan, sandbox, settings
from tests.unit.test_steps import LEASE, FakeLedger, plan_through, stale_fleet, sweep

Record = DeleteDecision | ReportDecision | Intent | Outcome
IDS = {"dag_id": "reaper_gce_enforcement", "run_id": "manual__1", "execution": 0, "lease": "tok"}


def same_bytes(written: dict[str, Any], before: dict[str, Any]) -> bool:
    return bson.encode(written) == bson.encode(before)


def stored(doc: dict[str, object]) -> dict[str, object]:
    """A document as MongoDB hands it back."""
    return bson.decode(bson.encode(doc))


def decisions_before(
    ids: dict[str, object], p: Plan, raised: dict[str, object] | None, gate: dict[str, object] | None, run_label: str
) -> list[dict[str, object]]:
    """The decision records as ``record_decisions`` built them as dicts, with no approval; ``raised``: a raised
    cap's override record, which every decision carried."""
    from reaper.approvals import fingerprint_of

    return [
        {
            **ids,
            "target": d.target,
            "scope": d.resource.scope,
            "uid": d.resource.uid,
            "action": d.action.value,
            "kind": "decision",
            "rule": d.rule,
            "reason": d.reason,
            "name": d.resource.name,
            "location": d.resource.location,
            "resource_kind": d.resource.kind,
            **({"fingerprint": fp} if (fp := fingerprint_of(d.resource)) else {}),
            **({"group": run} if (run := group_of(d.resource, run_label)) else {}),
            "evidence": d.evidence,
            **({"override": raised} if raised else {}),
            **({"phase_gate": gate} if gate else {}),
        }
        for d in p.recorded
        if d.action is not Action.KEEP
    ]


def test_decision_records_are_the_documents_written_before_and_round_trip() -> None:
    gce = plan([inst(hb_age=D), inst(hb_age=D, project="p2"), inst(hb="soon")])
    k8s = plan([*sandbox("r1"), obj("Secret", None)])
    # The override and phase gate records as the dict writers before them wrote them, key for key.
    raised = {"reason": "INC-1", "user": "sre", "budget": False, "max_deletions": 9, "applied": True}
    gate = {"phase": "enforcement", "active": "report-only", "user": "sre", "reason": "INC-1", "confirmed": True}
    gate["why"] = "enforcement confirmed by sre"
    config = settings()
    for p, overrides, confirmed in (
        (gce, Overrides(budget=None, max_deletions=500, record=None), False),
        (k8s, Overrides(budget=None, max_deletions=9, record=msgspec.convert(raised, OverrideRecord)), True),
    ):
        terms = steps.Terms(overrides, msgspec.convert(gate, PhaseGate) if confirmed else None, confirmed, False, False)
        ledger = FakeLedger()
        steps.record_decisions(ledger, steps.Ids(**IDS), p, config, terms)  # type: ignore[arg-type]  # the fake
        before = decisions_before(
            IDS, p, raised if confirmed else None, gate if confirmed else None, config.k8s.run_label
        )
        assert {r["action"] for r in before} == {"delete", "report"}
        assert len(ledger.records) == len(before)
        for written, old in zip(ledger.records, before, strict=True):
            assert same_bytes(written, old), (written, old)
            assert same_bytes(document(msgspec.convert(stored(old), Record)), old)  # and back
    typed = msgspec.convert(stored(before[0]), Record)
    assert isinstance(typed, DecisionRecord) and typed.kind == "decision" and typed.group == "r1"


def test_intent_and_outcome_records_are_the_documents_written_before_and_round_trip() -> None:
    target = GceTarget(settings())
    vm = inst(name="vm-1")

    def before(action: RecordAction, extra: dict[str, object]) -> dict[str, object]:
        head = {**IDS, "target": "gce", "scope": vm.scope, "uid": vm.uid, "action": action, "kind": action.kind}
        return {**head, "name": target.record_name(vm), **extra}

    cases = [
        (intent(IDS, target, vm), before(RecordAction.DELETE_INTENT, {})),
        (intent(IDS, target, vm, sent=True), before(RecordAction.DELETE_INTENT, {"sent": True})),
        (
            outcome_records(IDS, target, Result.DELETED, [(vm, "")])[0],
            before(RecordAction.OUTCOME, {"result": Result.DELETED, "detail": ""}),
        ),
    ]
    for record, old in cases:
        assert same_bytes(document(record), old), (document(record), old)
        assert msgspec.convert(stored(old), Record) == record
    assert "sent" not in document(intent(IDS, target, vm))  # a retried intent never lowers an earlier try's mark


def test_a_summary_is_the_document_written_before_and_round_trips(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    planned = plan_through(s, {"dry_run": True})
    branch = steps.budget_check(planned.summary)
    steps.record(s, planned.summary, branch, 0, [], LEASE)
    (written,) = s.ledger().summaries
    before = {  # as ``record`` built it: the plan's summary as builtins, the quotas re-merged
        **s.under(LEASE).fields(),
        "target": "gce",
        "phase": "enforcement",
        "active_phase": "enforcement",
        **msgspec.structs.asdict(branch),
        "outcomes": {},
        **msgspec.to_builtins(planned.summary),
        "quota": msgspec.to_builtins(planned.summary.quota),
        "stale_plan": 0,
        "state": "success",
    }
    assert same_bytes(written, before)
    typed = summary_of(stored(before))
    assert same_bytes(document(typed), before)
    assert typed.census_of("p1") is not None and typed.census_of("p1").counts == {"RUNNING": 2}


def test_a_skipped_summary_has_the_keys_and_values_written_before(tmp_path: Path) -> None:
    skipped = {**IDS, "lease": "", "target": "gce", "phase": "enforcement", "state": "skipped", "why": "held"}
    typed = summary_of(skipped)
    assert typed.outcomes is msgspec.UNSET and typed.census is msgspec.UNSET
    # The same document; only its $set names ``why`` before ``state`` (MongoDB orders a $set's new fields itself).
    assert document(typed) == skipped


def test_every_census_round_trips_typed() -> None:
    gce = plan([inst(hb_age=M), inst(hb_age=D), group()], config=settings(gce={"group_selector": FLEETING}))
    k8s = plan(sandbox("a") + sandbox("b"))
    for p in (gce, k8s):
        census = msgspec.convert(p.census, Census)
        assert same_bytes(msgspec.to_builtins(census), p.census)
    assert msgspec.convert(gce.census, Census).of("gce", "p1").groups.listed == 1
    assert msgspec.convert(k8s.census, Census).of("k8s", "c1").counts == {"Pod": 2, "Secret": 4, "NetworkPolicy": 2}
    assert msgspec.convert(k8s.census, Census).of("gce", "c1") is None


def test_a_summary_written_before_the_newer_fields_still_reads() -> None:
    """A summary of an older reaper: no active_phase, max_deletions, left, resolution, quota, phase_gate,
    approval or stale_plan; a census without heartbeat ages or findings; Mongo's ``_id`` beside them."""
    old = {
        "_id": "65f0c0ffee",
        **IDS,
        "target": "gce",
        "phase": "enforcement",
        "branch": "delete",
        "why": "1 deletes",
        "outcomes": {"deleted": 1},
        "decisions": [dict(target="gce", scope="p1", rule="terminated", reason="terminated", action="delete", count=1)],
        "kept": {"fresh": 3},
        "scopes": [{"target": "gce", "scope": "p1", "verdict": "ok", "holds": [], "blocking": [], "overridden": []}],
        "capped": {},
        "census": {"gce": {"p1": {"instances": 4, "by_status": {"RUNNING": 3, "TERMINATED": 1}}}},
        "override": None,
        "triggered_by": "scheduler",
        "dry_run": False,
        "stale_inputs": False,
        "warnings": [],
        "hygiene": {},
        "incomplete": {},
        "deletes": 1,
        "plan": {"execution": 0, "token": "tok", "config": "abc"},
        "state": "success",
    }
    typed = summary_of(old)
    assert isinstance(typed, SweepSummary) and typed.decisions and typed.decisions[0].count == 1
    assert typed.left is msgspec.UNSET and typed.quota is msgspec.UNSET and typed.stale_plan is msgspec.UNSET
    census = typed.census_of("p1")
    assert census is not None and census.findings == {} and census.counts["TERMINATED"] == 1
    assert typed.verdict("p1").verdict == "ok" and typed.verdict("p9").holds == [] and typed.verdict("p9").scope == "p9"


def test_a_summarys_override_gate_approval_and_notices_are_the_documents_the_dict_writers_wrote() -> None:
    """Each sub-record as ``run_overrides``, ``phase_gate``, ``approved.summary`` and ``notices.send`` wrote it
    when they built dicts, in their key order: read typed, written again byte for byte; and what the views read."""
    item = {"scope": "p1", "uid": "9", "fingerprint": "fp", "name": "vm", "kind": "instance", "group": ""}
    item |= {"rule": "heartbeat_stale", "status": "RUNNING", "state": "deleted"}
    approval = {"id": "ap-1", "user": "alice", "reason": "INC-7", "expires_at": 1.7e9, "from_run": "scheduled__1"}
    approval |= {"items": 1, "max_deletions": 1, "above_cap": False, "claimed": True, "results": [item]}
    sent = {"channel": "mail-0", "event": "failed", "ok": False, "error": "refused"}
    variants = [
        {
            "override": {"reason": "INC-7", "user": "sre", "budget": True, "scopes": ["p1"], "applied": True},
            "phase_gate": {"phase": "enforcement", "active": "report-only", "user": "sre", "confirmed": False},
            "approval": approval,
            "notifications": {"sent": 1, "failed": 1, "notices": [sent, {**sent, "ok": True, "error": ""}]},
        },
        {
            "override": {"reason": "r", "user": "u", "budget": False, "max_deletions": 9, "applied": False, "why": "w"},
            "phase_gate": {"phase": "p", "active": "a", "user": "u", "reason": "r", "confirmed": True, "why": "w"},
            "notifications": {"sent": 0, "failed": 0, "error": "TimeoutError"},
        },
    ]
    variants[0]["phase_gate"]["why"] = "not the active phase"
    for parts in variants:
        told = parts.pop("notifications")  # written after the state, by record's last summary write
        doc = {**IDS, "target": "gce", "phase": "enforcement", **parts, "state": "success", "notifications": told}
        typed = summary_of(stored(doc))
        assert same_bytes(document(typed), doc)
        parts["notifications"] = told
    first = summary_of(stored({**IDS, **variants[0]}))
    assert first.override and first.override.scopes == ["p1"] and not first.override.raises_cap
    assert first.phase_gate and first.phase_gate.confirmed is False and first.phase_gate.reason is msgspec.UNSET
    assert first.approval and first.approval.results[0].state == "deleted" and first.approval.from_run == "scheduled__1"
    assert first.notifications and [n.ok for n in first.notifications.notices or []] == [False, True]


def test_the_override_writer_gives_the_documents_the_dict_writer_gave_and_the_page_shows_only_what_one_says() -> None:
    """``run_overrides`` for a budget override with a raised cap, and for the same on a re-run, key for key as the
    dict writer wrote them; an override written before ``budget`` and ``applied`` existed is shown as written."""
    from reaper.report.views import summary_facts
    from reaper.sweep.overrides import run_overrides

    asked = {"override_budget": True, "override_reason": "INC-7", "override_scopes": ["p1"], "max_deletions": 900}
    ids = steps.Ids("reaper_gce_enforcement", "manual__1", 0)
    first = run_overrides(asked, ids, "sre", rerun=False, configured=500, target="gce")
    again = run_overrides(asked, ids, "sre", rerun=True, configured=500, target="gce")
    head = {"reason": "INC-7", "user": "sre", "budget": True, "scopes": ["p1"], "max_deletions": 900}
    why = "the run was cleared or re-run: an override applies to its first execution only"
    assert same_bytes(msgspec.to_builtins(first.record), {**head, "applied": True})
    assert same_bytes(msgspec.to_builtins(again.record), {**head, "applied": False, "why": why})
    old = summary_of({**IDS, "target": "gce", "override": {"reason": "INC-1", "user": "sre"}, "state": "success"})
    assert msgspec.to_builtins(old.override) == {"reason": "INC-1", "user": "sre"}  # no budget or applied made up
    assert "<dt>override</dt><dd>reason: INC-1; user: sre</dd>" in summary_facts(old, None)
