"""The GCE DAGs end to end with dag.test(): emulator, SecantusDB ledger, real Prometheus writer health."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from tests.helpers.gce import add_instance, healthy_writers

pytestmark = pytest.mark.slow(95)  # seconds, about: the heaviest modules start first (tests/conftest.py)

PROJECTS = ["p1", "p2"]
P1_ORPHANS = {"p1-terminated", "p1-stale", "p1-unlabeled-old"}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    """Healthy heartbeat writers for every project, scraped by a real Prometheus."""
    with healthy_writers(PROJECTS, tmp_path_factory.mktemp("prom")) as url:
        yield url


@pytest.fixture
def fleet(gce, sweeper, prometheus):
    fleet, clients = gce
    for i in range(3):
        add_instance(fleet, "p1", "us-east1-b", f"p1-fresh-{i}")
    add_instance(fleet, "p1", "us-east1-b", "p1-stale", heartbeat_age=86400)
    add_instance(fleet, "p1", "us-east1-c", "p1-terminated", status="TERMINATED")
    add_instance(fleet, "p1", "us-east1-c", "p1-unlabeled-old", heartbeat_age=None, created_age=4 * 86400)
    for i in range(3):
        add_instance(fleet, "p2", "us-east1-b", f"p2-stale-{i}", heartbeat_age=86400)  # most of p2: budget trips
    add_instance(fleet, "p2", "us-east1-b", "p2-fresh")
    endpoint = clients.instances._transport._host
    sweeper.connect_gce(endpoint)
    sweeper.configure(
        {"gce": {"projects": PROJECTS, "writer_health": {"prometheus_url": prometheus}}, "k8s": {"enabled": False}}
    )
    return fleet


def ledger(mongo_server) -> Database[dict[str, Any]]:
    return MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]


def everything(fleet) -> set[str]:
    return fleet.names("p1") | fleet.names("p2")


ALL = {"p1-fresh-0", "p1-fresh-1", "p1-fresh-2", "p2-fresh", *P1_ORPHANS, *(f"p2-stale-{i}" for i in range(3))}


@pytest.mark.parametrize(
    ("dag_id", "deleted"),
    [
        ("reaper_gce_telemetry", set()),
        ("reaper_gce_terminated_cleanup", {"p1-terminated"}),
        ("reaper_gce_report_only", {"p1-terminated"}),
        ("reaper_gce_enforcement", P1_ORPHANS),
    ],
)
def test_each_phase_deletes_exactly_its_presets(
    fleet, sweeper, prometheus, mongo_server, dag_id: str, deleted: set[str]
) -> None:
    phase = dag_id.removeprefix("reaper_gce_").replace("_", "-")
    sweeper.configure(  # the phase swept is the active one
        {
            "gce": {"projects": PROJECTS, "writer_health": {"prometheus_url": prometheus}},
            "k8s": {"enabled": False},
            "rollout": {"gce": phase},
        }
    )
    run = sweeper.run(dag_id)
    assert run.state == "success"
    assert everything(fleet) == ALL - deleted
    db = ledger(mongo_server)
    outcomes = {r["name"]: r["result"] for r in db.ledger.find({"run_id": run.run_id, "action": "outcome"})}
    assert outcomes == dict.fromkeys(deleted, "deleted")
    summary = db.sweeps.find_one({"run_id": run.run_id})
    assert summary["branch"] == ("delete" if deleted else "report_only")
    assert summary["phase"] == phase
    reports = {r["name"]: r["reason"] for r in db.ledger.find({"run_id": run.run_id, "action": "report"})}
    if dag_id.endswith("report_only"):
        assert reports["p1-stale"] == "heartbeat_stale" and reports["p1-unlabeled-old"] == "unlabeled_age"
    if dag_id.endswith("enforcement"):
        assert {reports[f"p2-stale-{i}"] for i in range(3)} == {"budget_exceeded"}
        p2 = next(s for s in summary["scopes"] if s["scope"] == "p2")
        assert p2["holds"] == ["budget_exceeded"]
    if dag_id.endswith("telemetry"):
        assert reports == {} and summary["census"]["gce"]["p1"]["instances"] == 6


def test_global_cap_sends_the_whole_sweep_to_report(fleet, sweeper, mongo_server) -> None:
    sweeper.configure(
        {
            "gce": {"projects": PROJECTS, "writer_health": {"source": "none"}},
            "k8s": {"enabled": False},
            "max_deletions_per_sweep": 1,
        }
    )
    run = sweeper.run("reaper_gce_enforcement")
    assert run.state == "success" and everything(fleet) == ALL
    summary = ledger(mongo_server).sweeps.find_one({"run_id": run.run_id})
    assert summary["branch"] == "report_only" and "max_deletions_per_sweep" in summary["why"]


def test_dry_run_deletes_nothing_but_records_the_decisions(fleet, sweeper, mongo_server) -> None:
    run = sweeper.run("reaper_gce_enforcement", dry_run=True)
    assert run.state == "success" and everything(fleet) == ALL
    db = ledger(mongo_server)
    assert db.sweeps.find_one({"run_id": run.run_id})["why"] == "dry_run: nothing is deleted"
    assert {r["name"] for r in db.ledger.find({"run_id": run.run_id, "action": "delete"})} == P1_ORPHANS
    assert db.ledger.count_documents({"run_id": run.run_id, "action": {"$in": ["delete_intent", "outcome"]}}) == 0


def test_budget_override_needs_a_reason_lifts_only_the_scopes_it_names_and_is_recorded(
    fleet, sweeper, mongo_server
) -> None:
    refused = sweeper.run("reaper_gce_enforcement", override_budget=True, override_reason="  ", override_scopes=["p2"])
    assert refused.state == "failed" and everything(fleet) == ALL
    # p1's budget trips too (5 stale of 9 labeled), in this sweep for the first time: the operator reviewed p2 only.
    p1_stale = {f"p1-new-stale-{i}" for i in range(4)}
    for name in p1_stale:
        add_instance(fleet, "p1", "us-east1-b", name, heartbeat_age=86400)
    run = sweeper.run(
        "reaper_gce_enforcement", override_budget=True, override_reason="writer fixed, INC-42", override_scopes=["p2"]
    )
    assert run.state == "success"
    # p1's heartbeat_stale VMs stay held; its terminated and unlabeled ones, which no budget holds, go.
    gone = {"p1-terminated", "p1-unlabeled-old", *(f"p2-stale-{i}" for i in range(3))}
    assert everything(fleet) == (ALL | p1_stale) - gone
    db = ledger(mongo_server)
    summary = db.sweeps.find_one({"run_id": run.run_id})
    assert summary["override"] | {"user": "?"} == {
        "reason": "writer fixed, INC-42",
        "user": "?",
        "budget": True,
        "scopes": ["p2"],
        "applied": True,
    }
    assert summary["override"]["user"]
    verdicts = {s["scope"]: s for s in summary["scopes"]}
    assert verdicts["p2"]["overridden"] == ["budget_exceeded"] and verdicts["p2"]["holds"] == []
    assert verdicts["p1"]["holds"] == ["budget_exceeded"] and verdicts["p1"]["overridden"] == []
    reports = {r["name"]: r for r in db.ledger.find({"run_id": run.run_id, "action": "report"})}
    assert {reports[n]["reason"] for n in p1_stale | {"p1-stale"}} == {"budget_exceeded"}
    assert all("override" not in reports[n] for n in p1_stale)  # not made under the override
    deletes = {r["name"]: r for r in db.ledger.find({"run_id": run.run_id, "action": "delete"})}
    assert {deletes[f"p2-stale-{i}"]["override"]["scopes"][0] for i in range(3)} == {"p2"}


def test_scopes_param_restricts_the_sweep(fleet, sweeper) -> None:
    assert sweeper.run("reaper_gce_enforcement", scopes=["p2"]).state == "success"
    assert everything(fleet) == ALL  # p2 only, and its budget holds
    assert sweeper.run("reaper_gce_enforcement", scopes=["nope"]).state == "failed"


def test_a_target_never_sweeps_twice_at_once(fleet, sweeper, mongo_server) -> None:
    import time

    sweeper.configure(
        {
            "gce": {"projects": PROJECTS, "writer_health": {"source": "none"}},
            "k8s": {"enabled": False},
            "airflow": {"lease_wait": "1s"},
        }
    )
    locks = ledger(mongo_server).sweep_locks
    locks.replace_one(
        {"_id": "gce"},
        {"_id": "gce", "holder": "reaper_gce_report_only/other", "expires_at": time.time() + 600},
        upsert=True,
    )
    skipped = sweeper.run("reaper_gce_enforcement")
    assert skipped.state == "success"  # waited, then skipped: no failure that pages (docs/design.md §8)
    assert everything(fleet) == ALL
    summary = ledger(mongo_server).sweeps.find_one({"run_id": skipped.run_id})
    assert summary["state"] == "skipped" and "reaper_gce_report_only/other" in summary["why"]
    assert locks.find_one({"_id": "gce"})["holder"] == "reaper_gce_report_only/other"  # not ours to release
    locks.delete_one({"_id": "gce"})
    run = sweeper.run("reaper_gce_enforcement")
    assert run.state == "success" and locks.count_documents({}) == 0  # released at the end


def test_a_failed_sweep_releases_its_lease(fleet, sweeper, mongo_server) -> None:
    from reaper.sweep.targets import GceTarget

    def broken(self, resources):
        raise RuntimeError("the delete step broke")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GceTarget, "delete", broken)
        failed = sweeper.run("reaper_gce_enforcement")
    assert failed.state == "failed"  # the teardown's success does not hide the failure
    assert ledger(mongo_server).sweep_locks.count_documents({}) == 0  # but the lease is free at once
    assert sweeper.run("reaper_gce_enforcement").state == "success"


def test_the_active_phases_sweeps_push_metrics_and_what_ifs_do_not(fleet, sweeper, prometheus, pushgateway) -> None:
    import requests

    def pushed() -> str:
        return requests.get(f"{pushgateway.url}/metrics", timeout=5).text

    try:
        sweeper.configure(
            {
                "gce": {"projects": PROJECTS, "writer_health": {"prometheus_url": prometheus}},
                "k8s": {"enabled": False},
                "metrics": {"pushgateway_url": pushgateway.url},
                "rollout": {"gce": "enforcement"},
            }
        )
        # A what-if of another phase, and a dry run of the active one, leave the alerts' series alone.
        assert sweeper.run("reaper_gce_report_only").state == "success"
        assert sweeper.run("reaper_gce_enforcement", dry_run=True).state == "success"
        assert "reaper_" not in pushed()
        assert sweeper.run("reaper_gce_enforcement").state == "success"
        text = pushed()
        assert 'reaper_last_success_timestamp_seconds{instance="",job="reaper",scope="_all",target="gce"}' in text
        p2 = 'blocks_deletes="true",hold="budget_exceeded",instance="",job="reaper",scope="p2",target="gce"'
        assert f"reaper_scope_hold{{{p2}}} 1" in text
        assert "dag_id=" not in text  # grouped by target: moving the rollout replaces these series
    finally:
        pushgateway.stop()
    # The gateway is gone: the sweep still succeeds (metrics are observability, not data).
    assert sweeper.run("reaper_gce_enforcement", dry_run=True).state == "success"


def test_a_later_phase_run_by_hand_deletes_only_when_its_trigger_confirms_the_phase(
    fleet, sweeper, prometheus, pushgateway, mongo_server
) -> None:
    """With the rollout at report-only, a plain ``airflow dags test reaper_gce_enforcement`` deleted
    for real and pushed no metrics. Now it is a dry run; confirmed, it deletes and its metrics reach the alerts."""
    import requests

    sweeper.configure(
        {
            "gce": {"projects": PROJECTS, "writer_health": {"prometheus_url": prometheus}},
            "k8s": {"enabled": False},
            "metrics": {"pushgateway_url": pushgateway.url},
            "rollout": {"gce": "report-only"},
        }
    )
    plain = sweeper.run("reaper_gce_enforcement")
    assert plain.state == "success" and everything(fleet) == ALL
    db = ledger(mongo_server)
    summary = db.sweeps.find_one({"run_id": plain.run_id})
    assert summary["branch"] == "report_only" and summary["dry_run"] is True
    assert summary["phase_gate"]["confirmed"] is False and "confirm_phase" in summary["why"]
    assert "reaper_" not in requests.get(f"{pushgateway.url}/metrics", timeout=5).text

    reason = "INC-7: enforce p1 ahead of the rollout"
    confirmed = sweeper.run("reaper_gce_enforcement", confirm_phase="enforcement", override_reason=reason)
    assert confirmed.state == "success" and everything(fleet) == ALL - P1_ORPHANS
    gate = db.sweeps.find_one({"run_id": confirmed.run_id})["phase_gate"]
    assert gate["confirmed"] is True and gate["reason"] == reason and gate["active"] == "report-only"
    pushed = requests.get(f"{pushgateway.url}/metrics", timeout=5).text
    deleted = 'reaper_last_sweep_deletions{instance="",job="reaper",outcome="deleted",scope="_all",target="gce"} 3'
    assert deleted in pushed


def test_clearing_a_run_never_replays_its_override_and_keeps_each_executions_summary(
    fleet, sweeper, mongo_server
) -> None:
    # Alice's override lifted p2's hold; later p1's budget trips; Bob clears Alice's run.
    from datetime import UTC, datetime

    when = datetime.now(UTC)
    # Alice names p1 as well: p1 holds nothing yet, so nothing is lifted there; the override is not replayed.
    alices = {"override_budget": True, "override_reason": "INC-42: writer fixed", "override_scopes": ["p1", "p2"]}
    first = sweeper.run("reaper_gce_enforcement", when, **alices)
    assert first.state == "success"
    assert everything(fleet) == ALL - P1_ORPHANS - {f"p2-stale-{i}" for i in range(3)}
    for i in range(6):  # most of p1 goes stale at once: the writer is broken again
        add_instance(fleet, "p1", "us-east1-b", f"p1-new-stale-{i}", heartbeat_age=86400)
    # The same run again, with its conf (a cleared run keeps it): its next execution.
    again = sweeper.run("reaper_gce_enforcement", when, **alices)
    assert again.run_id == first.run_id and again.state == "success"
    assert {f"p1-new-stale-{i}" for i in range(6)} <= everything(fleet), "the old override lifted a new hold"
    db = ledger(mongo_server)
    summaries = list(db.sweeps.find({"run_id": first.run_id}).sort("at"))
    # dag.test() clears the run's tasks without resetting the run: the clear_number stays, the lease does not.
    assert len(summaries) == 2 and summaries[0]["lease"] != summaries[1]["lease"]  # the first summary is kept
    assert summaries[0]["override"]["applied"] is True and summaries[0]["outcomes"] == {"deleted": 6}
    assert summaries[1]["override"]["applied"] is False and "cleared" in summaries[1]["override"]["why"]
    p1 = next(s for s in summaries[1]["scopes"] if s["scope"] == "p1")
    assert p1["holds"] == ["budget_exceeded"] and p1["overridden"] == []
    second = {"run_id": first.run_id, "lease": summaries[1]["lease"], "action": "delete_intent"}
    assert db.ledger.count_documents(second) == 0


def test_a_scope_named_twice_is_swept_once(fleet, sweeper, mongo_server) -> None:
    # ["p1", "p1", "p1"] listed p1 three times and recorded its delete three times.
    run = sweeper.run("reaper_gce_enforcement", scopes=["p1", "p1", "p1"])
    assert run.state == "success" and everything(fleet) == ALL - P1_ORPHANS
    db = ledger(mongo_server)
    assert db.sweeps.find_one({"run_id": run.run_id})["census"]["gce"]["p1"]["instances"] == 6
    outcomes = list(db.ledger.find({"run_id": run.run_id, "action": "outcome"}))
    assert sorted(o["result"] for o in outcomes) == ["deleted"] * 3


def test_a_vm_recreated_while_the_dag_deletes_is_never_the_one_deleted(fleet, sweeper, mongo_server) -> None:
    # The race harness once through the real DAG: the stale VM's name is taken by a new, live VM while
    # the delete task waits for its rate-limit token (the emulator's hook on the re-read).
    stale = fleet.instance("p1", "us-east1-b", "p1-stale")

    def recreate(args: tuple[str, ...]) -> None:
        if args[2] == stale["id"]:
            with fleet.lock:
                fleet.projects["p1"]["us-east1-b"].pop("p1-stale")
            add_instance(fleet, "p1", "us-east1-b", "p1-stale", heartbeat_age=5, instance_id=987654321)

    fleet.on("before", "get", recreate, times=None)
    run = sweeper.run("reaper_gce_enforcement")
    assert run.state == "success"
    assert fleet.instance("p1", "us-east1-b", "p1-stale")["id"] == "987654321"  # the live one stands
    assert "987654321" not in fleet.deleted_ids
    outcome = ledger(mongo_server).ledger.find_one({"run_id": run.run_id, "action": "outcome", "name": "p1-stale"})
    assert outcome["result"] == "already_gone"
    assert everything(fleet) == ALL - (P1_ORPHANS - {"p1-stale"})
