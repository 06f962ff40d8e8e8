"""Approvals in the ledger (SecantusDB) through the sweep's steps: recorded, used by one execution, never replayed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from airflow.sdk.exceptions import AirflowFailException

from reaper.approvals import Approval, choose, new_id
from reaper.config import LedgerConfig
from reaper.ledger import Ledger
from reaper.model import GceInstance
from reaper.report.queries import AuditQueries
from reaper.sweep import steps
from tests.builders import D, inst
from tests.unit.test_steps import plan_through as plan_holding_the_lease
from tests.unit.test_steps import sweep

DAG = "reaper_gce_enforcement"


@pytest.fixture
def ledger(mongo) -> Ledger:
    client, db = mongo
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    return led


def plan_through(s: steps.Execution, params: dict[str, object] | None = None) -> steps.Planned:
    """The steps up to the plan, the sweep lease given back after them (as the DAG's teardown does)."""
    try:
        return plan_holding_the_lease(s, params)
    finally:
        steps.release_lease(s)


def held_fleet() -> list[GceInstance]:
    """Four stale VMs of four in p1 (its budget trips), each in a state of its own."""
    beat = str(int(time.time() - D))
    return [msgspec.structs.replace(inst(hb=beat, project="p1"), label_fingerprint=f"fp-{i}") for i in range(4)]


def run(tmp_path: Path, ledger: Ledger, fleet: list[GceInstance], run_id: str, execution: int = 0):
    s: steps.Execution = sweep(tmp_path / run_id / str(execution), fleet, execution)
    s = steps.Execution(s.config, s.target, s.phase, steps.Ids(DAG, run_id, execution))
    object.__setattr__(s, "ledger", lambda: ledger)
    return s


def approve_held(ledger: Ledger, run_id: str, names: list[str] | None = None, ttl: float = 3600) -> str:
    items = choose(ledger.held(DAG, run_id), names, "gce")
    now = time.time()
    approval = Approval(new_id(), "gce", DAG, run_id, "alice", "INC-7", now, now + ttl, items)
    ledger.record_approval(msgspec.to_builtins(approval))
    return approval.id


def test_the_held_candidates_carry_their_state_and_an_approval_deletes_those_approved(tmp_path, ledger) -> None:
    fleet = held_fleet()
    first = plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    assert first.batches == [] and first.summary.scopes[0].holds == ["budget_exceeded"]
    held = ledger.held(DAG, "manual__1")
    assert {(r["uid"], r["fingerprint"]) for r in held} == {(i.id, i.label_fingerprint) for i in fleet}
    approval = approve_held(ledger, "manual__1", [fleet[0].name, fleet[1].name])

    # fleet[1] was relabelled since the review; fleet[2] and fleet[3] were never approved.
    relisted = [fleet[0], msgspec.structs.replace(fleet[1], label_fingerprint="fp-new"), *fleet[2:]]
    s = run(tmp_path, ledger, relisted, "manual__2")
    planned = plan_holding_the_lease(s, {"approval": approval})
    assert [r.name for b in planned.batches for r in b.resources] == [fleet[0].name]
    assert {b.approval for b in planned.batches} == {approval}
    record = planned.summary.approval
    assert record and record.user == "alice" and record.claimed is True
    states = {r.name: r.state for r in record.results}
    assert states == {fleet[0].name: "planned", fleet[1].name: "approval_changed"}
    used = ledger.approval(approval)
    assert used and used["used_by"]["run_id"] == "manual__2"
    # The delete sends under the pinned target (GCE: the fingerprint re-validated too).
    lease = steps.Lease(s.ids.holder, planned.batches[0].plan.token, time.time() + 600)
    deleted = steps.delete(s, planned.batches[0], lease, None)
    assert deleted.outcomes == {"deleted": 1}
    summary = steps.record(s, planned.summary, steps.budget_check(planned.summary), 1, [deleted], lease)
    assert summary["outcomes"] == {"deleted": 1}
    recorded = AuditQueries(ledger).executions(DAG, "manual__2")[-1].summary.approval
    assert recorded
    assert {r.name: r.state for r in recorded.results} == {
        fleet[0].name: "deleted",
        fleet[1].name: "approval_changed",
    }
    # What that run held is a candidate for the next approval; what it deleted is not.
    again = {r["name"]: r["held_by"] for r in ledger.held(DAG, "manual__2")}
    assert again == {fleet[1].name: "approval_changed", fleet[2].name: "not_approved", fleet[3].name: "not_approved"}


def test_what_an_approval_run_left_unsent_is_approved_anew_from_its_sweep(tmp_path, ledger) -> None:
    """The run's deadline leaves every approved delete unsent (``not_attempted``): they are the candidates of its
    sweep, each in the state that run listed it in, and the next approval's run deletes them (docs/runbook.md)."""
    from datetime import UTC, datetime, timedelta

    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    approval = approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__2")
    setup = steps.resolve_scopes(s, {"approval": approval})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    started = datetime.now(UTC) - s.config.run_timeout("gce") + timedelta(seconds=1)  # no time left to send
    inputs = steps.gather_evidence(s, shards, setup.lease)
    left = steps.evaluate_policy(s, inputs, {"approval": approval}, "sre", setup.lease, started)
    steps.release_lease(s)
    assert left.batches == []
    assert {v["result"] for v in ledger.outcomes(s.under(setup.lease).fields()).values()} == {"not_attempted"}
    held = ledger.held(DAG, "manual__2")
    assert {(r["uid"], r["fingerprint"]) for r in held} == {(i.id, i.label_fingerprint) for i in fleet}
    assert all(str(r["held_by"]).startswith("not_attempted: left for the next sweep") for r in held), held
    anew = approve_held(ledger, "manual__2")
    planned = plan_through(run(tmp_path, ledger, fleet, "manual__3"), {"approval": anew})
    assert sorted(r.name for b in planned.batches for r in b.resources) == sorted(i.name for i in fleet)


def test_an_approval_is_not_replayed_by_a_second_run_or_a_cleared_task(tmp_path, ledger) -> None:
    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    approval = approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__2")
    setup = steps.resolve_scopes(s, {"approval": approval})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    sweep_input = steps.gather_evidence(s, shards, setup.lease)
    planned = steps.evaluate_policy(s, sweep_input, {"approval": approval}, "sre", setup.lease)
    assert len([r for b in planned.batches for r in b.resources]) == 4
    # A retry of the same task, in the same execution under the same lease, plans the same again.
    again = steps.evaluate_policy(s, sweep_input, {"approval": approval}, "sre", setup.lease)
    assert [b.resources for b in again.batches] == [b.resources for b in planned.batches]
    ledger.sweep_lease.release("gce", s.ids.holder)

    # A second run naming it fails at its first task, before it takes the lease.
    other = run(tmp_path, ledger, fleet, "manual__3")
    with pytest.raises(AirflowFailException, match=r"params.approval: .*was used by reaper_gce_enforcement/manual__2"):
        steps.resolve_scopes(other, {"approval": approval})
    # A cleared task of the same run is another execution (its clear_number): it fails too, and plans nothing.
    cleared = run(tmp_path, ledger, fleet, "manual__2", execution=1)
    with pytest.raises(AirflowFailException, match=r"params.approval: .*used by one execution only"):
        plan_through(cleared, {"approval": approval})
    # So does a task cleared without a new clear_number: the same execution number under a new sweep lease.
    lease = steps.Lease(s.ids.holder, "another-token", time.time() + 600)
    with pytest.raises(AirflowFailException, match=r"params.approval: .*earlier sweep lease"):
        steps.evaluate_policy(
            s, msgspec.structs.replace(sweep_input, tokens=["another-token"]), {"approval": approval}, "sre", lease
        )


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"approval": "apr-nope"}, r"params.approval: no approval 'apr-nope' in the ledger"),
        ({"approval": "X", "override_budget": True}, "params.approval: expected either approval .* or override_budget"),
        ({"approval": "X", "max_deletions": 10}, "params.max_deletions: expected null with approval"),
    ],
)
def test_a_bad_approval_param_is_refused_naming_it(tmp_path, ledger, params, match) -> None:
    with pytest.raises(AirflowFailException, match=match):
        steps.resolve_scopes(run(tmp_path, ledger, held_fleet(), "manual__9"), params)


def test_an_expired_or_other_dags_approval_is_refused(tmp_path, ledger) -> None:
    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    expired = approve_held(ledger, "manual__1", ttl=-1)
    with pytest.raises(AirflowFailException, match=r"params.approval: approval .* expired .* ago"):
        steps.resolve_scopes(run(tmp_path, ledger, fleet, "manual__2"), {"approval": expired})
    good = approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__3")
    s = steps.Execution(s.config, s.target, s.phase, steps.Ids("reaper_gce_report_only", "manual__3", 0))
    object.__setattr__(s, "ledger", lambda: ledger)
    with pytest.raises(AirflowFailException, match="expected an approval made from a sweep of this DAG"):
        steps.resolve_scopes(s, {"approval": good})


def test_reaper_approve_prints_the_id_of_an_approval_of_the_named_items(tmp_path, ledger, mongo, monkeypatch) -> None:
    import io
    import json

    from reaper.cli import main

    client, db = mongo
    host, port = client.address
    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    config = tmp_path / "reaper.yaml"
    config.write_text(json.dumps({"ledger": {"database": db}}))
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    monkeypatch.setenv("AIRFLOW_CONN_MONGO_DEFAULT", f"mongodb://{host}:{port}/")
    out = io.StringIO()
    argv = ["approve", "--dag", DAG, "--run", "manual__1", "--item", fleet[0].name, "--item", fleet[1].id]
    assert main([*argv, "--reason", "INC-7", "--user", "bob"], out=out) == 0
    made = ledger.approval(out.getvalue().strip())
    assert made and made["user"] == "bob" and made["reason"] == "INC-7" and made["run_id"] == "manual__1"
    items = {(i["uid"], i["fingerprint"]) for i in made["items"]}
    assert items == {(fleet[0].id, "fp-0"), (fleet[1].id, "fp-1")}
    assert made["expires_at"] - made["created_at"] == 4 * 3600
    bad = main([*argv, "--reason", "INC-7", "--expires", "30d"], out=io.StringIO())
    none = main(["approve", "--dag", DAG, "--run", "manual__404", "--all", "--reason", "x"], out=io.StringIO())
    assert bad == none == 2
    # reaper revoke: recorded with who and why; a second revoke of it, or of no approval, is refused.
    said = io.StringIO()
    assert main(["revoke", str(made["id"]), "--reason", "wrong set", "--user", "carol"], out=said) == 0
    assert f"revoked approval {made['id']} of {DAG}, from manual__1 (unused" in said.getvalue()
    assert (ledger.approval(str(made["id"])) or {})["revoked"]["user"] == "carol"
    assert main(["revoke", str(made["id"]), "--reason", "again"], out=io.StringIO()) == 2
    assert main(["revoke", "nope", "--reason", "typo"], out=io.StringIO()) == 2


def test_no_send_after_the_approval_expires_and_a_retry_after_it_keeps_the_first_tries_outcomes(
    tmp_path, ledger
) -> None:
    # Review findings: a batch went on sending past the expiry (checked once, before it began), and a retried
    # batch after the expiry rewrote the first try's deleted outcomes as not_attempted.
    import time

    from reaper.model import Outcome
    from reaper.vocabulary import Result

    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    approval = approve_held(ledger, "manual__1", ttl=3600)
    s = run(tmp_path, ledger, fleet, "manual__2")
    batch = plan_holding_the_lease(s, {"approval": approval}).batches[0]
    lease = steps.Lease(s.ids.holder, batch.plan.token, time.time() + 600)
    expires = time.time() + 0.5
    sent_at: list[float] = []

    def slow_delete(resources, guard):
        out = []
        for r in resources:
            time.sleep(0.3)
            why = guard.before_send(r) or guard.ready(r)
            out.append(Outcome(r, Result.NOT_ATTEMPTED, why) if why else Outcome(r, "deleted"))
            if not why:
                sent_at.append(time.time())
            guard.record(r, out[-1].result, out[-1].detail)
        return out

    object.__setattr__(s.target, "delete", slow_delete)
    first = steps.delete(s, msgspec.structs.replace(batch, approval_expires=expires), lease, None)
    assert sent_at and all(t < expires for t in sent_at), "a delete was sent after the approval expired"
    assert first.outcomes == {"deleted": len(sent_at), "not_attempted": len(batch.resources) - len(sent_at)}
    ids = s.under(lease).fields()
    deleted = {uid for (_, uid), r in ledger.outcomes(ids).items() if r["result"] == "deleted"}
    steps.delete(s, msgspec.structs.replace(batch, approval_expires=time.time() - 1), lease, None)  # the retry
    assert {uid for (_, uid), r in ledger.outcomes(ids).items() if r["result"] == "deleted"} == deleted


@pytest.mark.parametrize(
    ("withdraw", "said"),
    [
        ("revoke", "approval is revoked by bob: reviewed the wrong sweep"),
        ("edit by hand", "approval is unreadable in the ledger"),  # {revoked: true}: nothing proves it stands
        ("fields removed", "approval is unreadable in the ledger"),  # no longer the approval it claimed
        ("claimed by another", "no longer the approval this execution claimed"),  # used_by rewritten by hand
    ],
)
def test_a_revocation_during_a_batch_stops_its_sends_from_the_next_lease_read_on(
    tmp_path, ledger, withdraw: str, said: str
) -> None:
    """The operator revokes while a batch of the approval's run is sending: the sends under way may finish, and
    every one after the batch's next read of it (with the sweep lease, every REVOCATION_POLL seconds) is refused
    with the revocation. Once withdrawn, it stays withdrawn for the batch: putting the approval back as it was
    resumes nothing."""
    from reaper.approvals import revoke
    from reaper.model import Outcome
    from reaper.sweep.deletes import REVOCATION_POLL
    from reaper.vocabulary import Result

    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    approval = approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__2")
    batch = plan_holding_the_lease(s, {"approval": approval}).batches[0]
    assert len(batch.resources) == 4
    lease = steps.Lease(s.ids.holder, batch.plan.token, time.time() + 600)
    refusals: list[str] = []

    def revoking_delete(resources, guard):
        out = []
        for r in resources:
            why = guard.before_send(r) or guard.ready(r)  # the intent, then a lease read after it was queued
            out.append(Outcome(r, Result.NOT_ATTEMPTED, why) if why else Outcome(r, "deleted"))
            refusals.extend([why] if why else [])
            guard.record(r, out[-1].result, out[-1].detail)
            if not why and len(out) == 1:  # the first delete went out: the operator withdraws the approval now
                if withdraw == "revoke":
                    revoke(ledger, approval, "bob", "reviewed the wrong sweep", time.time())
                elif withdraw == "edit by hand":
                    ledger.approvals.update_one({"_id": approval}, {"$set": {"revoked": True}})
                elif withdraw == "claimed by another":
                    ledger.approvals.update_one({"_id": approval}, {"$set": {"used_by.lease": "another"}})
                else:
                    ledger.approvals.update_one({"_id": approval}, {"$unset": {"dag_id": "", "used_by": ""}})
                time.sleep(REVOCATION_POLL)  # the batch reads it again in its first cycle after this
            if why and len(refusals) == 1:  # and puts it back as it was: the batch still sends nothing more
                ledger.approvals.update_one({"_id": approval}, {"$set": {"revoked": None}})
        return out

    object.__setattr__(s.target, "delete", revoking_delete)
    done = steps.delete(s, batch, lease, None)
    assert done.outcomes == {"deleted": 1, "not_attempted": 3}
    assert len(refusals) == 3 and all(said in why for why in refusals), refusals
    steps.release_lease(s)


def test_a_sending_batch_reads_its_approval_once_per_poll_not_once_per_cycle(tmp_path, ledger) -> None:
    """An incident's approval names thousands of items: read every commit cycle, it would cost the server more
    than the deletes' own records. Four deletes in four cycles within one poll read it once as the batch begins
    (steps.delete) and once in the first cycle."""
    from reaper.model import Outcome

    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    approval = approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__2")
    batch = plan_holding_the_lease(s, {"approval": approval}).batches[0]
    lease = steps.Lease(s.ids.holder, batch.plan.token, time.time() + 600)
    reads: list[str] = []
    read = ledger.revocation

    def counted(name: str) -> dict[str, object] | None:
        reads.append(name)
        return read(name)

    object.__setattr__(ledger, "revocation", counted)

    def one_cycle_each(resources, guard):
        for r in resources:
            assert not (guard.before_send(r) or guard.ready(r))  # ready waits for its own cycle's lease read
            guard.record(r, "deleted", "")
        return [Outcome(r, "deleted") for r in resources]

    object.__setattr__(s.target, "delete", one_cycle_each)
    assert steps.delete(s, batch, lease, None).outcomes == {"deleted": 4}
    assert reads == [approval, approval]
    steps.release_lease(s)


def test_a_revoked_approval_is_claimed_by_no_run_and_a_run_using_it_starts_no_batch_after(tmp_path, ledger) -> None:
    """An operator who approved the wrong set revokes it (reaper revoke): a run triggered with it fails before it
    records a decision, and a run that claimed it before the revocation sends nothing from its next batch on."""
    from reaper.approvals import revoke

    fleet = held_fleet()
    plan_through(run(tmp_path, ledger, fleet, "manual__1"))
    unused, claimed = approve_held(ledger, "manual__1"), approve_held(ledger, "manual__1")
    s = run(tmp_path, ledger, fleet, "manual__3")
    batch = plan_holding_the_lease(s, {"approval": claimed}).batches[0]  # claimed by manual__3, before the revoke
    # What a batch reads every commit cycle: the revocation alone, never the items.
    assert (ledger.revocation(claimed) or {}).get("revoked", 0) is None and ledger.revocation("nope") is None
    for name in (unused, claimed):
        revoked = revoke(ledger, name, "bob", "reviewed the wrong sweep", time.time())
        assert revoked.revoked is not None and revoked.revoked.user == "bob"
    assert set(ledger.revocation(claimed) or {}) == {"id", "target", "dag_id", "used_by", "revoked"}
    with pytest.raises(ValueError, match="already revoked by bob"):
        revoke(ledger, unused, "carol", "again", time.time())
    with pytest.raises(ValueError, match="no approval"):
        revoke(ledger, "nope", "carol", "typo", time.time())

    with pytest.raises(AirflowFailException, match=r"params.approval: approval .* was revoked by bob .*wrong sweep"):
        plan_through(run(tmp_path, ledger, fleet, "manual__2"), {"approval": unused})
    assert ledger.claim_approval(unused, {"dag_id": DAG, "run_id": "manual__2", "execution": 0, "lease": "t"}) is None

    lease = steps.Lease(s.ids.holder, batch.plan.token, time.time() + 600)
    sent: list[str] = []
    object.__setattr__(s.target, "delete", lambda resources, guard: sent.extend(r.name for r in resources) or [])  # type: ignore[func-returns-value]  # the fake records the names, then returns no outcomes
    left = steps.delete(s, batch, lease, None)
    assert sent == [] and left.outcomes == {"not_attempted": len(batch.resources)}
    steps.release_lease(s)
    # Revoked is revoked, whatever time the revocation carries (an operator's clock ahead, a value no clock gives).
    for at in (time.time() + 300, float("nan"), float("inf")):
        odd = approve_held(ledger, "manual__1")
        o = run(tmp_path, ledger, fleet, f"manual__odd-{at}")
        odd_batch = plan_holding_the_lease(o, {"approval": odd}).batches[0]
        ledger.approvals.update_one({"_id": odd}, {"$set": {"revoked": {"user": "eve", "reason": "x", "at": at}}})
        object.__setattr__(o.target, "delete", lambda resources, guard: sent.extend(r.name for r in resources) or [])  # type: ignore[func-returns-value]  # the fake records the names, then returns no outcomes
        odd_lease = steps.Lease(o.ids.holder, odd_batch.plan.token, time.time() + 600)
        assert steps.delete(o, odd_batch, odd_lease, None).outcomes == {"not_attempted": len(odd_batch.resources)}
        assert sent == [], at
        steps.release_lease(o)
    # An approval gone from the ledger (deleted by hand, a short retention) proves nothing stands: no batch sends.
    gone = approve_held(ledger, "manual__1")
    g = run(tmp_path, ledger, fleet, "manual__4")
    batch = plan_holding_the_lease(g, {"approval": gone}).batches[0]
    ledger.approvals.delete_one({"_id": gone})
    object.__setattr__(g.target, "delete", lambda resources, guard: sent.extend(r.name for r in resources) or [])  # type: ignore[func-returns-value]  # the fake records the names, then returns no outcomes
    lease = steps.Lease(g.ids.holder, batch.plan.token, time.time() + 600)
    assert steps.delete(g, batch, lease, None).outcomes == {"not_attempted": len(batch.resources)} and sent == []
    steps.release_lease(g)


def test_the_candidates_are_those_of_the_newest_execution_and_a_kubernetes_run_is_offered_whole(ledger) -> None:
    """Second review: the newest execution of the run is the truth, even where it recorded no candidate (a cleared
    run that deleted what an earlier execution left); a Kubernetes run whose Pod went further than unsent (sent and
    still terminating) offers none of its unsent Secrets: approving them without the Pod breaks "a run whole"."""
    from datetime import UTC, datetime

    from reaper.records import DeleteDecision, Outcome, ReportDecision

    def ids(execution: int, lease: str, target: str = "gce", scope: str = "p1") -> dict[str, Any]:
        return {"dag_id": DAG, "run_id": "manual__2", "execution": execution, "lease": lease, "target": target,
                "scope": scope}  # fmt: skip

    def planned(execution: int, lease: str, uid: str, group: str = "", target: str = "gce") -> DeleteDecision:
        return DeleteDecision(**ids(execution, lease, target), uid=uid, rule="stale", reason="heartbeat_stale",
                              name=f"r-{uid}", location="z", fingerprint=f"fp-{uid}", group=group,
                              evidence={"status": "RUNNING"})  # fmt: skip

    def outcome(execution: int, lease: str, uid: str, result: str, target: str = "gce") -> Outcome:
        return Outcome(**ids(execution, lease, target), uid=uid, name=f"r-{uid}", result=result, detail="why")

    ledger.write([planned(0, "A", "1"), planned(0, "A", "2")])
    ledger.write([outcome(0, "A", "1", "not_attempted"), outcome(0, "A", "2", "not_attempted")])
    assert {r["uid"] for r in ledger.held(DAG, "manual__2")} == {"1", "2"}
    ledger.write([planned(1, "B", "1")])  # cleared: execution 1 deleted vm 1, and kept vm 2 (keeps are not recorded)
    ledger.write([outcome(1, "B", "1", "deleted")])
    assert ledger.held(DAG, "manual__2") == []

    pod, secret = planned(2, "C", "pod", "run-7", "k8s"), planned(2, "C", "secret", "run-7", "k8s")
    alone = planned(2, "C", "other", "run-8", "k8s")
    held_too = ReportDecision(**{**msgspec.structs.asdict(planned(2, "C", "policy", "run-7", "k8s")),
                                 "reason": "budget_exceeded"})  # fmt: skip
    ledger.write([pod, secret, alone, held_too])
    ledger.write([outcome(2, "C", uid, "not_attempted", "k8s") for uid in ("secret", "other")])
    ledger.write([outcome(2, "C", "pod", "terminating", "k8s")])
    assert [r["uid"] for r in ledger.held(DAG, "manual__2")] == ["other"]
    # A newer execution skipped for the lease decided nothing, and hides nothing.
    ledger.sweeps.insert_one({**ids(3, "D"), "state": "skipped", "at": datetime.now(UTC)})
    assert [r["uid"] for r in ledger.held(DAG, "manual__2")] == ["other"]
    # A newer execution that recorded only its summary (it kept everything) holds no candidate; so does one under
    # a newer lease of the same execution number (a clear that kept it), whichever lease sorts first.
    ledger.sweeps.insert_one({**ids(2, "C"), "state": "success", "at": datetime.now(UTC)})
    assert [r["uid"] for r in ledger.held(DAG, "manual__2")] == ["other"]
    ledger.sweeps.insert_one({**ids(2, "Z-newer"), "state": "success", "at": datetime.now(UTC)})
    assert ledger.held(DAG, "manual__2") == []
