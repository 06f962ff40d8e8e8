"""docs/design.md §5 end to end: emulated cluster, real NATS, real MongoDB protocol, real Postgres."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import psycopg
from pymongo import MongoClient

from include.emulators.http import start_secantusdb
from reaper.config import Settings, parse_settings
from tests.helpers.k8s import MANAGED, put_leases, seed_pod, seed_run, sweep

STEP = {"iterion.io/step": "build", "iterion.io/attempt": "1"}


def runs_by_reason(plan) -> dict[str, str]:
    return {d.evidence["run"]: d.reason for d in plan.decisions if d.evidence and "run" in d.evidence}


def _config(mongo_db: str, step_store: bool, **run_store: str) -> Settings:
    return parse_settings(
        {
            "k8s": {
                "step_store": "postgres" if step_store else "none",
                "mongo_run_store": {"database": mongo_db, **run_store},
                "nats_leases": {"timeout": "1s"},  # an unreachable NATS is unknown after it, not after the default
                "delete_rate_per_cluster": 1000.0,
            },
            "budget": {"min_stale": 100},
        },
        "test",
    )


def test_every_row_end_to_end(kube, nats_server, mongo, postgres) -> None:
    cluster, api, _ = kube
    client, db = mongo
    url = f"nats://127.0.0.1:{nats_server.port}"
    seed_run(cluster, "held")
    seed_run(cluster, "young", age=60)
    seed_run(cluster, "active")
    seed_run(cluster, "terminal")
    seed_run(cluster, "gone")
    seed_run(cluster, "egress", sidecar="results-egress", sidecar_terminated=False)
    seed_pod(cluster, "step-pending", {**MANAGED, "iterion.io/run-id": "stepped", **STEP})
    seed_pod(cluster, "step-done", {**MANAGED, "iterion.io/run-id": "durable", **STEP})
    asyncio.run(put_leases(url, ["held"]))
    client[db]["runs"].insert_many(
        [
            {"_id": "held", "status": "running"},
            {"_id": "young", "status": "running"},
            {"_id": "active", "status": "running"},
            {"_id": "terminal", "status": "failed"},
            {"_id": "egress", "status": "succeeded"},
            {"_id": "stepped", "status": "succeeded"},
            {"_id": "durable", "status": "succeeded"},
        ]
    )
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        conn.execute(
            "INSERT INTO step_runs VALUES ('stepped','build',1,'succeeded',NULL),"
            " ('durable','build',1,'succeeded','{\"ok\":true}')"
        )

    plan, outcomes = sweep(api, _config(db, True), url, client, postgres)
    assert runs_by_reason(plan) == {
        "held": "lease_held",
        "young": "min_age",
        "active": "lease_absent_run_active",
        "terminal": "sandbox_orphan",
        "gone": "sandbox_orphan",
        "egress": "results_egress_in_progress",
        "stepped": "results_not_durable",
        "durable": "sandbox_orphan",
    }
    assert {o.result for o in outcomes} == {"deleted"} and len(outcomes) == 4 + 4 + 1
    survivors = {obj["metadata"]["labels"]["iterion.io/run-id"] for obj in cluster.objects.values()}
    assert survivors == {"held", "young", "active", "egress", "stepped"}
    assert cluster.secret_data_served is False

    # The step's results become durable: the next sweep reaps it.
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("UPDATE step_runs SET results = '{\"ok\":true}' WHERE run_id = 'stepped'")
    plan, outcomes = sweep(api, _config(db, True), url, client, postgres)
    assert [o.name for o in outcomes] == ["step-pending"]


def test_mongo_outage_mid_sweep_reaps_nothing(kube, nats_server, tmp_path) -> None:
    cluster, api, _ = kube
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_leases(url, []))
    daemon = start_secantusdb()
    port = daemon.port
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, socketTimeoutMS=1000
    )
    client["iterion"]["runs"].insert_many([{"_id": "r1", "status": "failed"}, {"_id": "r2", "status": "failed"}])
    seed_run(cluster, "r1")
    seed_run(cluster, "r2")
    daemon.stop()  # MongoDB goes down after the runs ended, before the sweep reads them
    plan, outcomes = sweep(api, _config("iterion", False), url, client, None)
    assert outcomes == [] and len(cluster.objects) == 8
    assert set(runs_by_reason(plan).values()) == {"store_unknown"}


def test_nats_unreachable_reaps_nothing(kube, nats_server, mongo) -> None:
    cluster, api, _ = kube
    client, db = mongo
    seed_run(cluster, "r1")
    nats_server.stop()
    plan, outcomes = sweep(api, _config(db, False), f"nats://127.0.0.1:{nats_server.port}", client, None)
    assert outcomes == [] and runs_by_reason(plan) == {"r1": "lease_unknown"}


def test_a_typo_in_the_run_stores_database_reaps_nothing(kube, nats_server, mongo) -> None:
    # The runs ended or are running in the real store; the config names a database that does not exist.
    cluster, api, _ = kube
    client, db = mongo
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_leases(url, []))
    client[db]["runs"].insert_many([{"_id": "running", "status": "running"}, {"_id": "ended", "status": "failed"}])
    seed_run(cluster, "running")
    seed_run(cluster, "ended")
    plan, outcomes = sweep(api, _config(db + "x", False), url, client, None)
    assert outcomes == [] and len(cluster.objects) == 8
    assert runs_by_reason(plan) == {"running": "store_unknown", "ended": "store_unknown"}  # were sandbox_orphan
    (why,) = cast(list[str], plan.scopes[0].details["unknown_evidence"])
    assert why.startswith(f"k8s.mongo_run_store: database '{db}x' has no collection 'runs'")

    plan, outcomes = sweep(api, _config(db, False), url, client, None)  # the right store still works
    assert runs_by_reason(plan) == {"running": "lease_absent_run_active", "ended": "sandbox_orphan"}
    assert [o.result for o in outcomes] == ["deleted"] * 4


def test_a_live_lease_missing_from_the_run_store_reaps_nothing_it_does_not_know(kube, nats_server, mongo) -> None:
    # The config names another collection of run records (an archive): it proves itself, but a run the
    # runners hold a lease for is not in it, so it is not the store they write to.
    cluster, api, _ = kube
    client, db = mongo
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_leases(url, ["live"]))
    client[db]["runs"].insert_many([{"_id": "live", "status": "running"}, {"_id": "new", "status": "running"}])
    client[db]["archive"].insert_one({"_id": "old", "status": "succeeded"})
    for run in ("live", "new", "old"):
        seed_run(cluster, run)
    archive = _config(db, False, collection="archive")
    plan, outcomes = sweep(api, archive, url, client, None)
    assert runs_by_reason(plan) == {"live": "lease_held", "new": "store_unknown", "old": "sandbox_orphan"}
    assert [o.result for o in outcomes] == ["deleted"] * 4  # only the run the store does hold a record of
    assert "1 run holds a live lease but no record in it (live)" in plan.scopes[0].details["unknown_evidence"][0]
