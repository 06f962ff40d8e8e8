"""The Kubernetes DAGs end to end with dag.test(): emulator, real NATS leases, SecantusDB run store and ledger."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pymongo import MongoClient

from tests.helpers.k8s import put_leases, seed_run


def test_k8s_enforcement_reaps_dead_runs_only(kube, nats_server, mongo_server, sweeper) -> None:
    cluster, _, emulator = kube
    seed_run(cluster, "live")
    seed_run(cluster, "dead")
    seed_run(cluster, "running-no-lease")
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_leases(url, ["live"]))
    client: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
    client["iterion_e2e"]["runs"].insert_many(
        [
            {"_id": "live", "status": "running"},
            {"_id": "dead", "status": "failed"},
            {"_id": "running-no-lease", "status": "running"},
        ]
    )
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port)
    sweeper.configure(
        {"gce": {"enabled": False}, "k8s": {"clusters": ["kube_e2e"], "mongo_run_store": {"database": "iterion_e2e"}}}
    )

    db = client["reaper"]
    telemetry = sweeper.run("reaper_k8s_telemetry")
    assert telemetry.state == "success" and len(cluster.objects) == 12
    assert db.ledger.count_documents({"run_id": telemetry.run_id}) == 0  # everything kept: nothing to record
    assert db.sweeps.find_one({"run_id": telemetry.run_id})["census"]["k8s"]["kube_e2e"]["runs"] == 3
    report = sweeper.run("reaper_k8s_report_only")
    assert report.state == "success" and len(cluster.objects) == 12
    reported = {r["name"] for r in db.ledger.find({"run_id": report.run_id, "reason": "sandbox_orphan"})}
    assert reported == {"sandbox-dead", "sandbox-dead-egress-ca", "sandbox-dead-files"}
    run = sweeper.run("reaper_k8s_enforcement")
    assert run.state == "success"
    left = {obj["metadata"]["labels"]["iterion.io/run-id"] for obj in cluster.objects.values()}
    assert left == {"live", "running-no-lease"} and len(cluster.objects) == 8
    assert cluster.secret_data_served is False
    outcomes = [r for r in db.ledger.find({"run_id": run.run_id, "action": "outcome"})]
    assert sorted(r["name"].split("/")[0] for r in outcomes) == ["NetworkPolicy", "Pod", "Secret", "Secret"]
    reports = {r["name"]: r["reason"] for r in db.ledger.find({"run_id": run.run_id, "action": "report"})}
    assert set(reports.values()) == {"lease_absent_run_active"}
    summary = db.sweeps.find_one({"run_id": run.run_id})
    assert summary["outcomes"] == {"deleted": 4}
    assert summary["hygiene"] == {"no_owner_reference": 12}  # the seeded runs carry no ownerReferences
    assert "credentials" not in json.dumps(list(db.ledger.find({}, {"_id": 0, "at": 0})), default=str)


def one_dead_run(kube, nats_server, mongo_server, sweeper, database: str):
    """One run in the cluster, dead (no lease, failed in the run store ``database``); the DAG connected to it."""
    cluster, _, emulator = kube
    seed_run(cluster, "dead")
    asyncio.run(put_leases(f"nats://127.0.0.1:{nats_server.port}", []))
    client: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
    client[database]["runs"].insert_one({"_id": "dead", "status": "failed"})
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port)
    return cluster, client


def test_an_execution_whose_delete_task_is_stopped_still_writes_its_summary(
    kube, nats_server, mongo_server, sweeper, monkeypatch
) -> None:
    # Review finding: ``record`` ran only when no upstream failed, so a halted delete task left its
    # deletions in the ledger and no sweep summary (docs/design.md §7: summaries are kept per execution).
    import reaper.sweep.steps as steps
    from reaper.sweep.deletes import SweepHalted, delete_batch

    _, client = one_dead_run(kube, nats_server, mongo_server, sweeper, "iterion_halted")
    sweeper.configure(
        {
            "gce": {"enabled": False},
            "k8s": {"clusters": ["kube_e2e"], "mongo_run_store": {"database": "iterion_halted"}},
        }
    )
    real = delete_batch  # what reaper.sweep.steps calls

    def halted(*args, **kwargs):
        counts = real(*args, **kwargs)
        raise SweepHalted(f"SIGTERM: the task is being stopped; recorded so far: {counts}")

    monkeypatch.setattr(steps, "delete_batch", halted)
    run = sweeper.run("reaper_k8s_enforcement")
    assert run.state == "failed"  # the failure still pages
    db = client["reaper"]
    assert db.ledger.count_documents({"run_id": run.run_id, "action": "outcome", "result": "deleted"}) == 4
    summary = db.sweeps.find_one({"run_id": run.run_id})
    assert summary["state"] == "failed" and summary["outcomes"] == {"deleted": 4}


def test_an_opt_out_added_while_the_dag_deletes_keeps_the_whole_run(kube, nats_server, mongo_server, sweeper) -> None:
    # The race harness once through the real DAG: the dead run's NetworkPolicy is opted out after the
    # plan, while its Pod waits for its delete (the emulator's hook on the Pod's re-read).
    cluster, client = one_dead_run(kube, nats_server, mongo_server, sweeper, "iterion_optout")
    k8s = {"clusters": ["kube_e2e"], "mongo_run_store": {"database": "iterion_optout"}}
    sweeper.configure({"gce": {"enabled": False}, "k8s": k8s})

    def opt_out(args: tuple[str, ...]) -> None:
        if args[1] == "pods":
            with cluster.lock:
                meta = cluster.objects[("networkpolicies", "ci", "sandbox-dead")]["metadata"]
                meta["labels"] = {**meta["labels"], "reaper.io/keep": "true"}
                meta["resourceVersion"] = cluster._version()

    cluster.on("before", "list_named", opt_out)
    run = sweeper.run("reaper_k8s_enforcement")
    assert run.state == "success" and len(cluster.objects) == 4 and cluster.deletes == []
    results = {r["result"] for r in client["reaper"].ledger.find({"run_id": run.run_id, "action": "outcome"})}
    assert results == {"changed_since_plan"}
