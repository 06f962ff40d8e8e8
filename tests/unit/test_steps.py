"""The sweep's task steps (``reaper.sweep.steps``) as plain functions: a fake ledger and target, a real sweep store.

The DAG tests run these through Airflow; here each step's own contract is pinned down: what it
refuses, what it hands on, which plans it runs, and what the summary says.
"""

from __future__ import annotations

import builtins
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from reaper.config import Settings
from reaper.fence import SendGuard
from reaper.model import (
    Evidence,
    GceInstance,
    Keyed,
    Outcome,
    Phase,
    Resolved,
    Resource,
    ScopeListing,
    SweepData,
    WriterRecord,
)
from reaper.records import Census, PlanRef, document
from reaper.retry import Stop
from reaper.sweep import steps
from reaper.sweep.deletes import config_digest
from reaper.sweep.gate import pushes_metrics
from reaper.sweep.overrides import run_overrides
from reaper.sweep.targets import GceTarget
from reaper.transitions import since
from reaper.vocabulary import Result
from tests.builders import D, M, inst, settings

LEASE = steps.Lease(holder="reaper_gce_enforcement/manual__1#0", token="tok", expires_at=time.time() + 3600)


@dataclass
class FakeLedger:
    """What the steps ask of the ledger, answered from memory."""

    lease: dict[str, object] | None = field(default_factory=lambda: msgspec.to_builtins(LEASE))
    records: list[dict[str, object]] = field(default_factory=list)
    summaries: list[dict[str, object]] = field(default_factory=list)
    rerun: bool = False
    released: list[str] = field(default_factory=list)
    states: dict = field(default_factory=dict)
    transitions: list[dict[str, object]] = field(default_factory=list)

    def ensure_indexes(self) -> None: ...

    @property
    def sweep_lease(self) -> FakeLedger:
        return self  # the sweep lease's questions, answered here too

    def acquire(self, target: str, holder: str, ttl: timedelta) -> dict[str, object] | None:
        return self.lease

    def holder(self, target: str) -> str | None:
        return "reaper_gce_report_only/other#0"

    def release(self, target: str, holder: str) -> None:
        self.released.append(holder)

    def earlier_execution(self, ids: dict[str, object]) -> bool:
        return self.rerun

    def write(self, records) -> int:
        records = [document(r) for r in records]  # encoded as the ledger encodes them
        self.records += records
        return len(records)

    def summary(self, doc) -> None:
        self.summaries.append(document(doc))

    def record_transitions(self, ids, plan, evidence, run_label):
        found, states = since(self.states, plan, evidence, run_label)
        self.states.update(states)
        self.transitions += [{**ids, **c.record()} for c in found]
        return len(found)

    def outcomes(self, ids, uids=None):
        return {
            (r["scope"], r["uid"]): r
            for r in self.records
            if r["action"] == "outcome" and r["lease"] == ids["lease"] and (uids is None or r["uid"] in uids)
        }

    def intents(self, ids, uids):
        return set()

    def lease_problem(self, target: str, holder: str, token: str) -> str | None:
        return None if token == LEASE.token else "the sweep lease was released"


class FakeGce(GceTarget):
    """A GCE target whose fleet is a list and whose deletes only record the guard they were sent under."""

    guards: builtins.list[SendGuard]

    def __init__(self, config: Settings, fleet: list[GceInstance], incomplete: dict[str, list[str]] | None = None):
        super().__init__(config)
        self.fleet, self.incomplete, self.guards = fleet, incomplete or {}, []

    def resolve(self, scopes: list[str], stop: Stop | None = None) -> list[Resolved]:
        return [Resolved(s, (s,)) for s in scopes]

    def list(self, scopes: list[str], stop: Stop | None = None) -> list[ScopeListing]:
        return [
            ScopeListing("gce", s, [i for i in self.fleet if i.project == s], 1, self.incomplete.get(s, []))
            for s in scopes
        ]

    def evidence(self, resources: builtins.list[Resource], incomplete: builtins.list[str]) -> Evidence:
        writers = [WriterRecord(f"mgr-{p}", p, time.time() - 60, False) for p in ("p1", "p2")]
        return Evidence(writer_health=writers, incomplete=frozenset(("gce", s) for s in incomplete))

    def delete(self, resources: builtins.list[GceInstance], guard: SendGuard) -> builtins.list[Outcome]:
        self.guards.append(guard)
        outcomes = []
        for r in resources:
            why = guard.before_send(r) or guard.ready(r)
            outcomes.append(Outcome(r, Result.NOT_ATTEMPTED, why) if why else Outcome(r, "deleted"))
            guard.record(r, outcomes[-1].result, outcomes[-1].detail)
        return outcomes


class Execution(steps.Execution):
    _ledger: FakeLedger  # set by sweep() with object.__setattr__: the dataclass is frozen

    def ledger(self):
        return self._ledger


def sweep(tmp_path: Path, fleet: list[GceInstance], execution: int = 0, **config: object) -> Execution:
    cfg = settings(
        **{
            "gce": {"projects": ["p1", "p2"]},
            "airflow": {"sweep_store": f"file://{tmp_path}", "shards": 2, "lease_wait": "0s"},
            "rollout": {"gce": "enforcement"},  # these sweeps are of the active phase unless a test says otherwise
            **config,
        }
    )
    made = Execution(
        cfg, FakeGce(cfg, fleet), Phase.ENFORCEMENT, steps.Ids("reaper_gce_enforcement", "manual__1", execution)
    )
    object.__setattr__(made, "_ledger", FakeLedger())
    return made


def plan_through(s: steps.Execution, params: dict[str, object] | None = None) -> steps.Planned:
    """resolve_scopes -> list_inventory per shard -> gather_evidence -> evaluate_policy, as the DAG wires them."""
    params = params or {}
    setup = steps.resolve_scopes(s, params)
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    return steps.evaluate_policy(s, steps.gather_evidence(s, shards, setup.lease), params, "sre", setup.lease)


def stale_fleet() -> list[GceInstance]:
    """Heartbeats against the wall clock: the steps measure ages at the time they list."""
    stale, fresh = str(int(time.time() - D)), str(int(time.time() - M))
    return [inst(hb=stale, project="p1"), inst(hb=fresh, project="p1"), inst(hb=stale, project="p2")]


def test_unknown_scopes_and_an_override_without_reason_are_refused_naming_the_key(tmp_path: Path) -> None:
    s = sweep(tmp_path, [])
    with pytest.raises(AirflowFailException, match=r"\['p9'\] are not configured.*config key gce\.projects"):
        steps.resolve_scopes(s, {"scopes": ["p1", "p9"]})
    with pytest.raises(AirflowFailException, match="override_reason"):
        steps.resolve_scopes(s, {"override_budget": True, "override_reason": "  "})


OVERRIDE = {"override_budget": True, "override_reason": "INC-42"}


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (OVERRIDE, r"override_scopes: expected the scopes whose budget hold override_budget lifts .*got none"),
        ({**OVERRIDE, "override_scopes": []}, "override_scopes: expected the scopes"),
        ({**OVERRIDE, "override_scopes": None}, "override_scopes: expected the scopes"),  # a cleared form field
        (
            {**OVERRIDE, "override_scopes": ["p1", "p9"]},
            r"override_scopes: \['p9'\] are not swept by this run; expected a subset of the configured "
            r"\['p1', 'p2'\] \(config key gce\.projects\)",
        ),
        (
            {**OVERRIDE, "scopes": ["p1"], "override_scopes": ["p2"]},
            r"override_scopes: \['p2'\] are not swept by this run; expected a subset of params\.scopes \['p1'\]",
        ),
        ({**OVERRIDE, "override_scopes": "p1"}, "override_scopes: expected a list of scope names"),
        ({"override_scopes": ["p1"]}, r"override_scopes: \['p1'\] given without override_budget"),
    ],
)
def test_a_budget_override_names_the_swept_scopes_it_lifts(
    tmp_path: Path, params: dict[str, object], match: str
) -> None:
    s = sweep(tmp_path, [])
    with pytest.raises(AirflowFailException, match=match):
        steps.resolve_scopes(s, params)
    assert s.ledger().records == [] and s.ledger().summaries == []  # refused before the lease


def test_a_budget_override_naming_swept_scopes_passes(tmp_path: Path) -> None:
    named = {**OVERRIDE, "scopes": ["p1", "p2"], "override_scopes": ["p2"], "override_reason": None}
    with pytest.raises(AirflowFailException, match="override_reason"):  # the form's empty reason: null
        steps.resolve_scopes(sweep(tmp_path, []), named)
    setup = steps.resolve_scopes(sweep(tmp_path, []), {**named, "override_reason": "INC-42"})
    assert [[r.scope for r in shard] for shard in setup.shards] == [["p1"], ["p2"]]
    assert steps.resolve_scopes(sweep(tmp_path, []), {"override_reason": None, "override_scopes": None}).shards


def test_a_budget_override_lifts_and_records_only_the_scopes_it_names(tmp_path: Path) -> None:
    # Both projects' budgets trip (3 stale of 4); the operator reviewed p1 only.
    stale, fresh = str(int(time.time() - D)), str(int(time.time() - M))
    fleet = [inst(hb=hb, project=p) for p in ("p1", "p2") for hb in (stale, stale, stale, fresh)]
    s = sweep(tmp_path, fleet)
    planned = plan_through(s, {**OVERRIDE, "override_scopes": ["p1"]})
    assert {r.project for b in planned.batches for r in b.resources} == {"p1"} and planned.summary.deletes == 3
    record = {"reason": "INC-42", "user": "sre", "budget": True, "scopes": ["p1"], "applied": True}
    assert msgspec.to_builtins(planned.summary.override) == record  # as the summary and the decisions store it
    verdicts = {v.scope: v for v in planned.summary.scopes}
    assert (verdicts["p1"].holds, verdicts["p1"].overridden) == ([], ["budget_exceeded"])
    assert (verdicts["p2"].holds, verdicts["p2"].overridden) == (["budget_exceeded"], [])
    decisions = [r for r in s.ledger().records if r["kind"] == "decision"]
    # Each decision made under the override carries it, scopes included; p2's, held, were not made under it.
    assert {(r["scope"], r["action"], r["reason"]) for r in decisions} == {
        ("p1", "delete", "heartbeat_stale"),
        ("p2", "report", "budget_exceeded"),
    }
    assert all(r.get("override") == (record if r["scope"] == "p1" else None) for r in decisions)


def test_scopes_named_twice_are_one_shard_entry_and_the_lease_is_handed_on(tmp_path: Path) -> None:
    setup = steps.resolve_scopes(sweep(tmp_path, []), {"scopes": ["p2", "p1", "p2"]})
    assert setup.shards == [[Resolved("p1", ("p1",))], [Resolved("p2", ("p2",))]] and setup.lease == LEASE


def test_an_override_may_name_a_held_project_by_the_id_the_audit_view_shows(tmp_path: Path) -> None:
    """A project configured by its number is held, and shown held, under its id: the id is accepted as well as the
    configured name; another name is refused (after resolution, the lease given back)."""
    s = sweep(tmp_path, [], gce={"projects": ["123456789012", "p2"]})
    number = Resolved("ci-a", ("123456789012",), ("123456789012",), how="projects.get")
    s.target.resolve = lambda scopes, stop=None: [number, Resolved("p2", ("p2",))]  # type: ignore[method-assign]  # the test's stub in place of the method
    named = {**OVERRIDE, "override_scopes": ["ci-a"]}
    assert [[r.scope for r in shard] for shard in steps.resolve_scopes(s, named).shards] == [["ci-a"], ["p2"]]
    with pytest.raises(AirflowFailException, match=r"\['ci-x'\] are not swept .* or their ids \['ci-a'\]"):
        steps.resolve_scopes(s, {**OVERRIDE, "override_scopes": ["ci-x"]})
    assert s.ledger().released == [s.ids.holder]


def test_a_resolution_that_fails_gives_the_lease_back(tmp_path: Path) -> None:
    # A failed setup task runs no teardown: resolve_scopes releases the lease it took itself.
    s = sweep(tmp_path, [])

    def unreachable(scopes: list[str], stop: Stop | None = None) -> list[Resolved]:
        raise ConnectionError("no route to the Compute API")

    s.target.resolve = unreachable  # type: ignore[method-assign]  # the test's stub in place of the method
    with pytest.raises(ConnectionError):
        steps.resolve_scopes(s, {})
    assert s.ledger().released == [s.ids.holder]


def test_a_lease_held_elsewhere_skips_the_sweep_with_its_own_summary(tmp_path: Path) -> None:
    s = sweep(tmp_path, [])
    s.ledger().lease = None
    with pytest.raises(AirflowSkipException, match="reaper_gce_report_only/other#0"):
        steps.resolve_scopes(s, {})
    (summary,) = s.ledger().summaries
    assert summary["state"] == "skipped" and summary["lease"] == "" and summary["execution"] == 0


def test_the_sweep_input_carries_every_listing_fact_and_decisions_go_to_the_ledger_under_the_lease(
    tmp_path: Path,
) -> None:
    fleet = stale_fleet()
    s = sweep(tmp_path, fleet)
    s.target.incomplete = {"p2": ["page 2: 503"]}  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    planned = plan_through(s)
    data = msgspec.msgpack.decode(s.path("sweep-input.msgpack").read_bytes(), type=SweepData[GceInstance])
    assert data.resources == fleet
    assert data.evidence.swept == {("gce", "p1"), ("gce", "p2")}
    assert data.evidence.incomplete == {("gce", "p2")} and data.evidence.observed_until is not None
    assert planned.summary.incomplete == {"p2": ["page 2: 503"]}
    # p1's stale VM is deleted; p2's is held by its incomplete listing, reported.
    (batch,) = planned.batches
    assert [r.name for r in batch.resources] == [fleet[0].name]
    assert batch.plan == PlanRef(0, "tok", config_digest(s.config))
    decisions = {r["name"]: (r["action"], r["lease"]) for r in s.ledger().records}
    assert decisions == {fleet[0].name: ("delete", "tok"), fleet[2].name: ("report", "tok")}


def test_the_recorded_sweep_input_is_what_reaper_diff_reads_with_the_sweeps_clock(tmp_path: Path) -> None:
    # reaper diff --recorded evaluates it again as the sweep saw it: its resources, evidence and as_of.
    from reaper.decoders import load_recorded

    fleet = stale_fleet()
    s = sweep(tmp_path, fleet)
    setup = steps.resolve_scopes(s, {})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    sweep_input = steps.gather_evidence(s, shards, setup.lease)
    recorded = load_recorded(sweep_input.path)
    assert recorded.resources == fleet and recorded.as_of == sweep_input.as_of
    assert recorded.evidence.swept == {("gce", "p1"), ("gce", "p2")}


def test_inputs_read_under_another_lease_or_a_dry_run_give_no_batch(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    setup = steps.resolve_scopes(s, {})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    old = msgspec.structs.replace(shards[0], token="an earlier execution's")
    read = steps.gather_evidence(s, [old, *shards[1:]], setup.lease)
    planned = steps.evaluate_policy(s, read, {}, "sre", setup.lease)
    assert planned.batches == [] and planned.summary.stale_inputs and planned.summary.deletes == 2
    assert steps.budget_check(planned.summary).branch == steps.REPORT_ONLY
    dry = plan_through(sweep(tmp_path / "dry", stale_fleet()), {"dry_run": True})
    assert dry.batches == [] and dry.summary.dry_run and not dry.summary.stale_inputs


def test_a_kept_resource_has_its_story_recorded_once_per_change_never_per_sweep(tmp_path: Path) -> None:
    fleet = stale_fleet()
    s = sweep(tmp_path, fleet)
    s.target.incomplete = {"p2": ["page 2: 503"]}  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    plan_through(s)
    first = {t["name"]: (t["before"], t["state"]) for t in s.ledger().transitions}
    assert first == {
        fleet[0].name: ("", "delete:heartbeat_stale"),
        fleet[1].name: ("", "keep:fresh"),  # a plain keep: no decision record, but its story
        fleet[2].name: ("", "report:inventory_incomplete"),
    }
    plan_through(s)  # nothing changed: nothing written
    assert len(s.ledger().transitions) == 3
    s.target.fleet = [fleet[1]]  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target; p1's stale VM deleted; p2 still listed partially
    plan_through(s)
    gone = [(t["name"], t["before"], t["state"]) for t in s.ledger().transitions[3:]]
    assert gone == [(fleet[0].name, "delete:heartbeat_stale", "gone")]  # p2's VM: absent from a partial answer
    dry = sweep(tmp_path / "dry", stale_fleet())
    plan_through(dry, {"dry_run": True})
    assert dry.ledger().transitions == []  # a what-if is no part of any resource's story


def test_transitions_the_ledger_refuses_are_a_warning_and_the_deletes_go_on(tmp_path: Path, monkeypatch) -> None:
    from pymongo.errors import OperationFailure

    s = sweep(tmp_path, stale_fleet())

    def refuse(*args: object) -> int:
        raise OperationFailure('not authorized on reaper to execute command { insert: "transitions" }', 13)

    monkeypatch.setattr(s.ledger(), "record_transitions", refuse)
    planned = plan_through(s)
    assert sum(len(batch.resources) for batch in planned.batches) == 2  # both stale VMs, as without the refusal
    assert any(w.startswith("transitions not recorded this sweep: OperationFailure") for w in planned.summary.warnings)


@pytest.mark.parametrize(
    ("changes", "branch", "why"),
    [
        ({"capped": {"gce": 501}}, "report_only", "max_deletions_per_sweep exceeded"),
        ({"dry_run": True}, "report_only", "dry_run"),
        ({"stale_inputs": True}, "report_only", "another execution"),
        ({"deletes": 0}, "report_only", "nothing to delete"),
        ({"deletes": 0, "stale_inputs": True}, "report_only", "nothing to delete"),
        ({}, "delete", "3 deletes within the cap (500)"),
        ({"left": 1}, "delete", "2 deletes within the cap (500); 1 left for the next sweep (the run's deadline)"),
        ({"left": 3}, "report_only", "no delete fits before the run's deadline; 3 left"),
    ],
)
def test_budget_check_reports_for_each_sweep_wide_reason(changes: dict[str, object], branch: str, why: str) -> None:
    summary = steps.Summary(
        phase="enforcement",
        decisions=[],
        kept={},
        scopes=[],
        capped={},
        census=Census(),
        override=None,
        triggered_by="sre",
        dry_run=False,
        stale_inputs=False,
        warnings=[],
        hygiene={},
        incomplete={},
        deletes=3,
        max_deletions=500,
        left=0,
        plan=PlanRef(0, "tok", "c"),
    )
    chosen = steps.budget_check(msgspec.structs.replace(summary, **changes))
    assert chosen.branch == branch and why in chosen.why


FIRST = steps.Ids("d", "r", 0, "t")


@pytest.mark.parametrize(
    ("params", "budget", "limit", "record"),
    [
        ({}, False, 500, None),
        ({"max_deletions": 20}, False, 20, None),  # a lower cap is a limit, no override
        ({"max_deletions": 500}, False, 500, None),
        (
            {"override_budget": True, "override_reason": "INC-42", "override_scopes": ["p2", "p1", "p2"]},
            True,
            500,
            {"reason": "INC-42", "user": "sre", "budget": True, "scopes": ["p1", "p2"], "applied": True},
        ),
        (
            {"max_deletions": 9000, "override_reason": "INC-13578"},
            False,
            9000,
            {"reason": "INC-13578", "user": "sre", "budget": False, "max_deletions": 9000, "applied": True},
        ),
    ],
)
def test_what_a_first_execution_lifts_and_records(
    params: dict[str, object], budget: bool, limit: int, record: dict[str, object] | None
) -> None:
    got = run_overrides(params, FIRST, "sre", rerun=False, configured=500, target="gce")
    assert (got.budget is not None, got.max_deletions, msgspec.to_builtins(got.record)) == (budget, limit, record)
    assert got.budget is None or (got.budget.user, got.budget.reason) == ("sre", params["override_reason"])
    assert got.budget is None or got.budget.scopes == {("gce", "p1"), ("gce", "p2")}


@pytest.mark.parametrize(("ids", "rerun"), [(FIRST, True), (steps.Ids("d", "r", 1, "t"), False)])
def test_an_override_applies_to_the_first_execution_only_and_a_lower_cap_to_every_one(
    ids: steps.Ids, rerun: bool
) -> None:
    params = {"override_budget": True, "max_deletions": 9000, "override_reason": "INC-42", "override_scopes": ["p1"]}
    got = run_overrides(params, ids, "sre", rerun, configured=500, target="gce")
    assert got.budget is None and got.max_deletions == 500
    assert got.record is not None and got.record.applied is False and "first execution" in str(got.record.why)
    assert run_overrides({"max_deletions": 3}, ids, "sre", rerun, configured=500, target="gce").max_deletions == 3
    # A lower cap beside a budget override is still a limit: the re-run drops the override, not the limit.
    with_budget = {"override_budget": True, "override_reason": "INC-42", "override_scopes": ["p1"], "max_deletions": 2}
    assert run_overrides(with_budget, ids, "sre", rerun, configured=500, target="gce").max_deletions == 2


def test_an_override_names_projects_as_configured_and_lifts_them_under_their_ids() -> None:
    """A project configured by its number is held under its id (docs/design.md §4); naming it as configured lifts
    that hold, and nothing else."""
    params = {"override_budget": True, "override_reason": "INC-42", "override_scopes": ["123456789012"]}
    resolution = [Resolved("ci-a", ("123456789012",), ("123456789012",)), Resolved("ci-b", ("ci-b",))]
    got = run_overrides(params, FIRST, "sre", rerun=False, configured=500, target="gce", resolution=resolution)
    assert got.budget is not None and got.budget.scopes == {("gce", "ci-a")}
    assert got.record is not None and got.record.scopes == ["ci-a"]


def test_a_raise_is_checked_against_the_config_the_plan_is_made_under() -> None:
    # resolve_scopes let 4 pass without a reason under a cap of 10; the config now says 2.
    got = run_overrides({"max_deletions": 4}, FIRST, "sre", rerun=False, configured=2, target="gce")
    assert (got.max_deletions, got.record) == (2, None)


def test_a_summary_planned_before_max_deletions_and_left_existed_still_reads() -> None:
    summary = msgspec.to_builtins(
        steps.Summary(
            "enforcement", [], {}, [], {}, Census(), None, "sre", False, False, [], {}, {}, 3, PlanRef(0, "t", "c")
        )
    )
    del summary["max_deletions"], summary["left"]
    assert steps.budget_check(msgspec.convert(summary, steps.Summary)).branch == steps.DELETE


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (
            {"max_deletions": 501},
            r"max_deletions: 501 is above max_deletions_per_sweep \(500 in .*override_reason",
        ),
        ({"max_deletions": 501, "override_reason": " "}, "override_reason"),
        ({"max_deletions": -1}, "whole number >= 0"),
        ({"max_deletions": "9000"}, "whole number >= 0"),
        ({"max_deletions": True}, "whole number >= 0"),
    ],
)
def test_a_cap_above_the_configured_one_needs_a_reason(tmp_path: Path, params: dict[str, object], match: str) -> None:
    s = sweep(tmp_path, [])
    with pytest.raises(AirflowFailException, match=match):
        steps.resolve_scopes(s, params)
    assert s.ledger().records == [] and s.ledger().summaries == []


def test_a_raised_cap_plans_past_the_configured_one_and_stamps_every_decision(tmp_path: Path) -> None:
    fleet = [inst(hb=str(int(time.time() - D)), project="p1") for _ in range(3)]
    fleet += [inst(hb=str(int(time.time() - M)), project="p1") for _ in range(20)]
    capped = plan_through(sweep(tmp_path / "a", fleet, max_deletions_per_sweep=2))
    assert capped.batches == [] and steps.budget_check(capped.summary).why.startswith(
        "max_deletions_per_sweep exceeded ({'gce': 3} > 2)"
    )
    s = sweep(tmp_path / "b", fleet, max_deletions_per_sweep=2)
    raised = plan_through(s, {"max_deletions": 3, "override_reason": "INC-13578 recovery"})
    assert sum(len(b.resources) for b in raised.batches) == 3 and raised.summary.max_deletions == 3
    stamps = {str(r["override"]["reason"]) for r in s.ledger().records if r["kind"] == "decision"}
    assert stamps == {"INC-13578 recovery"}
    assert steps.budget_check(raised.summary) == steps.Branch("delete", "3 deletes within the cap (3)")


def test_a_batch_is_run_only_by_its_own_execution_lease_and_config(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    (batch,) = plan_through(s).batches
    others = [
        sweep(tmp_path, [], execution=1),  # a cleared run
        sweep(tmp_path, [], **{"max_deletions_per_sweep": 7}),  # another config
    ]
    for other in others:
        assert steps.delete(other, batch, LEASE, None).outcomes == {Result.STALE_PLAN: 2}
        assert other.target.guards == []  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    relet = msgspec.structs.replace(LEASE, token="another")
    assert steps.delete(s, batch, relet, None).outcomes == {Result.STALE_PLAN: 2}
    assert steps.delete(s, batch, LEASE, None).outcomes == {"deleted": 2}


def test_a_batch_of_a_phase_other_than_the_active_one_is_sent_only_with_its_confirmation(tmp_path: Path) -> None:
    """Review of the gate: a plan made before the gate existed (a run in flight across a deploy) carries no
    gate record, and budget_check alone would send it: the delete step itself refuses such a batch."""
    s = sweep(tmp_path, stale_fleet(), rollout={"gce": "report-only"})  # the sweep's phase: enforcement
    (batch,) = plan_through(s, CONFIRMED).batches
    assert batch.phase_confirmed
    planned_before = msgspec.to_builtins(batch)
    del planned_before["phase_confirmed"]
    for unconfirmed in (
        msgspec.structs.replace(batch, phase_confirmed=False),
        msgspec.convert(planned_before, type(batch)),
    ):
        assert steps.delete(s, unconfirmed, LEASE, None).outcomes == {Result.STALE_PLAN: 2}
        assert s.target.guards == []  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    assert steps.delete(s, batch, LEASE, None).outcomes == {"deleted": 2}
    # The active phase's batches need no confirmation.
    active = sweep(tmp_path / "a", stale_fleet())
    (plain,) = plan_through(active).batches
    assert not plain.phase_confirmed and steps.delete(active, plain, LEASE, None).outcomes == {"deleted": 2}


def test_a_dry_run_whose_plan_another_execution_made_pushes_no_metrics(tmp_path: Path, monkeypatch) -> None:
    """Review of the gate: ``record`` drops a foreign plan's summary; whether it pushes is the plan's to say."""
    s = sweep(tmp_path, stale_fleet(), metrics={"pushgateway_url": "http://127.0.0.1:1"})
    planned = plan_through(s, {"dry_run": True})
    pushed: list[object] = []
    monkeypatch.setattr(steps, "push_metrics", lambda *args: pushed.append(args) or 0)  # type: ignore[func-returns-value]  # append returns None: the lambda records, then returns 0
    relet = msgspec.structs.replace(LEASE, token="another")
    with pytest.raises(AirflowFailException, match="no plan of its own"):
        steps.record(s, planned.summary, steps.budget_check(planned.summary), 0, [], relet)
    assert pushed == []
    real = plan_through(sweep(tmp_path / "r", stale_fleet(), metrics={"pushgateway_url": "http://127.0.0.1:1"}))
    with pytest.raises(AirflowFailException, match="no plan of its own"):
        steps.record(s, real.summary, steps.budget_check(real.summary), 1, [], relet)
    assert len(pushed) == 1  # a real sweep's failed attempt still reaches the alerts


def test_a_batch_stops_sending_at_the_lease_expiry_or_the_run_timeout_less_the_margin(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    (batch,) = plan_through(s).batches
    margin = s.config.send_margin("gce").total_seconds()
    started = datetime.now(UTC)
    steps.delete(s, batch, LEASE, None)
    s.ledger().records.clear()  # else the second call finds the first one's outcomes and sends nothing
    steps.delete(s, batch, LEASE, started)
    no_start, with_start = s.target.guards  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    assert no_start.deadline == LEASE.expires_at - margin
    timeout = s.config.run_timeout("gce").total_seconds()
    assert started.timestamp() + timeout < LEASE.expires_at  # the run's timeout comes first here
    assert with_start.deadline == started.timestamp() + timeout - margin


def test_deletes_that_cannot_be_sent_before_the_deadline_are_left_recorded_and_get_no_batch(tmp_path: Path) -> None:
    stale, fresh = str(int(time.time() - D)), str(int(time.time() - M))
    fleet = [inst(hb=stale, project=p) for p in ("p1", "p2") for _ in range(6)]
    fleet += [inst(hb=fresh, project=p) for p in ("p1", "p2") for _ in range(60)]
    s = sweep(tmp_path, fleet, gce={"projects": ["p1", "p2"], "delete_rate_per_project": 1})
    run_timeout, margin = s.config.run_timeout("gce"), s.config.send_margin("gce")
    started = datetime.now(UTC) - run_timeout + margin + timedelta(seconds=2.5)  # 2.5 s of sending left
    setup = steps.resolve_scopes(s, {})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    planned = steps.evaluate_policy(s, steps.gather_evidence(s, shards, setup.lease), {}, "sre", LEASE, started)
    # At 1 delete/s per project, at most 1 + 2.5 of each project go out before the deadline: 3 each.
    sent = Counter(r.project for b in planned.batches for r in b.resources)
    assert sent == {"p1": 3, "p2": 3} and planned.summary.left == 6 and planned.summary.deletes == 12
    left = [r for r in s.ledger().records if r["action"] == "outcome"]
    assert len(left) == 6 and {r["result"] for r in left} == {Result.NOT_ATTEMPTED}
    assert "left for the next sweep" in str(left[0]["detail"]) and not {r["uid"] for r in left} & {
        r.uid for b in planned.batches for r in b.resources
    }
    assert steps.budget_check(planned.summary).why.endswith("6 left for the next sweep (the run's deadline)")


def test_a_replan_in_the_same_execution_never_rewrites_an_outcome_as_left(tmp_path: Path) -> None:
    # evaluate_policy cleared alone through the REST API (reset_dag_runs=false keeps the clear number
    # and the lease): the second plan, made later, must not record a deleted VM as left.
    stale, fresh = str(int(time.time() - D)), str(int(time.time() - M))
    fleet = [inst(hb=stale, project="p1") for _ in range(6)] + [inst(hb=fresh, project="p1") for _ in range(20)]
    s = sweep(tmp_path, fleet)
    setup = steps.resolve_scopes(s, {})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    read = steps.gather_evidence(s, shards, setup.lease)
    for batch in steps.evaluate_policy(s, read, {}, "sre", LEASE).batches:
        steps.delete(s, batch, LEASE, None)
    run_timeout, margin = s.config.run_timeout("gce"), s.config.send_margin("gce")
    late = datetime.now(UTC) - run_timeout + margin  # no time left: the whole plan would be left
    replanned = steps.evaluate_policy(s, read, {}, "sre", LEASE, late)
    outcomes = s.ledger().outcomes(s.under(LEASE).fields())
    assert replanned.batches == [] and replanned.summary.left == 0
    assert len(outcomes) == 6 and {r["result"] for r in outcomes.values()} == {"deleted"}


def test_a_late_batch_records_a_delete_an_earlier_try_sent_as_unconfirmed(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    (batch,) = plan_through(s).batches
    sent = batch.resources[0]
    s.ledger().intents = lambda ids, uids: {(sent.scope, sent.uid)}
    late = datetime.now(UTC) - s.config.run_timeout("gce")
    assert steps.delete(s, batch, LEASE, late).outcomes == {
        "unconfirmed": 1,
        Result.NOT_ATTEMPTED: len(batch.resources) - 1,
    }
    results = {r["uid"]: r["result"] for r in s.ledger().records if r["action"] == "outcome"}
    assert results[sent.uid] == "unconfirmed"


def test_a_batch_that_begins_after_the_deadline_sends_nothing_and_records_it_in_one_write(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    (batch,) = plan_through(s).batches
    writes: list[int] = []
    write = s.ledger().write
    s.ledger().write = lambda records: writes.append(write(records)) or writes[-1]  # type: ignore[func-returns-value]  # append returns None: the lambda records, then returns the count
    late = datetime.now(UTC) - s.config.run_timeout("gce")
    assert steps.delete(s, batch, LEASE, late).outcomes == {Result.NOT_ATTEMPTED: len(batch.resources)}
    assert s.target.guards == [] and writes == [len(batch.resources)]  # type: ignore[attr-defined]  # the test's fake target; Execution.target is typed Target
    assert {r["detail"] for r in s.ledger().records if r["action"] == "outcome"} == {
        "deadline reached: left for the next sweep"
    }


def test_record_writes_the_summary_and_fails_an_execution_whose_batches_did_not_all_end(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet())
    planned = plan_through(s)
    branch = steps.budget_check(planned.summary)
    assert branch.branch == steps.DELETE
    with pytest.raises(AirflowFailException, match="0 of 1 delete batches ended"):
        steps.record(s, planned.summary, branch, len(planned.batches), [], LEASE)
    results = [steps.delete(s, b, LEASE, None) for b in planned.batches]
    done = steps.record(s, planned.summary, branch, len(planned.batches), results, LEASE)
    assert done == {"branch": "delete", "outcomes": {"deleted": 2}, "stale_plan": 0}
    failed, succeeded = s.ledger().summaries
    assert failed["state"] == "failed" and succeeded["state"] == "success"
    assert succeeded["why"] == branch.why and succeeded["lease"] == "tok" and succeeded["deletes"] == 2
    assert succeeded["decisions"] == [msgspec.to_builtins(d) for d in planned.summary.decisions]


def test_record_of_an_execution_that_never_planned_is_a_failed_summary(tmp_path: Path) -> None:
    s = sweep(tmp_path, [])
    with pytest.raises(AirflowFailException):
        steps.record(s, None, None, 0, [], None)
    (summary,) = s.ledger().summaries
    assert summary["state"] == "failed" and summary["lease"] == "" and "branch" not in summary


def test_unknown_evidence_stays_unknown_through_the_sweep_store(tmp_path: Path) -> None:
    """A non-finite value means "unknown" (an ambiguous writer: ``writer_health.UNKNOWN``; an odd lease
    expiry). Through a JSON file it became null: the sweep failed to decode, or a lease read as held."""
    fleet = stale_fleet()
    s = sweep(tmp_path, fleet)

    class Ambiguous(FakeGce):
        def evidence(self, resources: list[Resource], incomplete: list[str]) -> Evidence:
            writers = [WriterRecord("m", "p1", math.nan, False), WriterRecord("m2", "p2", time.time() - 60, False)]
            return Evidence(writer_health=writers, leases=Keyed(known={"r1": math.inf}, complete=True))

    object.__setattr__(s, "target", Ambiguous(s.config, fleet))
    planned = plan_through(s)
    data = msgspec.msgpack.decode(s.path("sweep-input.msgpack").read_bytes(), type=SweepData[GceInstance])
    assert math.isnan(data.evidence.writer_health[0].last_pass)
    assert data.evidence.leases is not None and data.evidence.leases.known == {"r1": math.inf}
    p1 = next(v for v in planned.summary.scopes if v.scope == "p1")
    assert p1.holds == ["writer_health_unknown"]  # that project held, the other swept
    assert [r.project for b in planned.batches for r in b.resources] == ["p2"]


def test_record_never_files_an_earlier_executions_plan_as_its_own(tmp_path: Path) -> None:
    """Clearing only ``record`` (or ``delete`` and what follows) takes the lease anew: the plan, branch
    and results it finds are execution 0's. Found by review: its summary said success, with that plan."""
    first = sweep(tmp_path, stale_fleet())
    planned = plan_through(first)
    branch = steps.budget_check(planned.summary)
    results = [steps.delete(first, b, LEASE, None) for b in planned.batches]
    again = sweep(tmp_path, stale_fleet(), execution=1)
    relet = steps.Lease("reaper_gce_enforcement/manual__1#1", "tok2", LEASE.expires_at)
    with pytest.raises(AirflowFailException, match="the plan is execution 0's"):
        steps.record(again, planned.summary, branch, len(planned.batches), results, relet)
    refused = [steps.delete(again, b, relet, None) for b in planned.batches]  # the cleared delete task's answer
    with pytest.raises(AirflowFailException):
        steps.record(again, planned.summary, branch, len(planned.batches), refused, relet)
    for doc in again.ledger().summaries:
        assert (doc["execution"], doc["lease"], doc["state"]) == (1, "tok2", "failed")
        assert "deletes" not in doc and doc["branch"] == "" and "no plan of its own" in str(doc["why"])
    assert [doc["stale_plan"] for doc in again.ledger().summaries] == [0, 2]


CONFIRMED: dict[str, object] = {
    "confirm_phase": "enforcement",
    "override_reason": "INC-7: enforce ahead of the rollout",
}


def test_a_manual_run_of_a_phase_above_the_active_one_deletes_only_when_its_trigger_confirms_the_phase(
    tmp_path: Path,
) -> None:
    """docs/design.md §8: the active phase deletes on its schedule; a later phase run by hand is a what-if unless its
    trigger names the phase and gives a reason, and then its metrics reach the alerts like any sweep's."""
    url = {"pushgateway_url": "http://127.0.0.1:1"}
    ahead = sweep(tmp_path / "a", stale_fleet(), metrics=url, rollout={"gce": "report-only"})
    what_if = plan_through(ahead)
    assert what_if.batches == [] and what_if.summary.dry_run and what_if.summary.deletes > 0
    gate = what_if.summary.phase_gate
    assert gate is not None and gate.confirmed is False and gate.active == "report-only"
    branch = steps.budget_check(what_if.summary)
    assert branch.branch == steps.REPORT_ONLY and "not the active phase (report-only)" in branch.why
    assert "confirm_phase" in branch.why and not pushes_metrics(ahead, what_if.summary)
    # A confirmed run that also asks for a dry run deletes nothing.
    assert plan_through(ahead, {**CONFIRMED, "dry_run": True}).batches == []

    later = sweep(tmp_path / "c", stale_fleet(), metrics=url, rollout={"gce": "report-only"})
    confirmed = plan_through(later, CONFIRMED)
    assert confirmed.batches and not confirmed.summary.dry_run
    gated = {
        "phase": "enforcement",
        "active": "report-only",
        "user": "sre",
        "reason": CONFIRMED["override_reason"],
        "confirmed": True,
        "why": "enforcement confirmed by sre",
    }
    assert msgspec.to_builtins(confirmed.summary.phase_gate) == gated  # as the summary and the decisions store it
    assert steps.budget_check(confirmed.summary).branch == steps.DELETE
    assert pushes_metrics(ahead, confirmed.summary)  # what it deletes reaches the alerts

    # A confirmation was given for the evidence its trigger saw: a cleared run (execution 1) is a dry run again.
    cleared = sweep(tmp_path / "r", stale_fleet(), execution=1, rollout={"gce": "report-only"})
    again = plan_through(cleared, CONFIRMED)
    assert again.batches == [] and again.summary.phase_gate is not None
    assert again.summary.phase_gate.confirmed is False and "first execution" in again.summary.phase_gate.why

    # The active phase is not gated, and its decisions carry no gate stamp; a confirmed phase's do.
    active = sweep(tmp_path / "e", stale_fleet())
    assert plan_through(active).summary.phase_gate is None
    assert all("phase_gate" not in r for r in active.ledger().records)
    stamped = [r for r in later.ledger().records if r.get("kind") == "decision" and r.get("action") == "delete"]
    assert stamped and all(r["phase_gate"] == gated for r in stamped)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"confirm_phase": "report-only", "override_reason": "r"}, r"confirm_phase: 'report-only' is not this DAG"),
        ({"confirm_phase": "enforcement"}, "override_reason: expected a non-empty reason with confirm_phase"),
        ({"confirm_phase": "enforcement", "override_reason": " "}, "override_reason"),
    ],
)
def test_a_phase_confirmation_names_this_dags_phase_and_gives_a_reason(
    tmp_path: Path, params: dict[str, object], match: str
) -> None:
    s = sweep(tmp_path, [], rollout={"gce": "report-only"})
    with pytest.raises(AirflowFailException, match=match):
        steps.resolve_scopes(s, params)
    assert s.ledger().summaries == []  # refused before the lease


def test_an_earlier_phase_run_by_hand_is_a_dry_run_too_as_the_active_phases_cap_holds_it_back(
    tmp_path: Path,
) -> None:
    """Review of the gate: enforcement, active, is over the global cap and deletes nothing; terminated-cleanup
    run by hand plans fewer deletes, fits the cap, and would delete the TERMINATED VMs unseen by the alerts."""
    fleet = [inst(name=f"t{i}", status="TERMINATED", hb=str(int(time.time() - D)), stop_age=D) for i in range(2)]
    fleet += [inst(name=f"u{i}", created_age=4 * D) for i in range(4)]  # no heartbeat, past unlabeled_age
    fleet.append(inst(name="live", hb=str(int(time.time() - 60))))  # a fresh beat: the label's absence is evidence
    common: dict[str, Any] = {"max_deletions_per_sweep": 3, "rollout": {"gce": "enforcement"}}
    active = plan_through(sweep(tmp_path / "a", fleet, **common))
    assert active.summary.capped and active.batches == []
    earlier = sweep(tmp_path / "b", fleet, **common)
    object.__setattr__(earlier, "phase", Phase.TERMINATED_CLEANUP)
    what_if = plan_through(earlier)
    assert what_if.batches == [] and what_if.summary.deletes == 2 and what_if.summary.dry_run
    assert what_if.summary.phase_gate is not None
    assert "not the active phase (enforcement)" in what_if.summary.phase_gate.why
    confirmed = plan_through(earlier, {"confirm_phase": "terminated-cleanup", "override_reason": "INC-9"})
    assert confirmed.batches and confirmed.summary.phase_gate is not None
    assert confirmed.summary.phase_gate.confirmed is True


def test_only_the_active_phases_sweeps_that_are_no_dry_run_push_metrics(tmp_path: Path) -> None:
    """The alerts read these series: a what-if run of another phase, or a dry run, must not feed them."""
    url = {"pushgateway_url": "http://127.0.0.1:1"}
    active = sweep(tmp_path, stale_fleet(), metrics=url, rollout={"gce": "enforcement"})
    summary = plan_through(active).summary
    assert pushes_metrics(active, summary)
    assert pushes_metrics(active, None)  # a failed sweep still pushes its attempt
    assert not pushes_metrics(active, msgspec.structs.replace(summary, dry_run=True))
    what_if = sweep(tmp_path / "w", [], metrics=url, rollout={"gce": "report-only"})
    assert not pushes_metrics(what_if, summary)
    assert not pushes_metrics(sweep(tmp_path / "n", [], rollout={"gce": "enforcement"}), summary)


def test_every_summary_records_the_active_phase(tmp_path: Path) -> None:
    s = sweep(tmp_path, stale_fleet(), rollout={"gce": "report-only"})
    planned = plan_through(s)
    steps.record(s, planned.summary, steps.budget_check(planned.summary), 1, [steps.Deleted({})], LEASE)
    (doc,) = s.ledger().summaries
    assert (doc["phase"], doc["active_phase"]) == ("enforcement", "report-only")


def test_a_cleared_gather_evidence_reads_an_earlier_executions_shards_and_says_so(tmp_path: Path) -> None:
    """Clearing gather_evidence alone runs it in a new execution (its own folder, not made by listing)
    with the shards of the old one: it writes its input all the same, and the plan only reports."""
    first = sweep(tmp_path, stale_fleet())
    setup = steps.resolve_scopes(first, {})
    shards = [steps.list_inventory(first, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    again = sweep(tmp_path, stale_fleet(), execution=1)
    relet = msgspec.structs.replace(LEASE, token="tok2")
    read = steps.gather_evidence(again, shards, relet)
    assert read.path.startswith(str(again.path(""))) and read.tokens == ["tok", "tok2"]
    planned = steps.evaluate_policy(again, read, {}, "sre", relet)
    assert planned.batches == [] and planned.summary.stale_inputs
