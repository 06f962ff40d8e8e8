"""An approval end to end through the GCE enforcement DAG (docs/design.md §6): a sweep held by its budget, an
operator's ``reaper approve`` of some of its held VMs, a heartbeat written to one of them after the review, and a
manual run with ``approval=<id>`` that deletes exactly the approved VMs still as they were reviewed, once.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from include.emulators.gce.manager import ManagerSimulator, manager_clients
from reaper import cli
from tests.builders import HB
from tests.helpers.gce import STARTED, add_instance, healthy_writers

PROJECT, ZONE = "p", "us-east1-b"
FRESH = {f"fresh-{i}" for i in range(3)}
STALE = [f"stale-{i}" for i in range(5)]  # five stale of eight: the budget (min 3, half) holds the project
APPROVED = STALE[:3]
BEAT = STALE[0]  # its manager comes back after the review
REASON = "INC-27: p's manager lost its store; stale VMs reviewed on the sweep page"


@pytest.fixture(scope="module")
def writers(tmp_path_factory) -> Iterator[str]:
    with healthy_writers([PROJECT], tmp_path_factory.mktemp("prom")) as url:
        yield url


def approve(run_id: str, *items: str) -> tuple[int, str, str]:
    """``reaper approve`` as an operator types it (the config and ledger connection the sweeper set): its exit
    code, stdout (the id) and stderr."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["approve", "--dag", "reaper_gce_enforcement", "--run", run_id, "--reason", REASON, "--user", "alice"]
    for item in items:
        argv += ["--item", item]
    with contextlib.redirect_stderr(err):
        code = cli.main(argv, out)
    return code, out.getvalue().strip(), err.getvalue()


def test_an_approval_deletes_exactly_the_approved_vms_still_as_reviewed_and_only_once(
    gce, sweeper, mongo_server, writers, capsys, caplog
) -> None:
    fleet, clients = gce
    for name in FRESH:
        add_instance(fleet, PROJECT, ZONE, name)
    for name in STALE:
        add_instance(fleet, PROJECT, ZONE, name, heartbeat_age=86400)
    sweeper.connect_gce(clients.instances._transport._host)
    sweeper.configure(
        {
            "gce": {"projects": [PROJECT], "writer_health": {"prometheus_url": writers}},
            "k8s": {"enabled": False},
            "rollout": {"gce": "enforcement"},
        }
    )
    db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]
    everything = FRESH | set(STALE)

    # The sweep: the project held on its budget, nothing deleted, each stale VM a held candidate with its state.
    held = sweeper.run("reaper_gce_enforcement")
    assert held.state == "success" and fleet.names(PROJECT) == everything
    scopes = {s["scope"]: s["holds"] for s in db.sweeps.find_one({"run_id": held.run_id})["scopes"]}
    assert scopes == {PROJECT: ["budget_exceeded"]}

    # Refused before anything is recorded: a name the sweep did not hold.
    code, printed, said = approve(held.run_id, "fresh-0")
    assert (code, printed) == (2, "") and "not a held candidate of this sweep" in said
    assert db.approvals.count_documents({}) == 0

    code, approval_id, said = approve(held.run_id, *APPROVED)
    assert code == 0 and approval_id.startswith("apr-") and f"approval={approval_id}" in said
    stored = db.approvals.find_one({"_id": approval_id})
    assert {i["name"] for i in stored["items"]} == set(APPROVED) and stored["used_by"] is None
    reviewed = {i["name"]: i["fingerprint"] for i in stored["items"]}
    assert reviewed[BEAT] == fleet.instance(PROJECT, ZONE, BEAT)["labelFingerprint"]

    # BEAT's manager comes back and stamps a heartbeat restored from its store, through setLabels: still stale
    # (the rules would delete it), so only its labelFingerprint tells it is not the VM that was reviewed.
    restored = ManagerSimulator("m-back", PROJECT, manager_clients(clients.host), [], clock=lambda: STARTED - 86000)
    assert restored.write(ZONE, BEAT)
    assert fleet.instance(PROJECT, ZONE, BEAT)["labelFingerprint"] != reviewed[BEAT]
    assert int(fleet.instance(PROJECT, ZONE, BEAT)["labels"][HB]) < STARTED - 3600
    add_instance(fleet, PROJECT, ZONE, "stale-new", heartbeat_age=86400)  # appeared since the review

    run = sweeper.run("reaper_gce_enforcement", approval=approval_id)
    assert run.state == "success"
    deleted = set(APPROVED) - {BEAT}
    assert fleet.names(PROJECT) == (everything | {"stale-new"}) - deleted
    summary = db.sweeps.find_one({"run_id": run.run_id})
    record = summary["approval"]
    assert {k: record[k] for k in ("id", "user", "reason", "from_run", "items", "max_deletions", "claimed")} == {
        "id": approval_id,
        "user": "alice",
        "reason": REASON,
        "from_run": held.run_id,
        "items": len(APPROVED),
        "max_deletions": len(APPROVED),
        "claimed": True,
    }
    assert {r["name"]: r["state"] for r in record["results"]} == {
        BEAT: "approval_changed",
        **dict.fromkeys(deleted, "deleted"),
    }
    assert summary["outcomes"] == {"deleted": len(deleted)} and summary["branch"] == "delete"
    reports = {r["name"]: r for r in db.ledger.find({"run_id": run.run_id, "action": "report"})}
    assert {n: reports[n]["reason"] for n in (BEAT, *STALE[3:], "stale-new")} == {
        BEAT: "approval_changed",
        **dict.fromkeys((*STALE[3:], "stale-new"), "not_approved"),
    }
    assert reports[BEAT]["evidence"]["approved_fingerprint"] == reviewed[BEAT]
    used = db.approvals.find_one({"_id": approval_id})["used_by"]
    assert (used["dag_id"], used["run_id"]) == ("reaper_gce_enforcement", run.run_id)

    # The same approval again: refused at its params, nothing deleted, the message naming the run that used it.
    capsys.readouterr()
    again = sweeper.run("reaper_gce_enforcement", approval=approval_id)
    # dag.test() runs the tasks here: their log reaches stdout, or pytest's log capture (as under xdist)
    logged = capsys.readouterr().out + caplog.text
    assert again.state == "failed"
    assert fleet.names(PROJECT) == (everything | {"stale-new"}) - deleted
    assert db.ledger.count_documents({"run_id": again.run_id, "action": {"$in": ["delete", "delete_intent"]}}) == 0
    refusal = f"params.approval: approval {approval_id!r} was used by reaper_gce_enforcement/{run.run_id} (execution 0)"
    assert f"task=resolve_scopes error={refusal}" in logged, "refused by the first task, naming the run that used it"
    assert db.approvals.find_one({"_id": approval_id})["used_by"] == used
