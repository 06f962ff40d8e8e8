"""The Kubernetes verification scenarios (docs/design.md §5) as DAG runs: the Kubernetes enforcement DAG under
``dag.test()`` against the emulator, real NATS leases, SecantusDB run stores and a real Postgres."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database

from include.emulators.http import start_secantusdb, wait_until
from include.emulators.k8s import RESOURCE_OF_KIND
from reaper.sweep.targets import K8sTarget
from tests.helpers.k8s import MANAGED, put_leases, seed_pod, seed_run

pytestmark = pytest.mark.slow(50)  # seconds, about: the heaviest modules start first (tests/conftest.py)

ENFORCEMENT = "reaper_k8s_enforcement"
STEP = {"iterion.io/step": "build", "iterion.io/attempt": "1"}


@pytest.fixture
def runs_db(mongo_server):
    """This test's own run-store database on the session's SecantusDB."""
    client: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
    name = f"iterion_{uuid.uuid4().hex[:10]}"
    yield client, name
    client.drop_database(name)


def _configure(sweeper, runs_db_name: str, **k8s: object) -> None:
    sweeper.configure(
        {
            "gce": {"enabled": False},
            "k8s": {"clusters": ["kube_e2e"], "mongo_run_store": {"database": runs_db_name}, **k8s},
            "budget": {"min_stale": 100},
        }
    )


def _ledger(mongo_server, run_id: str, action: str) -> dict[str, str | None]:
    db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]
    return {r["name"]: r.get("reason") or r.get("result") for r in db.ledger.find({"run_id": run_id, "action": action})}


def _runs_left(cluster) -> set[str]:
    return {obj["metadata"]["labels"].get("iterion.io/run-id") for obj in cluster.objects.values()}


def test_runner_dies_mid_run_then_its_whole_sandbox_is_reaped(
    kube, nats_server, mongo_server, runs_db, sweeper
) -> None:
    """The runner dies mid-run; its lease expires and the run is marked failed; the next
    sweep deletes the sandbox Pod, both Secrets and the NetworkPolicy. The live run is untouched."""
    cluster, _, emulator = kube
    client, db = runs_db
    seed_run(cluster, "dying")
    seed_run(cluster, "live")
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_leases(url, ["dying", "live"], ttl=2))
    client[db]["runs"].insert_many([{"_id": "dying", "status": "running"}, {"_id": "live", "status": "running"}])
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port)
    _configure(sweeper, db)

    first = sweeper.run(ENFORCEMENT)
    assert first.state == "success" and len(cluster.objects) == 8  # both runs hold their leases

    # "live" keeps renewing; "dying" stops (the runner died). Once its key expires, the run is marked failed.
    async def renew_until_dying_expires() -> None:
        import nats

        nc = await nats.connect(url)
        kv = await nc.jetstream().key_value("run_leases")
        for _ in range(100):
            await kv.put("live", b"runner")
            if "dying" not in await kv.keys():
                break
            await asyncio.sleep(0.2)
        await nc.close()

    asyncio.run(renew_until_dying_expires())
    client[db]["runs"].update_one({"_id": "dying"}, {"$set": {"status": "failed"}})
    run = sweeper.run(ENFORCEMENT)
    assert run.state == "success"
    assert _runs_left(cluster) == {"live"}
    deleted = _ledger(mongo_server, run.run_id, "outcome")
    assert deleted == {
        "Pod/ci/sandbox-dying": "deleted",
        "Secret/ci/sandbox-dying-egress-ca": "deleted",
        "Secret/ci/sandbox-dying-files": "deleted",
        "NetworkPolicy/ci/sandbox-dying": "deleted",
    }
    assert cluster.secret_data_served is False


def test_mongodb_outage_during_a_sweep_deletes_nothing_and_reports_the_keys_unknown(
    kube, nats_server, mongo_server, sweeper, monkeypatch
) -> None:
    """The run store goes down after the inventory was listed and before evidence is read."""
    cluster, _, emulator = kube
    store = start_secantusdb()
    port = store.port
    runs: Collection[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{port}/")["iterion"]["runs"]
    runs.insert_many([{"_id": "r1", "status": "failed"}, {"_id": "r2", "status": "succeeded"}])
    seed_run(cluster, "r1")
    seed_run(cluster, "r2")
    asyncio.run(put_leases(f"nats://127.0.0.1:{nats_server.port}", []))
    monkeypatch.setenv("AIRFLOW_CONN_MONGO_RUNS", json.dumps({"conn_type": "mongo", "host": "127.0.0.1", "port": port}))
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port)
    _configure(sweeper, "iterion", mongo_run_store={"conn_id": "mongo_runs", "timeout": "1s"})

    listed = K8sTarget.list

    def list_then_lose_mongodb(self, scopes, stop=None):
        listing = listed(self, scopes, stop)
        store.stop()
        return listing

    monkeypatch.setattr(K8sTarget, "list", list_then_lose_mongodb)
    run = sweeper.run(ENFORCEMENT)
    assert run.state == "success"
    assert len(cluster.objects) == 8 and not cluster.deletes
    assert _ledger(mongo_server, run.run_id, "outcome") == {}
    ledger: Collection[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"].ledger
    reasons = [r["reason"] for r in ledger.find({"run_id": run.run_id, "action": "report"})]
    assert reasons == ["store_unknown"] * 8  # every object of both runs: unknown, reported, kept


def test_runner_pod_deleted_cascades_and_the_next_sweep_has_nothing_to_do(
    kube, nats_server, mongo_server, runs_db, sweeper
) -> None:
    """Deleting the runner pod removes its sandbox through ownerReferences (the garbage
    collector); the reaper's next sweep finds nothing of that run."""
    from kubernetes import client as k8s

    cluster, api, emulator = kube
    _, db = runs_db
    runner = cluster.create("pods", "ci", {"metadata": {"name": "runner-0"}, "spec": {"containers": []}})
    for obj in seed_run(cluster, "r1"):
        meta = obj["metadata"]
        cluster.adopt((RESOURCE_OF_KIND[obj["kind"]], meta["namespace"], meta["name"]), runner["metadata"]["uid"])
    asyncio.run(put_leases(f"nats://127.0.0.1:{nats_server.port}", []))
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port)
    _configure(sweeper, db)

    k8s.CoreV1Api(api).delete_namespaced_pod(
        "runner-0", "ci", body=k8s.V1DeleteOptions(propagation_policy="Background"), _request_timeout=10
    )
    wait_until(lambda: not cluster.objects, "the ownerReference cascade", 10)
    run = sweeper.run(ENFORCEMENT)
    assert run.state == "success"
    db_reaper: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]
    summary = db_reaper.sweeps.find_one({"run_id": run.run_id})
    assert summary["census"]["k8s"]["kube_e2e"]["objects"] == 0
    assert summary["deletes"] == 0 and summary["outcomes"] == {}
    assert db_reaper.ledger.count_documents({"run_id": run.run_id}) == 0


def test_step_pods_survive_until_results_are_durable_then_are_reaped(
    kube, nats_server, mongo_server, runs_db, sweeper, postgres
) -> None:
    """A step pod whose egress sidecar still runs, or whose results row is not yet durable,
    survives sweeps; once the sidecar is done and the row is written, the next sweep reaps it."""
    cluster, _, emulator = kube
    client, db = runs_db
    uploading = {**MANAGED, "iterion.io/run-id": "uploading", **STEP}
    pending = {**MANAGED, "iterion.io/run-id": "pending", **STEP}
    seed_pod(cluster, "step-uploading", uploading, sidecar="results-egress", sidecar_terminated=False)
    seed_pod(cluster, "step-pending", pending)
    client[db]["runs"].insert_many(
        [{"_id": "uploading", "status": "succeeded"}, {"_id": "pending", "status": "succeeded"}]
    )
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        conn.execute(
            "INSERT INTO step_runs VALUES ('uploading','build',1,'succeeded','{\"ok\":true}'),"
            " ('pending','build',1,'succeeded',NULL)"
        )
    asyncio.run(put_leases(f"nats://127.0.0.1:{nats_server.port}", []))
    sweeper.connect_k8s(emulator.kubeconfig(), nats_server.port, postgres)
    _configure(sweeper, db, step_store="postgres")

    for _ in range(2):  # sweep after sweep: both kept, with the reason in the ledger
        run = sweeper.run(ENFORCEMENT)
        assert run.state == "success" and cluster.names("pods") == {"step-uploading", "step-pending"}
        assert _ledger(mongo_server, run.run_id, "report") == {
            "step-uploading": "results_egress_in_progress",
            "step-pending": "results_not_durable",
        }

    pod = cluster.objects[("pods", "ci", "step-uploading")]
    pod["status"]["containerStatuses"][1]["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    run = sweeper.run(ENFORCEMENT)
    assert cluster.names("pods") == {"step-pending"}  # the sidecar finished; its row was durable already
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("UPDATE step_runs SET results = '{\"ok\":true}' WHERE run_id = 'pending'")
    run = sweeper.run(ENFORCEMENT)
    assert run.state == "success" and cluster.names("pods") == set()
    assert _ledger(mongo_server, run.run_id, "outcome") == {"Pod/ci/step-pending": "deleted"}
